"""A build directory's JS files and source maps as one multipart body, streamed from disk
with a progress bar (the server stores all of them or none)."""

from __future__ import annotations

import http.client
import os
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO
from urllib.parse import quote, urlsplit

import msgspec

from boxtrail_client.errors import ApiError, ClientError
from boxtrail_client.rows import Uploaded

JS_SUFFIXES = (".js", ".mjs", ".cjs")  # as the server reads them
CHUNK = 64 << 10
TIMEOUT_S = 300.0


class _ErrorBody(msgspec.Struct):
    code: str
    message: str


class _Error(msgspec.Struct):
    error: _ErrorBody


def collect(root: Path) -> list[tuple[str, Path]]:
    """``(name relative to root, path)`` of the JS files and maps under ``root``, sorted."""
    if not root.is_dir():
        raise ClientError(f"{root} is not a directory")
    found = []
    for directory, dirs, files in os.walk(root):
        dirs.sort()
        for file in sorted(files):
            if file.endswith(JS_SUFFIXES) or (file.endswith(".map")
                                              and not file.endswith(".css.map")):
                path = Path(directory) / file
                name = path.relative_to(root).as_posix()
                if any(c in name for c in '"\\%') or not name.isprintable():
                    raise ClientError(f"{name}: file names with quotes, backslashes, % or "
                                      "control characters cannot be uploaded")
                found.append((name, path))
    if not found:
        raise ClientError(f"no .js or .map files under {root}")
    return found


class Progress:
    """A bar on ``out`` (a line per quarter when it is not a terminal); None: silent."""

    def __init__(self, total: int, out: TextIO | None) -> None:
        self.total, self.sent, self.out = max(total, 1), 0, out
        self.tty = out is not None and out.isatty()
        self.shown = -1

    def advance(self, count: int) -> None:
        self.sent += count
        if self.out is None:
            return
        percent = self.sent * 100 // self.total
        step = percent if self.tty else percent // 25 * 25
        if step == self.shown:
            return
        self.shown = step
        bar = "#" * (percent // 5) + "-" * (20 - percent // 5)
        line = (f"uploading [{bar}] {percent:3d}% "
                f"{self.sent / 1e6:.1f}/{self.total / 1e6:.1f} MB")
        self.out.write(("\r" + line) if self.tty else line + "\n")
        if self.tty and self.sent >= self.total:
            self.out.write("\n")
        self.out.flush()


def _parts(fields: dict[str, str], files: list[tuple[str, Path]], boundary: str
           ) -> tuple[list[bytes | Path], int]:
    pieces: list[bytes | Path] = []
    for name, value in fields.items():
        pieces.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n'
                      f"{value}\r\n".encode())
    for name, path in files:
        kind = "application/json" if name.endswith(".map") else "application/javascript"
        pieces.append(f'--{boundary}\r\nContent-Disposition: form-data; name="file"; '
                      f'filename="{name}"\r\nContent-Type: {kind}\r\n\r\n'.encode())
        pieces.append(path)
        pieces.append(b"\r\n")
    pieces.append(f"--{boundary}--\r\n".encode())
    size = sum(p.stat().st_size if isinstance(p, Path) else len(p) for p in pieces)
    return pieces, size


def _stream(pieces: list[bytes | Path], progress: Progress) -> Iterator[bytes]:
    for piece in pieces:
        if isinstance(piece, bytes):
            progress.advance(len(piece))
            yield piece
            continue
        with piece.open("rb") as f:
            while chunk := f.read(CHUNK):
                progress.advance(len(chunk))
                yield chunk


def upload(root: Path, *, url: str, api_key: str, project: str, release: str | None,
           url_prefix: str | None, progress: TextIO | None = None
           ) -> tuple[Uploaded, int, int, float]:
    """Upload ``root``'s files; the server's answer, the file count, the bytes sent and the
    seconds it took."""
    files = collect(root)
    fields = {"urlPrefix": url_prefix or "~/"}
    if release:
        fields["release"] = release
    for value in fields.values():
        if any(c in value for c in '"\r\n'):
            raise ClientError(f"{value!r}: quotes and line breaks are not allowed")
    boundary = "boxtrail-" + secrets.token_hex(16)
    pieces, size = _parts(fields, files, boundary)
    base = urlsplit(url)
    if base.scheme not in ("http", "https") or not base.hostname:
        raise ClientError(f"BOXTRAIL_URL={url!r} is not an http(s):// URL")
    connection_class = (http.client.HTTPSConnection if base.scheme == "https"
                        else http.client.HTTPConnection)
    conn = connection_class(base.hostname, base.port, timeout=TIMEOUT_S)
    path = f"{base.path.rstrip('/')}/v1/projects/{quote(project, safe='')}/sourcemaps"
    started = time.monotonic()
    try:
        conn.request("POST", path, body=_stream(pieces, Progress(size, progress)), headers={
            "Authorization": f"Bearer {api_key}", "Content-Length": str(size),
            "Content-Type": f"multipart/form-data; boundary={boundary}"})
        response = conn.getresponse()
        body = response.read()
    except (OSError, http.client.HTTPException) as exc:
        raise ClientError(f"cannot reach {url}: {exc}") from None
    finally:
        conn.close()
    if response.status != 201:
        try:
            error = msgspec.json.decode(body, type=_Error).error
        except (msgspec.DecodeError, msgspec.ValidationError):
            raise ApiError(response.status, "http_error",
                           body[:300].decode("utf-8", "replace")) from None
        raise ApiError(response.status, error.code, error.message)
    return (msgspec.json.decode(body, type=Uploaded), len(files), size,
            time.monotonic() - started)
