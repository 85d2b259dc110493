"""What the API returns, as msgspec Structs (fields the server adds later are ignored)."""

from __future__ import annotations

import msgspec

Scalar = str | int | float | bool | None


class ErrorInfo(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    type: str | None = None
    message: str | None = None
    stack: str | None = None


class Row(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """A log row (``/logs``, a tail's ``event: log``)."""

    id: str
    ts: str
    level: str
    message: str
    box_id: str | None = None
    url: str | None = None
    session_id: str | None = None
    release: str | None = None
    attrs: dict[str, Scalar] = {}
    error: ErrorInfo | None = None
    truncated: list[str] | None = None
    problem: str | None = None  # a stored value no reader could decode (rawAttrs kept)
    raw_attrs: str | None = None


class Frame(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    function: str | None = None
    file: str | None = None
    line: int | None = None
    column: int | None = None
    context_line: str | None = None
    raw: str = ""
    symbolicated: bool = False
    problem: str | None = None


class ErrorDetail(ErrorInfo, frozen=True, kw_only=True, rename="camel"):
    frames: list[Frame] = []


class ErrorRow(Row, frozen=True, kw_only=True, rename="camel"):
    """An error row (``/errors``): its frames rewritten by the uploaded source maps."""

    error: ErrorDetail | None = None
    fingerprint: str = ""


class UsageRow(msgspec.Struct, frozen=True, kw_only=True):
    """A usage quantity in the platform's shape (``/v1/usage``)."""

    tenant: str
    project: str | None
    box: str | None
    kind: str
    quantity: int
    unit: str
    cost_usd: float
    credits: float
    at: str
    source: str | None
    reason: str | None


class UploadedFile(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    url: str
    name: str
    map_name: str
    has_js: bool
    sources_content: bool
    debug_id: str | None = None


class UploadWarning(msgspec.Struct, frozen=True):
    file: str
    code: str
    message: str


class Uploaded(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """What an upload stored (all its files, or none: then an error)."""

    release: str | None
    url_prefix: str
    files: list[UploadedFile]
    warnings: list[UploadWarning]
