"""Usage: what every tenant, project and box used, and what happened to every event.

What is counted, and how ingest's counts stay exact, is ``core.usage`` (the floor: every
stage adds to it). Here: ``store``: the ``usage_minutes`` table, written by the flush's
transaction and by a loop for the readers' counts and the hourly storage snapshot; ``sink``:
usage events pushed to a webhook as minutes close, at least once, from an outbox;
``routes``: ``GET /v1/usage`` and a project's outcomes.
"""
