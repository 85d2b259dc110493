"""The metadata database, SQLite for one node or PostgreSQL for a cluster:

- ``db``: the two backends behind one connection type, their schemas, deadlines on every
  PostgreSQL call
- ``catalog``: every Parquet file (pending, live, retired) and each node's flushed WAL
  position, read by the query planner in one snapshot with the live buffer
"""
