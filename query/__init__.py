"""Reading logs back:

1. ``since``: the time window
2. ``engine``: plan (catalog pruning + live buffer snapshot) -> DuckDB over the exact files
3. ``rows``: rows as the API returns them, and the pagination cursor
4. ``routes``: ``GET /v1/projects/{project}/logs``
"""
