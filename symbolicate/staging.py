"""An upload between the request and the index: its form read, validated and its bytes stored.

The server writes the request body to a file as it arrives (``symbolicate.routes``); a
worker process (``core.workers``) reads the multipart form from it, validates every map
(``symbolicate.sourcemaps``) and writes the blobs (``ArtifactStore.put_blobs``): seconds of
Python for hundreds of MB, none of it on the server's GIL. The server then indexes what
:func:`stage_upload` returns in one transaction.
"""

from __future__ import annotations

import msgspec
from multipart import (  # type: ignore[import-untyped]
    MultipartSegment,
    ParserError,
    ParserLimitReached,
    PushMultipartParser,
)

from symbolicate.artifacts import ArtifactRow, Blobs
from symbolicate.side import SymbolicateSide
from symbolicate.sourcemaps import (
    MAX_FILE_BYTES,
    MAX_FILES,
    InvalidUpload,
    UploadedFile,
    UploadTooLarge,
    UploadWarning,
    check_release,
    normalize_prefix,
    plan_upload,
)

FIELDS = ("release", "urlPrefix")
MAX_FIELD_BYTES = 4096
READ_BYTES = 1 << 20


class Staged(msgspec.Struct, frozen=True, kw_only=True):
    release: str
    url_prefix: str
    files: list[Blobs]
    warnings: list[UploadWarning]


def stage_upload(side: SymbolicateSide, project_id: str, path: str, boundary: str) -> Staged:
    """In a worker: the upload whose body is at ``path``, validated and its blobs stored.
    Raises the upload's 400 or 413 (``symbolicate.sourcemaps``) when it is refused."""
    fields, files = read_form(path, boundary)
    release = check_release(fields.get("release"))
    prefix = normalize_prefix(fields.get("urlPrefix"))
    plan = plan_upload(files, prefix)
    return Staged(release=release, url_prefix=prefix,
                  files=side.store.put_blobs(project_id, plan), warnings=plan.warnings)


def read_form(path: str, boundary: str) -> tuple[dict[str, str], list[UploadedFile]]:
    """The form's ``release`` and ``urlPrefix`` fields and its ``file`` parts; other parts
    are ignored, as a form handler does."""
    fields: dict[str, str] = {}
    files: list[UploadedFile] = []
    segment: MultipartSegment | None = None
    chunks: list[bytes] = []
    try:
        with open(path, "rb") as body, PushMultipartParser(
                boundary, max_segment_count=MAX_FILES + len(FIELDS) + 1) as parser:
            while not parser.closed:
                chunk = body.read(READ_BYTES)  # b"" at the end: the parser checks it is one
                for event in parser.parse(chunk):
                    if isinstance(event, MultipartSegment):
                        segment, chunks = event, []
                        if event.name == "file" and event.filename is None:
                            raise InvalidUpload("a `file` part without a filename: send "
                                                "each file with its path as the filename")
                    elif event:
                        assert segment is not None
                        _check_size(segment)
                        chunks.append(event)
                    elif segment is not None:  # the end of this part
                        _keep(segment, b"".join(chunks), fields, files)
                        segment, chunks = None, []
                if not chunk:
                    break
    except ParserLimitReached:
        raise UploadTooLarge(f"more than {MAX_FILES} parts (files and fields) in one upload"
                             ) from None
    except ParserError as exc:
        # Its first argument says what (a tuple's repr with the inner exception did not).
        what = exc.args[0] if exc.args and isinstance(exc.args[0], str) else type(exc).__name__
        raise InvalidUpload(f"the multipart/form-data body cannot be read: {what}") from None
    return fields, files


def _check_size(segment: MultipartSegment) -> None:
    if segment.filename is not None and segment.bytes_received > MAX_FILE_BYTES:
        raise UploadTooLarge(f"{segment.filename}: larger than {MAX_FILE_BYTES} bytes",
                             detail={"file": segment.filename})
    if segment.filename is None and segment.bytes_received > MAX_FIELD_BYTES:
        raise InvalidUpload(f"form field {segment.name!r} is longer than {MAX_FIELD_BYTES} "
                            "bytes")


def _keep(segment: MultipartSegment, data: bytes, fields: dict[str, str],
          files: list[UploadedFile]) -> None:
    if segment.name == "file":
        assert segment.filename is not None  # checked at its header
        files.append(UploadedFile(segment.filename, data))
    elif segment.name in FIELDS and segment.filename is None:
        if segment.name in fields:
            raise InvalidUpload(f"form field {segment.name!r} is given twice")
        try:
            fields[segment.name] = data.decode()
        except UnicodeDecodeError:
            raise InvalidUpload(f"form field {segment.name!r} is not UTF-8") from None


def prebuild_job(side: SymbolicateSide, project_id: str, rows: list[ArtifactRow]) -> None:
    """In a worker: build a fresh upload's lookups now, so the first error read after a
    deploy finds them built (``Symbolicator.prebuild``); the upload answers after it."""
    side.symbolicator.build_all(project_id, rows)
