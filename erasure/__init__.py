"""Deletions: a project's logs erased on request, as jobs with a status a user can trust.

``selector``: what a deletion selects (a project, a box, a time range, a query), applied to
Arrow tables. ``jobs``: the job table, this node's part (its buffer and WAL), and the job's
own steps (Parquet files, source maps) under a lease. ``routes``: the endpoints.
"""
