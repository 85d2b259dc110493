"""An upload from CI -> validated artifacts: each built JS file paired with its source map.

Pure: bytes in, :class:`UploadPlan` out, nothing stored. The whole upload is checked before
anything is written, so an invalid map fails the upload as a whole (400 naming the file).

- Files are named by their path relative to the build directory. A name is only ever a
  string (a URL path and a label): it is checked to be a clean relative path and never
  touches a filesystem.
- A JS file (``.js``, ``.mjs``, ``.cjs``) is paired with the map its
  ``//# sourceMappingURL=`` names (a relative path, or an inline ``data:`` map), else with
  ``<file>.map``. A map that no JS claims is kept under the URL of the JS it describes (its
  name without ``.map``) with a warning: without the minified JS, original function names
  cannot be recovered from scopes.
- Debug ids come from the JS's ``//# debugId=`` and from the map's ``debugId`` /
  ``debug_id``; the JS's wins when only it has one (a common bundler bug). Two different ids
  for one pair mean the pairing is wrong: an error.
- A map must be version 3 JSON with ``sources`` and ``mappings`` (and an ``ignoreList``, if
  any, of indexes into ``sources``), or an index map with no ``mappings`` of its own whose
  ``sections`` each embed such a map (``url`` sections and nested index maps are refused),
  in order, not overlapping, at offsets a map can hold. Its mappings are checked against
  ECMA-426 here (``symbolicate.mappings``: out-of-range running values are refused, not
  wrapped as ``symbolic`` would), then parsed by ``symbolic``, so a map that would fail at
  lookup fails at upload instead. A map the specification allows and ``symbolic`` refuses
  (long VLQs, offsets written ``1.0``) is accepted and given to ``symbolic`` rewritten
  (:func:`for_symbolic`).
- JSON nested deeper than the decoder's recursion limit is refused like any other
  unreadable map (400 naming the file).
"""

from __future__ import annotations

import base64
import binascii
import posixpath
import re
from typing import NamedTuple
from urllib.parse import unquote, urlsplit

import msgspec
from symbolic.exceptions import SymbolicError
from symbolic.sourcemap import SourceMapView

from core.errors import ApiError
from symbolicate.mappings import LIMIT, Extent, MappingsError
from symbolicate.mappings import check as check_mappings
from symbolicate.mappings import shorten as shorten_mappings

JS_SUFFIXES = (".js", ".mjs", ".cjs")
MAX_FILES = 900  # Litestar refuses forms of more than 1000 parts
MAX_FILE_BYTES = 64 << 20
MAX_UPLOAD_BYTES = 256 << 20
MAX_NAME_CHARS = 1024
MAX_RELEASE_CHARS = 200
DEFAULT_PREFIX = "~/"

_DEBUG_ID = re.compile(rb"//[#@] debugId=([0-9A-Za-z-]{1,64})[ \t]*(?:\r?\n|$)")
_UUID = re.compile(r"[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}")
_MAPPING_URL = (b"//# sourceMappingURL=", b"//@ sourceMappingURL=")
_INLINE = re.compile(r"data:application/json(?:;charset=[\w-]+)?;base64,", re.IGNORECASE)


class SourceMapError(ApiError):
    """A file of the upload is not a usable source map; nothing was stored."""

    status_code = 400
    code = "invalid_sourcemap"


class InvalidUpload(ApiError):
    """The upload's form is wrong (names, prefix, release, missing files)."""

    status_code = 400
    code = "invalid_upload"


class UploadTooLarge(ApiError):
    """Too many files, or a file or the whole upload too large."""

    status_code = 413
    code = "upload_too_large"


class UploadedFile(NamedTuple):
    name: str
    data: bytes


class Artifact(msgspec.Struct, frozen=True, kw_only=True):
    url: str  # where the JS is served, without query: "~/assets/app.js"
    name: str  # the JS file's name in the upload (what it would be when only the map came)
    map_name: str
    js: bytes | None  # None: the map came without its JS
    map: bytes
    debug_id: str | None
    sources_content: bool  # every source has its content (context lines)


class UploadWarning(msgspec.Struct, frozen=True, kw_only=True):
    file: str
    code: str  # "map_without_js", "missing_sources_content", "js_without_map", ...
    message: str


class UploadPlan(msgspec.Struct, frozen=True, kw_only=True):
    artifacts: list[Artifact]
    warnings: list[UploadWarning]


# --- the map's JSON, as much of it as is read ------------------------------------------------


class _Offset(msgspec.Struct, frozen=True):
    line: int | float  # ECMA-426: an integral Number, so 1.0 is line 1
    column: int | float


class _Section(msgspec.Struct, frozen=True):
    offset: _Offset
    map: msgspec.Raw = msgspec.Raw()  # empty: absent
    url: str | None = None


class _Map(msgspec.Struct, frozen=True, rename={"sources_content": "sourcesContent",
                                                "debug_id_camel": "debugId",
                                                "ignore_list": "ignoreList",
                                                "x_google_ignore_list": "x_google_ignoreList"}):
    version: int
    sources: list[str | None] | None = None
    # Indexes into sources (ECMA-426); x_google_ignoreList is the name Chrome read first and
    # some bundlers still write. Neither is used here, but an index that names no source
    # means the map does not describe this build: refused like any other invalid map.
    ignore_list: list[int] | None = None
    x_google_ignore_list: list[int] | None = None
    # Kept raw: only whether each source has its content is read here, and decoding tens of
    # MB of source text into str held the GIL (and the event loop) ~120 ms for a 50 MB map.
    sources_content: list[msgspec.Raw] | None = None
    names: list[str] | None = None
    mappings: str | None = None
    sections: list[_Section] | None = None
    file: str | None = None
    debug_id_camel: str | None = None
    debug_id: str | None = None


_map_decoder = msgspec.json.Decoder(_Map)


class _MapFacts(NamedTuple):
    sources_content: bool
    debug_id: str | None
    file: str | None


def _invalid(name: str, what: str) -> SourceMapError:
    return SourceMapError(f"{name}: invalid source map: {what}", detail={"file": name})


def _decode(name: str, data: bytes, where: str = "") -> _Map:
    try:
        raw = _map_decoder.decode(data)
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise SourceMapError(f"{name}: not a source map: {where}{exc}",
                             detail={"file": name}) from None
    except RecursionError:  # msgspec refuses (or skips) nesting deeper than Python's limit
        raise SourceMapError(f"{name}: not a source map: {where}JSON nested too deep",
                             detail={"file": name}) from None
    if raw.version != 3:
        raise SourceMapError(f"{name}: {where}source map version {raw.version}; only version "
                             "3 is supported", detail={"file": name})
    return raw


def _read_map(name: str, data: bytes) -> _MapFacts:
    """The map's facts, once its structure and mappings are checked against ECMA-426
    (``symbolicate.mappings``); an index map's sections must embed regular maps, in order,
    without overlapping, at positions a map can hold."""
    raw = _decode(name, data)
    debug_id = check_debug_id(name, raw.debug_id_camel or raw.debug_id)
    if raw.sections is None:
        return _MapFacts(_check_regular(name, raw)[0], debug_id, raw.file)
    if raw.mappings is not None:  # ECMA-426: an index map's mappings are its sections'
        raise _invalid(name, "an index map (with 'sections') must not have 'mappings'")
    content = True
    previous: tuple[int, int] | None = None  # the previous section's offset
    last: tuple[int, int] | None = None  # and its last mapping, where sections add up
    for index, section in enumerate(raw.sections):
        at = f"sections[{index}]"
        if not section.map:
            raise SourceMapError(
                f"{name}: index map section {index} refers to a map by url; embed the "
                "map in the section (sections[].map)", detail={"file": name})
        offset = (_position(name, f"{at}.offset.line", section.offset.line),
                  _position(name, f"{at}.offset.column", section.offset.column))
        if previous is not None and offset < previous:
            raise _invalid(name, f"{at} starts before sections[{index - 1}]: sections must "
                                 "be in order")
        if last is not None and offset <= last:
            raise _invalid(name, f"{at} starts at or before the last mapping of "
                                 f"sections[{index - 1}]: sections must not overlap")
        inner = _decode(name, bytes(section.map), f"{at}.map: ")
        if inner.sections is not None:
            raise _invalid(name, f"{at}.map is an index map; ECMA-426 sections embed regular "
                                 "maps (flatten it)")
        has_content, extent = _check_regular(name, inner, f"{at}.map: ")
        content &= has_content
        previous = offset
        if extent.end is not None:
            last = _shifted(name, at, offset, extent)
    return _MapFacts(content, debug_id, raw.file)


def _content_present(name: str, raw: msgspec.Raw) -> bool:
    """A ``sourcesContent`` entry is a string (True) or null (False)."""
    text = memoryview(raw)  # not bytes(raw): that would copy the whole source
    if text[:1].tobytes() == b'"':
        return True
    if len(text) == 4 and text.tobytes() == b"null":
        return False
    raise _invalid(name, "sourcesContent holds a value that is neither a string nor null")


def _check_regular(name: str, raw: _Map, where: str = "") -> tuple[bool, Extent]:
    """Whether every source has its content, and the extent of the mappings."""
    if raw.sources is None or raw.mappings is None:
        raise SourceMapError(f"{name}: {where}a source map needs 'sources' and 'mappings' "
                             "(or 'sections' for an index map)", detail={"file": name})
    try:
        extent = check_mappings(raw.mappings, len(raw.sources), len(raw.names or ()))
    except MappingsError as exc:
        raise _invalid(name, f"{where}{exc}") from None
    for field, indexes in (("ignoreList", raw.ignore_list),
                           ("x_google_ignoreList", raw.x_google_ignore_list)):
        wrong = next((i for i in indexes or () if not 0 <= i < len(raw.sources)), None)
        if wrong is not None:
            raise _invalid(name, f"{where}{field} holds {wrong}, not the index of one of "
                                 f"the {len(raw.sources)} sources")
    present = [_content_present(name, c) for c in raw.sources_content or ()]
    content = (raw.sources_content is not None and len(present) >= len(raw.sources)
               and all(present[: len(raw.sources)]))
    return content, extent


def _position(name: str, field: str, value: int | float) -> int:
    if isinstance(value, float):
        if not value.is_integer():
            raise _invalid(name, f"{field} {value} is not a position (an integer from 0 to "
                                 f"{LIMIT - 1})")
        value = int(value)
    if not 0 <= value < LIMIT:
        raise _invalid(name, f"{field} {value} is not a position (an integer from 0 to "
                             f"{LIMIT - 1})")
    return value


def _shifted(name: str, at: str, offset: tuple[int, int], extent: Extent) -> tuple[int, int]:
    """A section's last mapping where the index map puts it; the section must fit."""
    assert extent.end is not None
    line, column = offset[0] + extent.end[0], extent.end[1]
    if line >= LIMIT:
        raise _invalid(name, f"{at} maps generated line {line} (0-based): past what a "
                             "source map can hold")
    if extent.first_line_end >= 0 and offset[1] + extent.first_line_end >= LIMIT:
        raise _invalid(name, f"{at} maps generated column "
                             f"{offset[1] + extent.first_line_end} (0-based): past what a "
                             "source map can hold")
    return line, column + (offset[1] if extent.end[0] == 0 else 0)


def validate_map(name: str, data: bytes) -> _MapFacts:
    """Check ``data`` is a usable map: its structure and mappings against ECMA-426, then
    that ``symbolic`` parses it (as :func:`for_symbolic` gives it, where it refuses what
    the specification allows)."""
    facts = _read_map(name, data)
    try:
        SourceMapView.from_json_bytes(data)
    except SymbolicError as exc:
        try:
            SourceMapView.from_json_bytes(for_symbolic(data))
        except SymbolicError:
            raise _invalid(name, exc.message) from None
    return facts


def for_symbolic(data: bytes) -> bytes:
    """``data`` in the form ``symbolic`` 13.9 reads, for a valid map it refuses: VLQs
    shortened (it refuses more than 13 digits) and integral offsets as integers (it refuses
    ``1.0``). Meant for maps :func:`validate_map` accepted; ``data`` itself otherwise."""
    try:
        value = msgspec.json.decode(data)
    except (msgspec.DecodeError, RecursionError):
        return data
    if not isinstance(value, dict):
        return data
    parts: list[object] = [value]
    for section in value.get("sections") or ():
        if isinstance(section, dict):
            parts.append(section.get("map"))
            offset = section.get("offset")
            if isinstance(offset, dict):
                for key in ("line", "column"):
                    number = offset.get(key)
                    if isinstance(number, float) and number.is_integer():
                        offset[key] = int(number)
    for part in parts:
        if isinstance(part, dict) and isinstance(part.get("mappings"), str):
            try:
                part["mappings"] = shorten_mappings(part["mappings"])
            except MappingsError:
                return data
    return msgspec.json.encode(value)


def check_debug_id(name: str, value: str | None) -> str | None:
    if value is None:
        return None
    text = value.strip().lower()
    if not _UUID.fullmatch(text):
        raise SourceMapError(f"{name}: debug id {value[:64]!r} is not a UUID",
                             detail={"file": name})
    text = text.replace("-", "")
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


# --- names, prefixes, releases ---------------------------------------------------------------


def check_name(name: str) -> str:
    """``name`` if it is a clean relative path (``assets/app.js``), else a 400."""
    clean = name.replace("\\", "/")
    parts = clean.split("/")
    if (not clean or len(clean) > MAX_NAME_CHARS or clean.startswith("/") or "\0" in clean
            or any(p in ("", ".", "..") for p in parts) or not clean.isprintable()):
        raise InvalidUpload(f"file name {name[:200]!r} must be a path relative to the build "
                            "directory, like assets/app.js", detail={"file": name[:200]})
    return clean


def normalize_prefix(prefix: str | None) -> str:
    """``~/assets`` -> ``~/assets/``; ``/assets`` and ``assets`` mean the same;
    ``https://cdn.example.com/static`` stays a full URL prefix."""
    text = (prefix or "").strip() or DEFAULT_PREFIX
    if not text.isprintable():  # urlsplit drops tabs and newlines before it looks
        raise InvalidUpload(f"urlPrefix {text!r} holds a control character",
                            detail={"urlPrefix": text})
    if "://" in text:
        parts = urlsplit(text)
        try:
            parts.port  # noqa: B018  # raises for a port out of range
        except ValueError:
            parts = parts._replace(netloc="")
        if parts.scheme not in ("http", "https") or not parts.netloc or parts.query \
                or parts.fragment:
            raise InvalidUpload(f"urlPrefix {text!r} must be ~/path or http(s)://host/path, "
                                "without query or fragment", detail={"urlPrefix": text})
        return text.rstrip("/") + "/"
    path = text[1:] if text.startswith("~") else text
    path = "/" + path.strip("/")
    if any(p in (".", "..") for p in path.split("/")) or "?" in path or "#" in path:
        raise InvalidUpload(f"urlPrefix {text!r} must be like ~/assets",
                            detail={"urlPrefix": text})
    return "~" + path.rstrip("/") + "/"


def check_release(release: str | None) -> str:
    text = (release or "").strip()
    if len(text) > MAX_RELEASE_CHARS or not text.isprintable():
        raise InvalidUpload(f"release must be at most {MAX_RELEASE_CHARS} printable "
                            "characters", detail={"field": "release"})
    return text


# --- pairing ---------------------------------------------------------------------------------


def _mapping_url(js: bytes) -> str | None:
    """The last ``//# sourceMappingURL=`` comment's value (bundlers put it at the end)."""
    at = max(js.rfind(marker) for marker in _MAPPING_URL)
    if at < 0:
        return None
    start = at + len(_MAPPING_URL[0])
    end = js.find(b"\n", start)
    value = js[start: end if end >= 0 else len(js)].strip()
    return value.decode("utf-8", "replace") or None


def _js_debug_id(name: str, js: bytes) -> str | None:
    tail = js[-4096:]
    matches = list(_DEBUG_ID.finditer(tail))
    return check_debug_id(name, matches[-1].group(1).decode()) if matches else None


def _inline_map(name: str, url: str) -> bytes | None:
    match = _INLINE.match(url)
    if match is None:
        return None
    try:
        return base64.b64decode(url[match.end():], validate=True)
    except (binascii.Error, ValueError):
        raise SourceMapError(f"{name}: its inline source map is not valid base64",
                             detail={"file": name}) from None


def plan_upload(files: list[UploadedFile], url_prefix: str | None) -> UploadPlan:
    prefix = normalize_prefix(url_prefix)
    if len(files) > MAX_FILES:
        raise UploadTooLarge(f"{len(files)} files in one upload; at most {MAX_FILES}")
    by_name: dict[str, bytes] = {}
    for file in files:
        name = check_name(file.name)
        if len(file.data) > MAX_FILE_BYTES:
            raise UploadTooLarge(f"{name}: {len(file.data)} bytes; at most {MAX_FILE_BYTES}",
                                 detail={"file": name})
        if name in by_name:
            raise InvalidUpload(f"{name} is in the upload twice", detail={"file": name})
        by_name[name] = file.data
    maps = {n: d for n, d in by_name.items() if n.endswith(".map")}
    scripts = {n: d for n, d in by_name.items() if n.endswith(JS_SUFFIXES)}
    if not maps:
        raise InvalidUpload("the upload has no .map file; build with source maps on "
                            "(esbuild --sourcemap, rollup output.sourcemap, ...)")
    warnings: list[UploadWarning] = []
    artifacts: list[Artifact] = []
    claimed: set[str] = set()
    for name, js in sorted(scripts.items()):
        map_name, map_bytes = _find_map(name, js, maps)
        if map_bytes is None:
            warnings.append(UploadWarning(
                file=name, code="js_without_map",
                message=f"{name}: no source map found (no sourceMappingURL naming an uploaded "
                        f"map, no {name}.map); its frames stay minified"))
            continue
        claimed.add(map_name)
        artifacts.append(_artifact(name, js, map_name, map_bytes, prefix, warnings))
    for map_name, map_bytes in sorted(maps.items()):
        if map_name in claimed:
            continue
        facts = validate_map(map_name, map_bytes)
        name = map_name[: -len(".map")]
        if not name.endswith(JS_SUFFIXES) and facts.file:  # "app.map" with "file": "app.js"
            name = posixpath.join(posixpath.dirname(name), posixpath.basename(facts.file))
        warnings.append(UploadWarning(
            file=map_name, code="map_without_js",
            message=f"{map_name}: uploaded without its JS ({name}): " + (
                "function names come from its sourcesContent; upload the .js files too "
                "(their debug ids)" if facts.sources_content else
                "frames get files and lines but no function names (no sourcesContent "
                "either); upload the .js files too")))
        artifacts.append(_artifact(name, None, map_name, map_bytes, prefix, warnings, facts))
    urls = [a.url for a in artifacts]
    if len(set(urls)) != len(urls):
        dupe = next(u for u in urls if urls.count(u) > 1)
        raise InvalidUpload(f"two files would be served at {dupe}", detail={"url": dupe})
    return UploadPlan(artifacts=artifacts, warnings=warnings)


def _find_map(name: str, js: bytes, maps: dict[str, bytes]) -> tuple[str, bytes | None]:
    url = _mapping_url(js)
    if url is not None:
        inline = _inline_map(name, url)
        if inline is not None:
            return f"{name} (inline map)", inline
        path = unquote(urlsplit(url).path)
        if path and "://" not in url and not path.startswith("/"):
            wanted = posixpath.normpath(posixpath.join(posixpath.dirname(name), path))
            if wanted in maps:
                return wanted, maps[wanted]
        elif path and posixpath.basename(path):  # absolute: try beside the JS
            beside = posixpath.join(posixpath.dirname(name), posixpath.basename(path))
            if beside in maps:
                return beside, maps[beside]
    fallback = name + ".map"
    return fallback, maps.get(fallback)


def _artifact(name: str, js: bytes | None, map_name: str, map_bytes: bytes, prefix: str,
              warnings: list[UploadWarning], facts: _MapFacts | None = None) -> Artifact:
    facts = facts or validate_map(map_name, map_bytes)
    debug_id = facts.debug_id
    if js is not None:
        js_id = _js_debug_id(name, js)
        if js_id and debug_id and js_id != debug_id:
            raise SourceMapError(
                f"{name} has debug id {js_id} but its map {map_name} has {debug_id}: "
                "they are not from the same build", detail={"file": map_name})
        debug_id = js_id or debug_id
    if not facts.sources_content:
        warnings.append(UploadWarning(
            file=map_name, code="missing_sources_content",
            message=f"{map_name}: no sourcesContent: frames get files, lines and functions "
                    "but no context lines (esbuild: --sources-content=true)"))
    return Artifact(url=prefix + name, name=name, map_name=map_name, js=js, map=map_bytes,
                    debug_id=debug_id, sources_content=facts.sources_content)
