"""A Sentry artifact bundle -> the files of an upload -> an :class:`UploadPlan`.

The bundle is what ``sentry-cli sourcemaps upload`` builds (symbolic's ``SourceBundleWriter``):
an 8-byte header, ``SYSB`` and a little-endian u32 version (2), then a ZIP holding
``manifest.json`` and the files. The manifest maps each member to its ``type``
(``minified_source`` for every JS file, ``source_map``), its ``url`` (``~/main.js``: the
``--url-prefix``, default ``~``, and the path under the uploaded directory) and its
``headers`` (``debug-id``; ``sourcemap``, the map sentry-cli found for a JS file).

The ZIP is read in place with :mod:`zipfile` from a file, never extracted: member names are
the uploader's and never become paths (names that would, absolute or with ``..``, are refused
all the same). Bounds before anything is read: the central directory's entry count and size
from its end record (``zipfile`` would build an object per entry of a lying directory),
members stored or deflated and not encrypted, each at most ``MAX_FILE_BYTES`` and together
at most ``MAX_UPLOAD_BYTES`` once inflated, reads capped at those sizes whatever a member
claims. Files then go through the same validation as a multipart upload
(:func:`symbolicate.sourcemaps.plan_upload`): a file is named by its URL's path, the URL's
start (``~/`` or ``https://host/``) is the upload's prefix.
"""

from __future__ import annotations

import struct
import zipfile
import zlib
from typing import BinaryIO, NamedTuple
from urllib.parse import urlsplit

import msgspec

from core.errors import ApiError
from symbolicate.sourcemaps import (
    MAX_FILE_BYTES,
    MAX_FILES,
    MAX_UPLOAD_BYTES,
    InvalidUpload,
    UploadedFile,
    UploadPlan,
    UploadTooLarge,
    check_debug_id,
    plan_upload,
)

MAGIC = b"SYSB"
VERSIONS = (1, 2)  # symbolic writes 2
HEADER_BYTES = 8
MANIFEST = "manifest.json"
MAX_MEMBERS = MAX_FILES + 1  # the files and the manifest
# Per entry: 46 fixed bytes, the name (MAX_NAME_CHARS in plan_upload), extra and comment.
MAX_DIRECTORY_BYTES = MAX_MEMBERS * (46 + 1024 + 512)
KEPT_TYPES = ("minified_source", "source", "source_map")
_END = struct.Struct("<4s4H2LH")  # end of central directory record
_END64_LOCATOR = struct.Struct("<4sLQL")
_END64 = struct.Struct("<4sQ2H2L4Q")


class BundleError(ApiError):
    """The artifact bundle cannot be read: not a bundle, a bad ZIP or manifest."""

    status_code = 400
    code = "invalid_bundle"


class BundleFile(NamedTuple):
    url: str
    type: str
    debug_id: str | None  # the manifest's ``debug-id`` header
    data: bytes


class _Entry(msgspec.Struct, frozen=True):
    type: str = ""
    url: str = ""
    headers: dict[str, str] = {}


class _Manifest(msgspec.Struct, frozen=True):
    files: dict[str, _Entry] = {}


_manifest_decoder = msgspec.json.Decoder(_Manifest)


def check_header(header: bytes) -> None:
    """The bundle's first :data:`HEADER_BYTES`: ``SYSB`` and a known version."""
    if len(header) < HEADER_BYTES or header[:4] != MAGIC:
        raise BundleError("not an artifact bundle: it does not start with SYSB "
                          "(upload with sentry-cli sourcemaps upload)")
    version = int.from_bytes(header[4:8], "little")
    if version not in VERSIONS:
        raise BundleError(f"artifact bundle version {version} is not supported (1 or 2)",
                          detail={"version": version})


def read_bundle(zip_file: BinaryIO) -> list[BundleFile]:
    """The JS files and maps the manifest of the ZIP in ``zip_file`` lists (the bundle
    without its header), each read within the limits."""
    _check_directory(zip_file)
    try:
        archive = zipfile.ZipFile(zip_file)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, OSError, EOFError) as exc:
        raise BundleError(f"the artifact bundle is not a readable ZIP: {exc}") from None
    with archive:
        members = _members(archive)
        manifest = _read_manifest(archive, members)
        files = []
        budget = MAX_UPLOAD_BYTES
        for path, entry in sorted(manifest.files.items()):
            if entry.type not in KEPT_TYPES:
                continue  # RAM bundles and other kinds: nothing boxtrail reads
            info = members.get(path)
            if info is None:
                raise BundleError(f"manifest.json lists {path[:200]!r}, which is not in the "
                                  "bundle", detail={"file": path[:200]})
            data = _read(archive, info, min(MAX_FILE_BYTES, budget))
            budget -= len(data)
            headers = {k.lower(): v for k, v in entry.headers.items()}
            debug_id = headers.get("debug-id")
            files.append(BundleFile(url=entry.url, type=entry.type, data=data,
                                    debug_id=check_debug_id(entry.url, debug_id)
                                    if debug_id else None))
    return files


def _check_directory(zip_file: BinaryIO) -> None:
    """Refuse a central directory of more than :data:`MAX_MEMBERS` entries or
    :data:`MAX_DIRECTORY_BYTES`, from its end record, found as ``zipfile`` finds it."""
    size = zip_file.seek(0, 2)
    tail_start = max(0, size - (_END.size + 0xFFFF))
    zip_file.seek(tail_start)
    tail = zip_file.read()
    at = len(tail) - _END.size
    if at < 0 or tail[at:at + 4] != b"PK\x05\x06" or tail[-2:] != b"\0\0":
        at = tail.rfind(b"PK\x05\x06")
    if at < 0 or len(tail) - at < _END.size:
        raise BundleError("the artifact bundle is not a ZIP (no end of central directory)")
    _, _, _, _, entries, directory, _, _ = _END.unpack_from(tail, at)
    if entries == 0xFFFF or directory == 0xFFFFFFFF:  # ZIP64: the counts are further back
        locator = at - _END64_LOCATOR.size
        if locator < 0 or tail[locator:locator + 4] != b"PK\x06\x07":
            raise BundleError("the artifact bundle is not a readable ZIP (no ZIP64 locator)")
        offset = _END64_LOCATOR.unpack_from(tail, locator)[2]
        zip_file.seek(offset)
        record = zip_file.read(_END64.size)
        if len(record) < _END64.size or record[:4] != b"PK\x06\x06":
            raise BundleError("the artifact bundle is not a readable ZIP (bad ZIP64 record)")
        entries, directory = _END64.unpack(record)[7:9]
    if entries > MAX_MEMBERS or directory > MAX_DIRECTORY_BYTES:
        raise BundleError(f"the artifact bundle has {entries} members; at most {MAX_MEMBERS}",
                          detail={"members": entries, "limit": MAX_MEMBERS})
    zip_file.seek(0)


def _members(archive: zipfile.ZipFile) -> dict[str, zipfile.ZipInfo]:
    infos = archive.infolist()
    if len(infos) > MAX_MEMBERS:
        raise BundleError(f"the artifact bundle has {len(infos)} members; at most "
                          f"{MAX_MEMBERS}", detail={"members": len(infos), "limit": MAX_MEMBERS})
    members: dict[str, zipfile.ZipInfo] = {}
    declared = 0
    for info in infos:
        name = info.filename
        _check_member_name(name)
        if name in members:
            raise BundleError(f"{name[:200]!r} is in the bundle twice",
                              detail={"file": name[:200]})
        if info.flag_bits & 0x1:
            raise BundleError(f"{name[:200]}: encrypted members are not read",
                              detail={"file": name[:200]})
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise BundleError(f"{name[:200]}: compression method {info.compress_type}; only "
                              "stored and deflated members are read",
                              detail={"file": name[:200]})
        if info.file_size > MAX_FILE_BYTES:
            raise UploadTooLarge(f"{name[:200]}: {info.file_size} bytes; at most "
                                 f"{MAX_FILE_BYTES}", detail={"file": name[:200]})
        declared += info.file_size
        if declared > MAX_UPLOAD_BYTES:
            raise UploadTooLarge(f"the artifact bundle holds more than {MAX_UPLOAD_BYTES} "
                                 "bytes of files")
        members[name] = info
    return members


def _check_member_name(name: str) -> None:
    segments = name.split("/")
    if (not name or name.startswith("/") or "\\" in name or "\0" in name
            or (len(name) > 1 and name[1] == ":")
            or any(s in (".", "..") for s in segments) or not name.isprintable()):
        raise BundleError(f"the artifact bundle has a member named {name[:200]!r}: names must "
                          "be relative paths without '..'", detail={"file": name[:200]})


def _read_manifest(archive: zipfile.ZipFile, members: dict[str, zipfile.ZipInfo]) -> _Manifest:
    info = members.get(MANIFEST)
    if info is None:
        raise BundleError("the artifact bundle has no manifest.json")
    data = _read(archive, info, MAX_FILE_BYTES)
    try:
        return _manifest_decoder.decode(data)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise BundleError(f"manifest.json is not a bundle manifest: {exc}",
                          detail={"file": MANIFEST}) from None


def _read(archive: zipfile.ZipFile, info: zipfile.ZipInfo, limit: int) -> bytes:
    """The member's bytes, at most ``limit`` of them whatever its header claims (zipfile
    stops at the declared size and checks the CRC, so a lying size fails here)."""
    name = info.filename[:200]
    try:
        with archive.open(info) as member:
            data = member.read(limit + 1)
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError,
            NotImplementedError, RuntimeError) as exc:
        raise BundleError(f"{name}: cannot be read from the bundle: {exc}",
                          detail={"file": name}) from None
    if len(data) > limit:
        raise UploadTooLarge(f"{name}: more than {limit} bytes once inflated",
                             detail={"file": name})
    return data


# --- the files as an upload ---------------------------------------------------------------


def _split_url(url: str) -> tuple[str, str]:
    """``~/a/b.js`` -> (``~/``, ``a/b.js``); ``https://cdn.test/a.js`` -> (``https://cdn.test/``,
    ``a.js``). The name is checked by ``plan_upload``."""
    if not url.isprintable():  # urlsplit drops tabs and newlines before it looks
        raise BundleError(f"manifest.json: url {url[:200]!r} holds a control character",
                          detail={"url": url[:200]})
    if url.startswith("~/"):
        prefix, name = "~/", url[2:]
    else:
        try:
            parts = urlsplit(url)
        except ValueError:
            parts = None
        if parts is None or parts.scheme not in ("http", "https") or not parts.netloc:
            raise BundleError(f"manifest.json: url {url[:200]!r} is neither ~/path nor "
                              "http(s)://host/path", detail={"url": url[:200]})
        prefix, name = f"{parts.scheme}://{parts.netloc}/", url[len(parts.scheme) + 3
                                                                + len(parts.netloc):]
    if "?" in name or "#" in name:
        raise BundleError(f"manifest.json: url {url[:200]!r} has a query or fragment "
                          "(--url-suffix); frames are matched without them",
                          detail={"url": url[:200]})
    return prefix, name.lstrip("/")


def plan_bundle(files: list[BundleFile]) -> UploadPlan:
    """``files`` validated as an upload: grouped by URL prefix (sentry-cli uses one), each
    group through ``plan_upload``; the manifest's ``debug-id`` fills in an artifact's id
    where its files carry none (``--debug-id-reference``)."""
    groups: dict[str, list[UploadedFile]] = {}
    ids: dict[str, str] = {}
    for file in files:
        prefix, name = _split_url(file.url)
        groups.setdefault(prefix, []).append(UploadedFile(name, file.data))
        if file.debug_id:
            ids[prefix + name] = file.debug_id
    if not groups:
        raise InvalidUpload("the artifact bundle holds no JS files or source maps")
    artifacts, warnings = [], []
    for prefix, group in sorted(groups.items()):
        plan = plan_upload(group, prefix)
        warnings += plan.warnings
        for artifact in plan.artifacts:
            debug_id = (artifact.debug_id or ids.get(artifact.url)
                        or ids.get(prefix + artifact.map_name))
            artifacts.append(msgspec.structs.replace(artifact, debug_id=debug_id))
    return UploadPlan(artifacts=artifacts, warnings=warnings)

