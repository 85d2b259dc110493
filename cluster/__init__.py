"""Several nodes as one service, sharing PostgreSQL, Redis and S3:

- ``nodes``: a node's id, held by a PostgreSQL advisory lock while it lives
- ``bus``: every node's acked rows to the others on a Redis stream, held until their node
  flushes them; the watermark that keeps live tails in id order across nodes; shared
  limits
"""
