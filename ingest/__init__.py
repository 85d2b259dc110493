"""Ingest, in the order an event travels:

1. ``routes``: ``POST /v1/ingest``, and ``sentry``: Sentry's ``/api/{id}/envelope/`` and
   ``/store/`` (whose items ``envelope`` reads), both through ``intake``: key and origin
   (``origin``), body (``body``), rate limit (``ratelimit``); refusals in ``errors``
2. ``wire`` -> ``events``: decode, validate each event, apply limits -> a ``RowBatch``
   (``surrogates``: lone UTF-16 escapes repaired before the decode); a common body is read
   whole by the compiled ``_core`` (``_core.c``) into Arrow's buffers instead, the Python
   path judging whatever it declines; ``ids``: the batch's event ids, and this node's floor
3. ``wal``: append + group-commit fsync; the 202 is sent after this
4. ``buffer``: the batch becomes searchable (the live buffer), then the live tails and the
   other nodes take it (``service``)
5. ``flusher``: buffer -> Parquet files per (project, box, date) -> catalog -> WAL retired
6. ``service``: owns 3-5, replays the WAL at start, compacts small files
"""
