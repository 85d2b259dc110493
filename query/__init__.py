"""Reading logs back, in the order a request is answered:

1. ``since``: the time window; ``language``: the search language -> parameterized SQL
2. ``engine``: plan (catalog pruning + live buffer snapshot) -> DuckDB over the exact files
3. ``rows``: rows as the API returns them, and the pagination cursor
4. ``routes``: ``GET /v1/projects/{project}/logs``; ``histogram``: the same rows counted
   per time bucket and level
5. ``errors_view``: ``/errors`` (``logs_errors``): error rows with symbolicated frames,
   or grouped by fingerprint
6. ``tail``: live rows over Server-Sent Events (``logs_tail``): each tail reads from its
   cursor, or takes the pages a ``hubs`` hub builds once for all tails of a filter, rows
   encoded as ``frames``
7. ``mcp``: the three agent tools over MCP, mounted at ``/mcp`` by ``mcp_mount``

``boxtrail search`` and ``boxtrail tail`` are the client's (``boxtrail_client``).
"""
