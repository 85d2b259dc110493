"""Symbolication of JavaScript stack traces with uploaded source maps, in the order a stack travels:

1. ``stack``: ``error.stack`` text from V8, SpiderMonkey or JavaScriptCore -> ``ParsedStack``
   (engine, message, ``Frame``s innermost first; eval frames carry the calling script's
   location; lines, data: URLs and frame count capped; linear time, never raises)
2. artifact store, lookup, frame rewriting: not built yet
"""
