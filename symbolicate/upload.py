"""``boxtrail sourcemaps upload DIR``: send a build directory's JS files and maps from CI.

The files go in one multipart request (the server stores all of them or none), streamed
from disk with a progress bar on stderr. Every failure (no files, server unreachable, an
error answer) is one clear line and a non-zero exit code; the summary and the server's
warnings go to stdout.
"""

from __future__ import annotations

import argparse
import http.client
import os
import secrets
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TextIO
from urllib.parse import quote, urlsplit

import msgspec

from symbolicate.sourcemaps import JS_SUFFIXES

DEFAULT_URL = "http://127.0.0.1:8780"
CHUNK = 64 << 10
TIMEOUT_S = 300.0


class UploadFailed(Exception):
    """The upload did not happen; the message says why."""


class _Warning(msgspec.Struct):
    file: str
    code: str
    message: str


class _File(msgspec.Struct, rename="camel"):
    url: str
    name: str
    map_name: str
    has_js: bool
    sources_content: bool
    debug_id: str | None = None


class _Answer(msgspec.Struct, rename="camel"):
    release: str | None
    url_prefix: str
    files: list[_File]
    warnings: list[_Warning]


class _ErrorBody(msgspec.Struct):
    code: str
    message: str


class _Error(msgspec.Struct):
    error: _ErrorBody


def collect(root: Path) -> list[tuple[str, Path]]:
    """``(name relative to root, path)`` of the JS files and maps under ``root``, sorted."""
    if not root.is_dir():
        raise UploadFailed(f"{root} is not a directory")
    found = []
    for directory, dirs, files in os.walk(root):
        dirs.sort()
        for file in sorted(files):
            if file.endswith(JS_SUFFIXES) or (file.endswith(".map")
                                              and not file.endswith(".css.map")):
                path = Path(directory) / file
                name = path.relative_to(root).as_posix()
                if any(c in name for c in '"\\%') or not name.isprintable():
                    raise UploadFailed(f"{name}: file names with quotes, backslashes, % or "
                                       "control characters cannot be uploaded")
                found.append((name, path))
    if not found:
        raise UploadFailed(f"no .js or .map files under {root}")
    return found


class Progress:
    def __init__(self, total: int, out: TextIO) -> None:
        self.total, self.sent, self.out = max(total, 1), 0, out
        self.tty = out.isatty()
        self.shown = -1

    def advance(self, count: int) -> None:
        self.sent += count
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
           url_prefix: str | None, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> None:
    files = collect(root)
    fields = {"urlPrefix": url_prefix or "~/"}
    if release:
        fields["release"] = release
    for value in fields.values():
        if any(c in value for c in '"\r\n'):
            raise UploadFailed(f"{value!r}: quotes and line breaks are not allowed")
    boundary = "boxtrail-" + secrets.token_hex(16)
    pieces, size = _parts(fields, files, boundary)
    base = urlsplit(url)
    if base.scheme not in ("http", "https") or not base.hostname:
        raise UploadFailed(f"BOXTRAIL_URL={url!r} is not an http(s):// URL")
    connection_class = (http.client.HTTPSConnection if base.scheme == "https"
                        else http.client.HTTPConnection)
    conn = connection_class(base.hostname, base.port, timeout=TIMEOUT_S)
    path = f"{base.path.rstrip('/')}/v1/projects/{quote(project, safe='')}/sourcemaps"
    started = time.monotonic()
    try:
        conn.request("POST", path, body=_stream(pieces, Progress(size, err)), headers={
            "Authorization": f"Bearer {api_key}", "Content-Length": str(size),
            "Content-Type": f"multipart/form-data; boundary={boundary}"})
        response = conn.getresponse()
        body = response.read()
    except (OSError, http.client.HTTPException) as exc:
        raise UploadFailed(f"cannot reach {url}: {exc}") from None
    finally:
        conn.close()
    if response.status != 201:
        try:
            error = msgspec.json.decode(body, type=_Error).error
            raise UploadFailed(f"upload refused ({response.status} {error.code}): "
                               f"{error.message}")
        except msgspec.DecodeError:
            raise UploadFailed(f"upload refused ({response.status}): "
                               f"{body[:300].decode('utf-8', 'replace')}") from None
    answer = msgspec.json.decode(body, type=_Answer)
    seconds = time.monotonic() - started
    release_text = f"release {answer.release}" if answer.release else "no release"
    out.write(f"stored {len(answer.files)} source maps ({len(files)} files, "
              f"{size / 1e6:.1f} MB in {seconds:.1f} s) for {release_text} at "
              f"{answer.url_prefix}\n")
    for file in answer.files:
        js = file.name if file.has_js else "(no JS)"
        extra = f"  debug id {file.debug_id}" if file.debug_id else ""
        out.write(f"  {file.url}  <- {js} + {file.map_name}{extra}\n")
    for warning in answer.warnings:
        out.write(f"warning: {warning.message}\n")


def add_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sourcemaps = commands.add_parser("sourcemaps", help="upload source maps from CI")
    actions = sourcemaps.add_subparsers(dest="sourcemaps_command", required=True)
    up = actions.add_parser(
        "upload", help="upload a build directory's .js files and their source maps",
        description="Reads BOXTRAIL_URL (default http://127.0.0.1:8780) and BOXTRAIL_API_KEY.")
    up.add_argument("dir", type=Path, help="the build output directory")
    up.add_argument("--project", "-p", required=True)
    up.add_argument("--release", help="the release the pages send (context.release)")
    up.add_argument("--url-prefix", default="~/",
                    help="where DIR is served: ~/assets (any host) or https://cdn.example/x")


def run(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    key = environ.get("BOXTRAIL_API_KEY")
    try:
        if not key:
            raise UploadFailed("set BOXTRAIL_API_KEY to an API key (see `boxtrail keys create`)")
        upload(args.dir, url=environ.get("BOXTRAIL_URL", DEFAULT_URL), api_key=key,
               project=args.project, release=args.release, url_prefix=args.url_prefix)
    except UploadFailed as exc:
        print(f"boxtrail: {exc}", file=sys.stderr)
        return 1
    return 0
