"""Who may do what, in the order a request meets it:

- ``tenants``: tenants, their API keys and projects (with their ingest keys and allowed
  origins), cached for ingest's hot path
- ``guard``: every route's check (bearer key or console session -> tenant -> project),
  default deny
- ``sessions``: the web console's sessions, opened with an API key
- ``routes``: the projects' endpoints and the console's sign-in
"""
