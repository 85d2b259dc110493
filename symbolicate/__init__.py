"""Symbolication of JavaScript stack traces with uploaded source maps (not built yet)."""
