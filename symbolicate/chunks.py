"""sentry-cli's chunks and artifact bundles, in a worker process (``core.workers``): each
chunk of an upload checked and stored per tenant, and the chunks of a bundle put together,
checked and read into the blobs of an upload (``symbolicate.sentry_cli`` has the protocol)."""

from __future__ import annotations

import hashlib
import re
import zlib
from typing import BinaryIO

import msgspec
from multipart import (  # type: ignore[import-untyped]
    MultipartSegment,
    ParserError,
    ParserLimitReached,
    PushMultipartParser,
)

from core.errors import ApiError
from core.storage import NotFound as MissingObject
from core.storage import Storage
from symbolicate.artifacts import Blobs
from symbolicate.bundles import HEADER_BYTES, BundleError, check_header, plan_bundle, read_bundle
from symbolicate.side import SymbolicateSide
from symbolicate.sourcemaps import MAX_UPLOAD_BYTES, UploadTooLarge

CHUNK_BYTES = 8 << 20  # as Sentry
CHUNKS_PER_REQUEST = 64
READ_BYTES = 1 << 20

_SHA1 = re.compile(r"[0-9a-f]{40}")


class ChunkError(ApiError):
    """A chunk upload that cannot be read: not multipart, no SHA-1 filename, bad gzip."""

    status_code = 400
    code = "invalid_chunk"


class ChunkChecksumMismatch(ChunkError):
    """A chunk's SHA-1 is not the one its filename says."""

    code = "chunk_checksum_mismatch"


class ChunkTooLarge(ApiError):
    """A chunk larger than ``chunkSize`` once inflated, or too many chunks in a request."""

    status_code = 413
    code = "chunk_too_large"


class BundleChecksumMismatch(BundleError):
    """The chunks put together do not have the bundle's SHA-1."""

    code = "bundle_checksum_mismatch"


class Assembled(msgspec.Struct, frozen=True, kw_only=True):
    files: dict[str, list[Blobs]]  # per project id


def chunk_key(tenant: str, sha1: str) -> str:
    return f"sentry-chunks/{tenant}/{sha1}"


# --- chunks -------------------------------------------------------------------------------


class _Part:
    """One chunk of a request, inflated and hashed as it is read."""

    def __init__(self, sha1: str, gzipped: bool) -> None:
        self.sha1 = sha1
        self.inflate = zlib.decompressobj(16 + zlib.MAX_WBITS) if gzipped else None
        self.data = bytearray()

    @staticmethod
    def start(segment: MultipartSegment) -> _Part | None:
        if segment.name not in ("file", "file_gzip"):
            return None  # another field: ignored, as a form handler does
        name = (segment.filename or "").lower()
        if not _SHA1.fullmatch(name):
            raise ChunkError(f"a chunk's filename must be its SHA-1 (40 hex digits), not "
                             f"{(segment.filename or '')[:80]!r}")
        return _Part(name, segment.name == "file_gzip")

    def feed(self, piece: bytes) -> None:
        if self.inflate is None:
            self.data += piece
        else:
            try:  # never more than one byte past the limit, however well it compresses
                self.data += self.inflate.decompress(piece, CHUNK_BYTES + 1 - len(self.data))
            except zlib.error as exc:
                raise ChunkError(f"chunk {self.sha1}: not gzip: {exc}",
                                 detail={"chunk": self.sha1}) from None
        if len(self.data) > CHUNK_BYTES:
            raise ChunkTooLarge(f"chunk {self.sha1}: more than {CHUNK_BYTES} bytes (chunkSize)",
                                detail={"chunk": self.sha1, "limit": CHUNK_BYTES})

    def finish(self) -> bytes:
        if self.inflate is not None and (not self.inflate.eof or self.inflate.unused_data):
            raise ChunkError(f"chunk {self.sha1}: not one complete gzip stream",
                             detail={"chunk": self.sha1})
        actual = hashlib.sha1(self.data).hexdigest()
        if actual != self.sha1:
            raise ChunkChecksumMismatch(f"chunk {self.sha1}: its SHA-1 is {actual}",
                                        detail={"chunk": self.sha1, "sha1": actual})
        return bytes(self.data)


def store_chunks(side: SymbolicateSide, tenant: str, path: str, boundary: str) -> list[str]:
    """In a worker: each chunk of the request body at ``path`` checked and stored."""
    stored: list[str] = []
    part: _Part | None = None
    try:
        with open(path, "rb") as body, PushMultipartParser(
                boundary, max_segment_count=CHUNKS_PER_REQUEST) as parser:
            while not parser.closed:
                piece = body.read(READ_BYTES)  # b"" at the end: the parser checks it is one
                for event in parser.parse(piece):
                    if isinstance(event, MultipartSegment):
                        part = _Part.start(event)
                    elif event:
                        if part is not None:
                            part.feed(event)
                    elif part is not None:  # the end of a chunk
                        data = part.finish()
                        key = chunk_key(tenant, part.sha1)
                        if side.storage.head(key) is None:
                            side.storage.put(key, data)
                        stored.append(part.sha1)
                        part = None
                if not piece:
                    break
    except ParserLimitReached:
        raise ChunkTooLarge(f"more than {CHUNKS_PER_REQUEST} chunks in one request "
                            "(chunksPerRequest)") from None
    except ParserError as exc:
        raise ChunkError(f"the multipart/form-data body cannot be read: {exc}") from None
    if not stored:
        raise ChunkError("no chunk in the request: send `file_gzip` or `file` parts named "
                         "by their SHA-1")
    return stored


# --- bundles ------------------------------------------------------------------------------


def assemble_bundle(side: SymbolicateSide, tenant: str, checksum: str, chunks: list[str],
                    project_ids: list[str], path: str) -> Assembled:
    """In a worker: the chunks put together at ``path``, the bundle read and validated, its
    blobs stored for each project (indexing them is the server's: ``ArtifactStore.commit``).
    Raises one of :data:`BUNDLE_ERRORS` when the bundle is refused."""
    with open(path, "w+b") as zip_file:
        _concatenate(side.storage, tenant, checksum, chunks, zip_file)
        plan = plan_bundle(read_bundle(zip_file))
    return Assembled(files={pid: side.store.put_blobs(pid, plan) for pid in project_ids})


def _concatenate(storage: Storage, tenant: str, checksum: str, chunks: list[str],
                 out: BinaryIO) -> None:
    """The chunks into ``out``, without the bundle's header, which is checked, as is the
    SHA-1 of the whole."""
    whole = hashlib.sha1()
    header = b""
    size = 0
    for sha1 in chunks:
        try:
            data = storage.get(chunk_key(tenant, sha1))
        except MissingObject:
            raise BundleError(f"chunk {sha1} is gone; upload again",
                              detail={"chunk": sha1}) from None
        size += len(data)
        if size > MAX_UPLOAD_BYTES + HEADER_BYTES:
            raise UploadTooLarge(f"the artifact bundle is larger than {MAX_UPLOAD_BYTES} bytes")
        whole.update(data)
        view = memoryview(data)
        if len(header) < HEADER_BYTES:
            taken = HEADER_BYTES - len(header)
            header += bytes(view[:taken])
            view = view[taken:]
        out.write(view)
    if whole.hexdigest() != checksum:
        raise BundleChecksumMismatch(f"the chunks put together have SHA-1 {whole.hexdigest()}, "
                                     f"not {checksum}", detail={"checksum": checksum})
    check_header(header)
    out.seek(0)
