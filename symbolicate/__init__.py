"""Symbolication of JavaScript stack traces with uploaded source maps, in the order a stack travels:

1. ``stack``: ``error.stack`` text from V8, SpiderMonkey or JavaScriptCore -> ``ParsedStack``
   (engine, message, ``Frame``s innermost first; eval frames carry the calling script's
   location; lines, data: URLs and frame count capped; linear time, never raises)
2. ``boxtrail sourcemaps upload`` (the client's, ``boxtrail_client``) -> ``routes``
   (``/v1/projects/{p}/sourcemaps``)
   -> ``staging`` (the form read and stored in a worker) -> ``sourcemaps``: a build
   directory's JS files paired with their maps, debug ids read, maps validated against
   ECMA-426 (``mappings``: the mappings string, in numpy), warnings; the whole upload fails
   on one invalid map. ``sentry_cli``: the same from ``sentry-cli``, whose chunks and
   bundles ``chunks`` stores and puts together, and ``bundles`` reads
3. ``artifacts``: bytes content-addressed on the storage backend, indexed in the metadata
   database by project + release + URL and by debug id; list and delete by release
4. ``lookup``: a frame matched to an artifact (debug id, else release + URL, else URL in any
   release), caches (``lru``) of built lookups, resolutions and whole rewritten stacks; a
   ``problem`` per frame kept minified (a closed set, listed there; never an exception);
   ``built``: an artifact's ``symbolic`` lookups (``SourceMapCache``, ``SourceMapView``
   fallback) with context lines; ``sources``: the map's sourcesContent kept out of
   ``symbolic`` (whose lookups slow down with it) and split into lines once per source;
   ``scopes``: function names from the original source, named as V8 names them (``v8names``),
   and where a map's segment is coarse, picked by what the frame printed (``printed``)
5. ``rewrite``: ``FrameOut`` as the errors view returns it, and V8-style text of the rewritten stack

``side``: what these jobs read in a worker process (``core.workers``).
"""
