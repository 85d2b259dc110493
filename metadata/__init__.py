"""The metadata database, SQLite for one node or PostgreSQL for a cluster:

- ``db``: what both backends are (one connection, ``?`` placeholders, transactions,
  snapshots), and their errors
- ``ddl``: the schema of each, SQLite's as its chain of migrations
- ``sqlite``: the embedded backend, a file beside the WAL
- ``postgres``: the shared backend, with a deadline on every call and the advisory locks
  that hold a node's id
- ``connect``: the backend a setting names, opened
- ``catalog``: every Parquet file (pending, live, retired) and each node's flushed WAL
  position, read by the query planner in one snapshot with the live buffer
"""
