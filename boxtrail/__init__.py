"""boxtrail: the roof, where the stages are assembled into one server.

- ``app``: ``create_app(config)``: every service made and wired, the routes, the lifespan
- ``routes``: the operator's endpoints (liveness, readiness, metrics)
- ``server``: the HTTP front door (uvicorn, with refusals in the one error shape)
- ``cli``: the ``boxtrail`` command (``serve``, ``keys``, and the clients' commands)
- ``__main__``: ``python -m boxtrail``

Below it, the stages, each its own package: ``ingest`` (events in, durable, searchable,
written to Parquet), ``query`` (read back: search, errors, tails, MCP), ``symbolicate``
(source maps and stacks), ``tenancy`` (keys, projects, the guard), ``metadata`` (the
catalog database), ``cluster`` (nodes, the bus) and ``console``; under them all, ``core``.
"""
