"""``POST /api/{id}/envelope/`` and ``/api/{id}/store/``: Sentry's SDKs sending to boxtrail.

A project's DSN is ``http(s)://<sentryKey>@<host>/<sentryId>`` (``tenancy.tenants``; the
project JSON carries it). The key comes from ``?sentry_key=`` (what the browser SDK sends)
or the ``X-Sentry-Auth`` / ``Authorization: Sentry sentry_key=...`` header; the path's
project (the DSN's id, or the project's id or name) must be that key's. Then the same
checks as ``POST /v1/ingest``, in the same order and with the same error shape and CORS
headers: origin, encoding (gzip, deflate, br), size,
rows per request, box id from ``Origin``, rate limit, per-row validation, and the answer
only once the rows are durable in the WAL: ``200 {"id": "<event id>"}``, as Sentry answers.
A 429 carries ``Retry-After`` and ``X-Sentry-Rate-Limits``, which the SDKs obey.

What an envelope's items become is ``ingest.envelope``'s business; every item is counted
by type and outcome in ``boxtrail_sentry_items_total``.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator, Mapping
from urllib.parse import parse_qsl

import msgspec

from core.errors import ApiError
from core.metrics import Registry
from ingest.body import inflate, inflate_brotli, inflate_zlib
from ingest.envelope import BrokenItem, Converted, add_event, read_object, split, to_events
from ingest.errors import InvalidBody, ProjectMismatch, UnknownIngestKey
from ingest.events import BatchBuilder, Limits
from ingest.intake import Intake, Seen, cors, preflight_headers
from tenancy.tenants import Project, Tenancy

PATH = re.compile(r"/api/([^/]{1,64})/(envelope|store)/?")
ALLOW_HEADERS = ("Content-Type, Content-Encoding, X-Sentry-Auth, Authorization, "
                 "sentry-trace, baggage")
EXPOSE_HEADERS = "X-Sentry-Rate-Limits, X-Sentry-Error, Retry-After"
_AUTH_PAIR = re.compile(r"(\w+)\s*=\s*([^,\s]*)")


class Answer(msgspec.Struct, frozen=True):
    id: str


_encode = msgspec.json.Encoder().encode
# What Sentry's SDKs send: gzip, and deflate and brotli from other SDKs; zstd is refused.
_INFLATERS = {"identity": None, "": None, "gzip": inflate, "x-gzip": inflate,
              "deflate": inflate_zlib, "br": inflate_brotli}


def sentry_key(query: str, headers: Mapping[str, str]) -> str:
    """The DSN's public key: ``?sentry_key=``, else the auth header's ``sentry_key``."""
    if query:
        for name, value in parse_qsl(query):
            if name == "sentry_key":
                return value
    for header in ("x-sentry-auth", "authorization"):
        text = headers.get(header, "")
        if text[:7].lower() == "sentry ":
            for name, value in _AUTH_PAIR.findall(text[7:]):
                if name == "sentry_key":
                    return str(value)
    return ""


class SentryEndpoint:
    def __init__(self, intake: Intake, tenancy: Tenancy, metrics: Registry) -> None:
        self.intake = intake
        self.tenancy = tenancy
        self.m_items = metrics.counter(
            "boxtrail_sentry_items_total",
            "Sentry envelope items by type and outcome (stored, dropped: accepted, not kept; "
            "invalid: unreadable)", ("type", "outcome"))

    def project(self, project_ref: str, query: str, headers: Mapping[str, str],
                seen: Seen | None = None) -> Project:
        """The project the DSN's key names, from an origin it allows (``Intake.admit``);
        the path's project must be it."""
        key = sentry_key(query, headers)
        project = self.tenancy.project_by_ingest_key(key) if key else None
        # The DSN's numeric id; the project's id or name are taken too (the key decides).
        if project is not None and project_ref not in (str(project.sentry_id), project.id,
                                                       project.name):
            raise ProjectMismatch(f"this DSN's key is not for project {project_ref[:64]!r}")
        return self.intake.admit(project, headers.get("origin"), _unknown_key, seen)

    def preflight(self, project_ref: str, query: str, headers: Mapping[str, str]
                  ) -> tuple[int, bytes, dict[str, str]]:
        """``OPTIONS``: the browser's CORS preflight (keyed by ``?sentry_key=``, as the SDK's
        URL carries it; an unknown key or origin is refused like the POST would be)."""
        origin = headers.get("origin")
        try:
            self.project(project_ref, query, headers)
        except ApiError as exc:
            return (exc.status_code, _encode(exc.envelope()),
                    exc.headers | cors(origin, EXPOSE_HEADERS))
        return 204, b"", preflight_headers(origin, EXPOSE_HEADERS, ALLOW_HEADERS)

    async def process(self, project_ref: str, kind: str, query: str,
                      headers: Mapping[str, str], chunks: AsyncIterator[bytes]
                      ) -> tuple[int, bytes, dict[str, str]]:
        """One envelope (``kind`` "envelope") or legacy event ("store"): status, body and
        headers, errors included. The steps are the intake's (``ingest.intake``); the wire
        format is Sentry's (``ingest.envelope``)."""
        intake = self.intake
        origin = headers.get("origin")
        rows = 0
        seen = Seen(kind)
        try:
            project = self.project(project_ref, query, headers, seen)
            raw = await intake.read(headers, chunks, _INFLATERS, seen)
            converted = self._convert(kind, raw, intake.config.max_events_per_request,
                                      intake.limits)
            rows = converted.rows
            seen.discarded = converted.discarded
            intake.count(rows, "rows")
            box = intake.box(origin, converted.box_id, seen, strict=False)

            def fill(builder: BatchBuilder) -> None:
                add(builder, converted)

            key = sentry_key(query, headers)
            rate = self.tenancy.rate_limit_of(key) if key else None
            batch, builder = await intake.store(
                project, rows, box, converted.context(), fill, seen, _rate_limited,
                key_limit=None if rate is None or key is None else (key, rate))
        except ApiError as exc:
            return await intake.refused(exc, rows, cors(origin, EXPOSE_HEADERS), seen)
        intake.counted(batch, builder)
        self._count(converted, len(builder.rejected))
        event_id = converted.event_id or uuid.uuid4().hex
        return 200, _encode(Answer(event_id[:64])), cors(origin, EXPOSE_HEADERS)

    @staticmethod
    def _convert(kind: str, raw: bytes, max_rows: int, limits: Limits | None = None
                 ) -> Converted:
        """The envelope's (or store event's) rows; without ``limits``, by the Python path
        alone (``to_events``)."""
        if kind == "store":
            converted = Converted()
            try:
                event = read_object(raw)
            except BrokenItem:
                raise InvalidBody("the event is not a JSON object") from None
            add_event(converted, event)
            return converted
        header, items = split(raw)
        return to_events(header, items, max_rows, limits)

    def _count(self, converted: Converted, rejected: int) -> None:
        for kind, count in converted.stored.items():
            self.m_items.inc(count, kind, "stored")
        if rejected:
            self.m_items.inc(rejected, "row", "invalid")
        for kind in converted.dropped:
            if kind.startswith("invalid_"):
                self.m_items.inc(1, kind[len("invalid_"):], "invalid")
            else:
                self.m_items.inc(1, kind[:32] if kind.isidentifier() else "other", "dropped")


def add(builder: BatchBuilder, converted: Converted) -> None:
    """An envelope's rows added to the batch: the core's columns as they are when the
    batch takes their timestamps, else its events by the Python path."""
    if converted.columns is not None:
        if builder.add_columns(converted.columns):
            return
        converted.python_rows()
    if converted.frames:
        for index, event in enumerate(converted.events):
            builder.add(index, event, converted.frames.get(index))
    else:  # log lines, messages: the column-wise path when every row is valid
        builder.add_all(converted.events)


def _unknown_key() -> UnknownIngestKey:
    return UnknownIngestKey("unknown Sentry key: use the project's DSN (its `dsn` in "
                            "GET /v1/projects/{project})")


def _rate_limited(seconds: int) -> dict[str, str]:
    """Sentry's SDKs back off by ``X-Sentry-Rate-Limits``."""
    return {"Retry-After": str(seconds), "X-Sentry-Rate-Limits": f"{seconds}::project"}
