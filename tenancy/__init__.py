"""Who may do what, in the order a request meets it:

- ``tenants``: tenants and their projects (with their ingest keys and allowed origins),
  cached for ingest's hot path
- ``keys``: API keys, their scopes, expiry and revocation, and what they hold open
- ``changes``: the feed every node reads to apply at once what another changed
- ``guard``: every route's check (bearer key or console session -> tenant -> project),
  default deny
- ``sessions``: the web console's sessions, opened with an API key
- ``routes``: the projects' and API keys' endpoints, and the console's sign-in
"""
