"""boxtrail's client: what talks to a server over its HTTP API, and nothing of the server.

- ``errors``: :class:`ApiError`, the server's one error shape as an exception
- ``rows``: rows, error rows, usage rows and an upload's answer as msgspec Structs
- ``sse``: Server-Sent Events read from a response
- ``api``: :class:`Client` (search that pages by itself, errors, source map upload, keys,
  usage, deletions) and its async :meth:`Client.tail`, which resumes across reconnects and
  server restarts without losing or repeating a row
- ``upload``: a build directory's JS files and maps as one streamed multipart body
- ``cli``: the commands (``boxtrail search``, ``tail``, ``sourcemaps``, ``keys``, ``usage``,
  ``deletions``)
"""

from boxtrail_client.api import DEFAULT_URL, Client
from boxtrail_client.errors import ApiError, ClientError
from boxtrail_client.rows import ErrorRow, Row, UsageRow

__all__ = ["DEFAULT_URL", "ApiError", "Client", "ClientError", "ErrorRow", "Row", "UsageRow"]
