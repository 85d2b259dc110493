"""boxtrail: the shell and shared ground.

- ``config``: settings, loaded once from ``BOXTRAIL_*`` and an optional TOML file
- ``errors``: the one JSON error shape and the error root
- ``db``: the SQLite metadata file; ``tenancy`` (tenants, API keys, projects) and
  ``catalog`` (every Parquet file, the WAL position flushed) live in it
- ``auth``: bearer key -> tenant -> project
- ``schema``: the log row (Arrow/Parquet schema, WAL batch, event ids)
- ``buffer``: durable rows not yet in Parquet, searchable
- ``storage``: put/get/list/delete on local disk or S3
- ``metrics``: Prometheus text
- ``routes``: projects, health, metrics endpoints
- ``app``: ``create_app(config)`` assembles ingest and query; ``cli``: ``boxtrail``
"""
