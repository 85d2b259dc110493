"""Uploaded JS files and source maps: bytes on the storage backend, an index in SQLite.

- Bytes are content-addressed: ``sourcemaps/<project id>/<sha256>``. A name from an upload
  never becomes a key or a path; the same bytes uploaded again are not written again.
- The index (table ``sourcemap_artifacts``) has one row per (project, release, url): the JS
  file's sha256 (NULL when only its map came), the map's, the debug id and whether the map
  carries its sources. An upload replaces the rows of the same release and URL.
- Atomic: every blob is written before one transaction adds all of an upload's rows, so a
  reader sees all of an upload or none of it. Blobs no row needs any more are deleted after
  the transaction. Uploads and deletes are serialized by one lock, so a blob is never
  deleted while an upload that reuses it is between its write and its commit.
- :attr:`ArtifactStore.generation` counts the changes per project; lookup caches key on
  it, so an upload or a delete is seen by the next read (uploads apply retroactively).
- ``uploaded``, when given to :class:`ArtifactStore`, is called with each upload's rows
  once they are visible, and the upload waits for what it returns (``symbolicate.lookup``
  builds their lookups then, so the first error after a deploy finds them built).

SQLite is written from the event loop's thread only (see ``metadata.db``). Hashing and
writing blobs (:meth:`ArtifactStore.put_blobs`) run in a worker process with the upload's
validation (``symbolicate.staging``), so an upload of hundreds of MB never holds up ingest;
workers read the index through their own read-only connection (``core.workers``).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from urllib.parse import urlsplit

import msgspec

from core.storage import Storage
from metadata.db import Database
from symbolicate.sourcemaps import UploadPlan

_COLUMNS = ("project_id, release, url, name, map_name, js_sha256, js_bytes, map_sha256, "
            "map_bytes, debug_id, sources_content, uploaded_at, seq")


class ArtifactRow(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    project_id: str
    release: str
    url: str
    name: str
    map_name: str
    js_sha256: str | None
    js_bytes: int
    map_sha256: str
    map_bytes: int
    debug_id: str | None
    sources_content: bool
    uploaded_at: str
    seq: int


def _row(values: tuple[object, ...]) -> ArtifactRow:
    return msgspec.convert(values, ArtifactRow, strict=False)


def blob_key(project_id: str, sha256: str) -> str:
    return f"sourcemaps/{project_id}/{sha256}"


# What is derived from a blob and stored beside it (``<blob>.<kind>``), deleted with it.
DERIVED = ("scopes",)


def strip_url(url: str) -> str:
    """A URL without its query string and fragment (``app.js?v=3#x`` -> ``app.js``)."""
    return url.split("#", 1)[0].split("?", 1)[0]


def url_candidates(url: str) -> tuple[str, ...]:
    """The index URLs a frame's URL matches: itself, and ``~/path`` (any scheme and host).
    A URL ``urlsplit`` refuses (``https://[x/app.js``: an unclosed IPv6 host) matches only
    as written."""
    url = strip_url(url)
    if "://" in url:
        try:
            path = urlsplit(url).path or "/"
        except ValueError:
            return (url,)
        return (url, "~" + path)
    if url.startswith("/"):  # a page-relative path, as some tools print
        return (url, "~" + url)
    return (url,)


def _encodable(params: tuple[str, ...]) -> bool:
    """Whether the database can take these values: a frame's URL or an event's release may hold a
    lone surrogate, which UTF-8 cannot encode; no stored row holds one (uploaded names are
    decoded from UTF-8), so such a value matches nothing."""
    try:
        for value in params:
            if "\x00" in value:  # PostgreSQL's text holds none: such a value matches nothing
                return False
            if not value.isascii():
                value.encode()
    except UnicodeEncodeError:
        return False
    return True


class Blobs(msgspec.Struct, frozen=True, kw_only=True):
    """An artifact of an upload, its bytes stored: what its index row will say."""

    url: str
    name: str
    map_name: str
    js_sha256: str | None
    js_bytes: int
    map_sha256: str
    map_bytes: int
    debug_id: str | None
    sources_content: bool


class ArtifactStore:
    def __init__(self, db: Database, storage: Storage,
                 uploaded: Callable[[str, list[ArtifactRow]], Awaitable[None] | None]
                 | None = None) -> None:
        """``uploaded(project_id, rows)``: what an upload waits for once its rows are indexed
        (the server: building their lookups in a worker, ``boxtrail.app``)."""
        self.db = db
        self.storage = storage
        self.lock = asyncio.Lock()  # uploads and deletes, one at a time
        self.uploaded = uploaded

    def generation(self, project_id: str) -> int:
        """How many times the project's source maps changed (uploads and deletes, on any
        node): what the symbolication caches key on."""
        row = self.db.execute("SELECT generation FROM sourcemap_generations WHERE project_id = ?",
                              (project_id,)).fetchone()
        return int(row[0]) if row else 0

    def _changed(self, project_id: str) -> None:
        """Inside the transaction that changed the project's rows."""
        self.db.execute(
            "INSERT INTO sourcemap_generations (project_id, generation) VALUES (?, 1) "
            "ON CONFLICT (project_id) DO UPDATE SET "
            "generation = sourcemap_generations.generation + 1", (project_id,))

    # --- writes --------------------------------------------------------------------------

    async def upload(self, project_id: str, release: str, plan: UploadPlan) -> list[ArtifactRow]:
        """Store ``plan``'s files and index them: :meth:`put_blobs` (in a thread here; the
        server runs it in a worker process, ``symbolicate.routes``) then :meth:`commit`."""
        async with self.lock:
            files = await asyncio.to_thread(self.put_blobs, project_id, plan)
            rows = await self.commit(project_id, release, files)
        await self.announce(project_id, rows)
        return rows

    def put_blobs(self, project_id: str, plan: UploadPlan) -> list[Blobs]:
        """Hash ``plan``'s files and write the bytes not stored yet (any thread or process;
        hold :attr:`lock` until :meth:`commit`: a concurrent delete must not collect a blob
        this upload found already stored)."""
        out = []
        for artifact in plan.artifacts:
            js_sha256 = None if artifact.js is None else hashlib.sha256(artifact.js).hexdigest()
            map_sha256 = hashlib.sha256(artifact.map).hexdigest()
            for sha, data in ((js_sha256, artifact.js), (map_sha256, artifact.map)):
                if sha is not None and data is not None:
                    key = blob_key(project_id, sha)
                    if self.storage.head(key) is None:
                        self.storage.put(key, data)
            out.append(Blobs(url=artifact.url, name=artifact.name, map_name=artifact.map_name,
                             js_sha256=js_sha256, js_bytes=len(artifact.js or b""),
                             map_sha256=map_sha256, map_bytes=len(artifact.map),
                             debug_id=artifact.debug_id,
                             sources_content=artifact.sources_content))
        return out

    async def commit(self, project_id: str, release: str, files: list[Blobs]
                     ) -> list[ArtifactRow]:
        """Index ``files`` (their blobs written by :meth:`put_blobs`) in one transaction,
        replacing the rows of the same release and URL; :attr:`lock` held."""
        assert self.lock.locked()
        replaced = self._shas("project_id = ? AND release = ? AND url IN "
                              f"({', '.join('?' * len(files))})",
                              (project_id, release, *(f.url for f in files)))
        # From a thread: the commit waits for an fsync (metadata.db).
        rows = await asyncio.to_thread(self._index, project_id, release, files)
        kept = {sha for f in files for sha in (f.js_sha256, f.map_sha256) if sha}
        await self._collect(project_id, replaced - kept)
        return rows

    def _index(self, project_id: str, release: str, files: list[Blobs]) -> list[ArtifactRow]:
        now = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        names = _COLUMNS.split(", ")
        updates = ", ".join(f"{n} = excluded.{n}" for n in names
                            if n not in ("project_id", "release", "url"))
        with self.db.transaction():  # all of the upload or none of it
            # Upload order across a cluster's nodes: the next numbers under one lock.
            self.db.serialize("sourcemap_seq")
            seq = int(self.db.execute(
                "SELECT coalesce(max(seq), 0) FROM sourcemap_artifacts").fetchone()[0])
            rows = []
            for file in files:
                seq += 1
                rows.append(ArtifactRow(project_id=project_id, release=release,
                                        uploaded_at=now, seq=seq,
                                        **msgspec.structs.asdict(file)))
            self.db.executemany(
                f"INSERT INTO sourcemap_artifacts ({_COLUMNS}) "
                f"VALUES ({', '.join('?' * len(names))}) "
                f"ON CONFLICT (project_id, release, url) DO UPDATE SET {updates}",
                [[int(v) if isinstance(v, bool) else v for v in msgspec.to_builtins(r)]
                 for r in rows])
            self._changed(project_id)
        return rows

    async def announce(self, project_id: str, rows: list[ArtifactRow]) -> None:
        """Call :attr:`uploaded` with an upload's rows, and wait for it."""
        if self.uploaded is not None and (building := self.uploaded(project_id, rows)) is not None:
            await building

    async def delete(self, project_id: str, release: str) -> int:
        async with self.lock:
            where, params = "project_id = ? AND release = ?", (project_id, release)
            shas = self._shas(where, params)
            count = await asyncio.to_thread(self._remove, where, params, project_id)
            await self._collect(project_id, shas)
        return count

    async def delete_project(self, project_id: str) -> tuple[int, int]:
        """Every source map of a deleted project: its index rows, its generation and every
        object under its prefix (blobs and what was derived from them). Returns (rows,
        objects) removed."""
        async with self.lock:
            rows = await asyncio.to_thread(self._forget_project, project_id)
            objects = await asyncio.to_thread(self._delete_prefix, f"sourcemaps/{project_id}/")
        return rows, objects

    def _forget_project(self, project_id: str) -> int:
        with self.db.transaction():
            count: int = self.db.execute(
                "DELETE FROM sourcemap_artifacts WHERE project_id = ?", (project_id,)).rowcount
            self.db.execute("DELETE FROM sourcemap_generations WHERE project_id = ?",
                            (project_id,))
        return count

    def _delete_prefix(self, prefix: str) -> int:
        keys = [info.key for info in self.storage.list(prefix)]
        for key in keys:
            self.storage.delete(key)
        return len(keys)

    def _remove(self, where: str, params: tuple[str, ...], project_id: str) -> int:
        with self.db.transaction():
            count: int = self.db.execute(f"DELETE FROM sourcemap_artifacts WHERE {where}",
                                         params).rowcount
            if count:
                self._changed(project_id)
        return count

    def _shas(self, where: str, params: tuple[str, ...]) -> set[str]:
        rows = self.db.execute(
            f"SELECT js_sha256, map_sha256 FROM sourcemap_artifacts WHERE {where}", params)
        return {sha for row in rows for sha in row if sha}

    async def _collect(self, project_id: str, shas: set[str]) -> None:
        """Delete the blobs among ``shas`` that no row of the project refers to any more."""
        unused = [sha for sha in shas if self.db.execute(
            "SELECT 1 FROM sourcemap_artifacts WHERE project_id = ? AND "
            "(js_sha256 = ? OR map_sha256 = ?) LIMIT 1", (project_id, sha, sha)).fetchone()
            is None]
        if unused:
            await asyncio.to_thread(self._delete_blobs, project_id, unused)

    def _delete_blobs(self, project_id: str, shas: list[str]) -> None:
        for sha in shas:
            self.storage.delete(blob_key(project_id, sha))
            for kind in DERIVED:
                self.storage.delete(f"{blob_key(project_id, sha)}.{kind}")

    # --- reads (event loop thread) -------------------------------------------------------

    def rows(self, project_id: str, release: str | None) -> list[ArtifactRow]:
        where: str = "project_id = ?"
        params: tuple[str, ...] = (project_id,)
        if release is not None:
            where, params = "project_id = ? AND release = ?", (project_id, release)
        if not _encodable(params):
            return []
        return [_row(r) for r in self.db.execute(
            f"SELECT {_COLUMNS} FROM sourcemap_artifacts WHERE {where} ORDER BY release, url",
            params)]

    def by_debug_id(self, project_id: str, debug_id: str) -> ArtifactRow | None:
        return self._one("project_id = ? AND debug_id = ?", (project_id, debug_id))

    def by_url(self, project_id: str, release: str | None, urls: tuple[str, ...]
               ) -> ArtifactRow | None:
        """The newest row at one of ``urls``: in ``release``, or in any release if None."""
        marks = ", ".join("?" * len(urls))
        if release is None:
            return self._one(f"project_id = ? AND url IN ({marks})", (project_id, *urls))
        return self._one(f"project_id = ? AND release = ? AND url IN ({marks})",
                         (project_id, release, *urls))

    def has_debug_ids(self, project_id: str) -> bool:
        return self.db.execute(
            "SELECT 1 FROM sourcemap_artifacts WHERE project_id = ? AND debug_id IS NOT NULL "
            "LIMIT 1", (project_id,)).fetchone() is not None

    def urls_named(self, project_id: str, basename: str, limit: int = 5) -> list[str]:
        """Uploaded URLs whose last segment is ``basename`` (to tell a URL mismatch from a
        missing upload)."""
        pattern = "%/" + basename.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        if not _encodable((pattern,)):
            return []
        return [r[0] for r in self.db.execute(
            "SELECT DISTINCT url FROM sourcemap_artifacts WHERE project_id = ? AND "
            "url LIKE ? ESCAPE '\\' LIMIT ?", (project_id, pattern, limit))]

    def _one(self, where: str, params: tuple[str, ...]) -> ArtifactRow | None:
        if not _encodable(params):
            return None
        found = self.db.execute(
            f"SELECT {_COLUMNS} FROM sourcemap_artifacts WHERE {where} ORDER BY seq DESC "
            "LIMIT 1", params).fetchone()
        return _row(found) if found else None

    # --- bytes (any thread) --------------------------------------------------------------

    def read(self, project_id: str, sha256: str) -> bytes:
        """The blob's bytes; raises ``core.storage.NotFound``."""
        return self.storage.get(blob_key(project_id, sha256))

    def read_derived(self, project_id: str, sha256: str, kind: str) -> bytes:
        """What was derived from the blob and kept (one of :data:`DERIVED`); raises
        ``core.storage.NotFound``."""
        return self.storage.get(f"{blob_key(project_id, sha256)}.{kind}")

    def write_derived(self, project_id: str, sha256: str, kind: str, data: bytes) -> None:
        self.storage.put(f"{blob_key(project_id, sha256)}.{kind}", data)
