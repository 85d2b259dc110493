"""The console's files: within their size budget, self-contained (nothing fetched from
another host), every import resolvable, and served by the real server with their policy."""

from __future__ import annotations

import gzip
import re
import subprocess
from pathlib import Path

import httpx

from console.routes import STATIC, load_assets
from tests.support.server import Server

BUDGET_BYTES = 64 * 1024  # every file together, as served
BUDGET_GZIP_BYTES = 24 * 1024  # each file gzipped, summed (what a compressing proxy sends)
# Whatever would make the browser load from another host: an absolute or protocol-relative
# URL in src/href/url()/import/fetch/EventSource, or a CSS @import. (Text such as the
# placeholder "https://*.box.example.com" and the SVG namespace fetch nothing.)
_URL = re.compile(r"""(?:src|href)\s*[=:]\s*["']?(?:https?:)?//|url\(\s*["']?(?:https?:)?//"""
                  r"""|(?:from|import\(|fetch\(|EventSource\()\s*["'`](?:https?:)?//|@import""")
_IMPORT = re.compile(r'from "(\.[^"]+)"')
_LINKED = re.compile(r'(?:src|href)="(/console/[^"]+)"')


def test_the_files_stay_within_their_budget() -> None:
    assets = load_assets()
    raw = sum(len(a.body) for a in assets.values())
    zipped = sum(len(gzip.compress(a.body, 9)) for a in assets.values())
    print(f"console: {len(assets)} files, {raw:,} bytes, {zipped:,} gzipped")
    assert raw <= BUDGET_BYTES, f"console files are {raw:,} bytes, budget {BUDGET_BYTES:,}"
    assert zipped <= BUDGET_GZIP_BYTES, f"{zipped:,} bytes gzipped, budget {BUDGET_GZIP_BYTES:,}"


def test_nothing_is_fetched_from_elsewhere_and_every_import_resolves() -> None:
    assets = load_assets()
    for name, asset in assets.items():
        text = asset.body.decode()
        assert not _URL.search(text), f"{name} refers to another host: {_URL.search(text)}"
        for target in _IMPORT.findall(text):
            resolved = (STATIC / name).parent.joinpath(target).resolve()
            assert resolved.relative_to(STATIC).as_posix() in assets, f"{name}: {target}"
    for link in _LINKED.findall(assets["index.html"].body.decode()):
        assert link.removeprefix("/console/") in assets, link


def test_served_with_types_policy_and_etags(server: Server) -> None:
    with httpx.Client(base_url=server.url, timeout=10) as client:
        index = client.get("/")
        assert index.status_code == 200 and index.headers["content-type"].startswith("text/html")
        policy = index.headers["content-security-policy"]
        assert "script-src 'self'" in policy and "connect-src 'self'" in policy
        assert "frame-ancestors 'none'" in policy
        for name, kind in (("app.js", "text/javascript"), ("console.css", "text/css"),
                           ("views/tail.js", "text/javascript")):
            r = client.get(f"/console/{name}")
            assert r.status_code == 200 and r.headers["content-type"].startswith(kind), name
            assert r.headers["x-content-type-options"] == "nosniff"
            again = client.get(f"/console/{name}", headers={"If-None-Match": r.headers["etag"]})
            assert again.status_code == 304 and again.content == b""
        for missing in ("/console/nope.js", "/console/../pyproject.toml",
                        "/console/%2e%2e/routes.py", "/console/views"):
            r = client.get(missing)
            assert r.status_code == 404, missing
            assert r.json()["error"]["code"] == "not_found", missing


def test_scripts_served_without_their_comments_are_the_same_code(tmp_path: Path) -> None:
    """The server sends scripts without their whole-line comments (``console.routes.served``):
    what it sends still parses (node --check), every line of code is still there, and no
    template literal spans a line that only looks like a comment."""
    for name, asset in load_assets().items():
        if not name.endswith(".js"):
            continue
        source = (STATIC / name).read_text()
        inside = False
        for number, line in enumerate(source.splitlines(), 1):
            assert not (inside and line.strip().startswith(("//", "/*", "*"))), (name, number)
            inside ^= line.count("`") % 2 == 1
        sent = asset.body.decode()
        code = [line for line in source.splitlines(keepends=True) if line in sent]
        assert "".join(code) == sent, name  # lines dropped, none changed
        assert not re.search(r"(?m)^\s*//", sent), name
        path = tmp_path / name.replace("/", "-").replace(".js", ".mjs")
        path.write_text(sent)
        checked = subprocess.run(["node", "--check", str(path)], capture_output=True, text=True,
                                 timeout=30)
        assert checked.returncode == 0, (name, checked.stderr)
