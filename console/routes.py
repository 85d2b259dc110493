"""``/`` and ``/console/*``: the web console's files, served from memory.

The console is plain ES modules, CSS and one HTML page in ``console/static``: no build
step, nothing fetched at run time. Every answer carries a Content-Security-Policy that
lets a page run only this server's scripts and talk only to this server; the console
also never builds markup from data (``dom.js`` makes text nodes), so a log message is
always shown as text. The console signs in through ``/v1/session`` (``tenancy.sessions``)
and otherwise reads the public API.
"""

from __future__ import annotations

import hashlib
import mimetypes
from pathlib import Path
from typing import Final

from litestar import Request, Response, Router, get
from litestar.datastructures import State
from litestar.params import FromPath

from core.errors import NotFound
from tenancy.guard import PUBLIC

STATIC: Final = Path(__file__).resolve().parent / "static"

CSP: Final = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
              "connect-src 'self'; manifest-src 'self'; base-uri 'none'; form-action 'self'; "
              "frame-ancestors 'none'")
HEADERS: Final = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    # Revalidated every time (a 304 costs one round trip): a new build shows at once.
    "Cache-Control": "no-cache",
}
_TYPES: Final = {".js": "text/javascript", ".css": "text/css",
                 ".html": "text/html", ".svg": "image/svg+xml"}


def served(path: Path, body: bytes) -> bytes:
    """What is sent of a file: a script without its whole-line comments (``//`` lines and
    ``/* ... */`` blocks that start a line), which are for the reader of the source, not for
    the browser (a quarter of the console's bytes). Nothing else is changed: no line of
    code, and no template literal spans lines that look like comments (a test holds it)."""
    if path.suffix != ".js":
        return body
    kept, in_block = [], False
    for line in body.decode().splitlines(keepends=True):
        text = line.strip()
        if in_block:
            in_block = not text.endswith("*/")
        elif text.startswith("//"):
            pass
        elif text.startswith("/*") and ("*/" not in text or text.endswith("*/")):
            in_block = not text.endswith("*/")
        else:
            kept.append(line)
    return "".join(kept).encode()


class Asset:
    def __init__(self, path: Path) -> None:
        self.body = served(path, path.read_bytes())
        self.etag = '"' + hashlib.sha256(self.body).hexdigest()[:20] + '"'
        self.media_type = _TYPES.get(path.suffix) or mimetypes.guess_type(path.name)[0] \
            or "application/octet-stream"


def load_assets(root: Path = STATIC) -> dict[str, Asset]:
    """Every file under ``root`` by its path relative to it (``views/tail.js``)."""
    return {p.relative_to(root).as_posix(): Asset(p)
            for p in sorted(root.rglob("*")) if p.is_file()}


def console_router() -> Router:
    assets = load_assets()

    def answer(request: Request[object, object, State], name: str) -> Response[bytes]:
        asset = assets.get(name)
        if asset is None:
            raise NotFound(f"no console file {name!r}", detail={"path": name[:200]})
        if request.headers.get("if-none-match") == asset.etag:
            return Response(b"", status_code=304, headers={**HEADERS, "ETag": asset.etag})
        return Response(asset.body, media_type=asset.media_type,
                        headers={**HEADERS, "ETag": asset.etag})

    @get("/", summary="The web console", include_in_schema=False)
    async def index(request: Request[object, object, State]) -> Response[bytes]:
        return answer(request, "index.html")

    @get("/console/{path:path}", summary="The web console's files", include_in_schema=False)
    async def asset(request: Request[object, object, State],
                    path: FromPath[str]) -> Response[bytes]:
        return answer(request, path.lstrip("/"))

    # Nothing here is secret: the files are the same for everyone, signed in or not.
    return Router("", route_handlers=[index, asset], opt=PUBLIC)
