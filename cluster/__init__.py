"""Several nodes as one service, sharing PostgreSQL, Redis and S3:

- ``nodes``: a node's id, held by a PostgreSQL advisory lock while it lives
- ``bus``: every node's acked batches to the others on a Redis stream (as ``wire`` encodes
  them), heartbeats with each node's floor, asks for the rows of bare batches, shared
  limits
- ``peers``: the other nodes' rows held until their node flushes them, and the cluster
  watermark that keeps live tails in id order
"""
