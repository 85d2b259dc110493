"""The floor: what every stage stands on, importing none of them.

- ``config``: settings, loaded once from ``BOXTRAIL_*`` and an optional TOML file
- ``errors``: the error root and the one JSON error shape
- ``openapi``: the schema's error responses and what Litestar leaves out of it
- ``metrics``: counters, summaries and gauges, rendered as Prometheus text
- ``schema``: the log row (Arrow/Parquet schema, WAL batch, event ids)
- ``usage``: what is metered (kinds, units) and the tallies every stage adds to
- ``attrs``: an event's attributes as the JSON sent, read back for rows and search
- ``origins``: ``allowedOrigins`` parsed into a normal form and matched
- ``storage``: put/get/list/delete on local disk or S3
- ``supervisor``: long-lived loops restarted with backoff, counted, seen by ``/readyz``
- ``workers``: processes beside the server for work that would hold the GIL
"""
