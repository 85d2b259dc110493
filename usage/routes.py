"""``GET /v1/usage`` (the tenant's usage, in the platform's shape, priced) and
``GET /v1/projects/{project}/outcomes`` (what happened to a project's events: accepted,
refused by reason, discarded by its SDKs)."""

from __future__ import annotations

import asyncio
import re
import time
from typing import Annotated

import msgspec
from litestar import Router, get
from litestar.params import FromQuery, QueryParameter

from core.errors import InvalidParameter
from core.openapi import error_responses
from core.usage import KINDS, UNITS
from ingest.origin import BOX_ID
from query.since import DURATION, ISO_8601, TIME_PATTERN, parse_since, parse_until
from tenancy.guard import Tenant, TenantProject, scope
from tenancy.keys import READ, USAGE_READ
from tenancy.tenants import Tenancy
from usage.sink import Pricing, iso
from usage.store import GROUPS, UsageStore

MAX_LIMIT = 10_000
_ALL_GROUPS = ",".join(GROUPS)
INTERVALS = {"minute": 60, "hour": 3600, "day": 86_400}
_OUTCOME_KINDS = ("ingest.events", "refused.events", "client_discard.events",
                  "ingest.requests", "refused.requests")

Since = Annotated[str, QueryParameter(schema_extra={"pattern": TIME_PATTERN})]
Until = Annotated[str, QueryParameter(schema_extra={"pattern": f"^(?:{DURATION}|{ISO_8601})?$"})]
Interval = Annotated[str, QueryParameter(schema_extra={"enum": list(INTERVALS)})]
Limit = Annotated[int, QueryParameter(schema_extra={"minimum": 1, "maximum": MAX_LIMIT})]
_KIND_LIST = f"^(?:(?:{'|'.join(k.replace('.', '[.]') for k in KINDS)})(?:,|$))*$"
KindList = Annotated[str, QueryParameter(schema_extra={"pattern": _KIND_LIST})]
# ``kind`` may be named too: rows are always per kind (their units differ).
_GROUP_LIST = f"^(?:(?:{'|'.join((*GROUPS, 'kind'))})(?:,|$))*$"
GroupBy = Annotated[str, QueryParameter(name="groupBy", schema_extra={"pattern": _GROUP_LIST})]
Cursor = Annotated[str, QueryParameter(schema_extra={"pattern": "^[0-9]{0,9}$"})]
Box = Annotated[str, QueryParameter(schema_extra={"pattern": f"^$|^{BOX_ID.pattern}$"})]


class UsageRow(msgspec.Struct, frozen=True, kw_only=True):
    """One quantity in the platform's shape; a dimension left out of ``groupBy`` is null
    (summed over)."""

    tenant: str
    project: str | None
    box: str | None
    kind: str
    quantity: int
    unit: str
    cost_usd: float
    credits: float
    at: str  # the bucket's start, UTC
    source: str | None
    reason: str | None


class UsagePage(msgspec.Struct, frozen=True, rename="camel"):
    rows: list[UsageRow]
    next_cursor: str | None


class Outcome(msgspec.Struct, frozen=True, kw_only=True):
    """A project's events in one bucket with one outcome: ``accepted`` (durable),
    ``refused`` (by the server, ``reason`` saying why: the ingest refusal reasons), or
    ``client_discard`` (dropped by the SDK before sending, ``reason`` as it reported)."""

    at: str
    outcome: str
    reason: str
    events: int
    requests: int  # requests refused whole (accepted: answered 2xx); 0 for discards


class Outcomes(msgspec.Struct, frozen=True, kw_only=True):
    interval: str
    rows: list[Outcome]
    totals: dict[str, int]  # events per outcome over the window


def _choice(value: str, allowed: tuple[str, ...], parameter: str) -> list[str]:
    chosen = [v for v in value.split(",") if v] if value else []
    for item in chosen:
        if item not in allowed:
            raise InvalidParameter(f"{parameter}: {item[:40]!r} is not one of "
                                   f"{', '.join(allowed)}", detail={"parameter": parameter})
    return list(dict.fromkeys(chosen))


def _interval(value: str) -> int:
    if value not in INTERVALS:
        raise InvalidParameter(f"interval must be one of {', '.join(INTERVALS)}",
                               detail={"parameter": "interval"})
    return INTERVALS[value]


def _window(since: str, until: str) -> tuple[int, int]:
    now_ms = int(time.time() * 1000)
    since_ms = parse_since(since, now_ms)
    until_ms = parse_until(until, now_ms, since_ms) if until else now_ms + 60_000
    return since_ms // 1000, -(-until_ms // 1000)


def usage_router(tenancy: Tenancy, store: UsageStore, pricing: Pricing) -> Router:
    @get("/v1/usage", summary="The tenant's usage per kind over time, priced",
         description="Rows `{tenant, project, box, kind, quantity, unit, cost_usd, credits, "
                     "at, source, reason}` summed per `interval` bucket (minute, hour, day) "
                     "and per the dimensions in `groupBy` (any of project, box, source, "
                     "reason; default all: one row per box per minute per kind; rows are "
                     "always per kind); `kind`: a "
                     "comma-separated list (default all); `project` (id or name), `box`: "
                     "only theirs. Kinds and units: docs/usage.md. Scope `usage:read` or "
                     "`admin`.",
         responses=error_responses(400), opt=scope(USAGE_READ))
    async def read_usage(tenant: Tenant, since: Since = "24h", until: Until = "",
                         kind: KindList = "", project: FromQuery[str | None] = None,
                         box: Box = "", group_by: GroupBy = _ALL_GROUPS,
                         interval: Interval = "minute", limit: Limit = 1000,
                         cursor: Cursor = "") -> UsagePage:
        since_s, until_s = _window(since, until)
        bucket = _interval(interval)
        kinds = _choice(kind, KINDS, "kind")
        groups = [g for g in _choice(group_by, (*GROUPS, "kind"), "groupBy") if g != "kind"]
        if not 1 <= limit <= MAX_LIMIT:
            raise InvalidParameter(f"limit must be 1..{MAX_LIMIT}",
                                   detail={"parameter": "limit"})
        if box and not BOX_ID.fullmatch(box):
            raise InvalidParameter(f"box must match {BOX_ID.pattern}",
                                   detail={"parameter": "box"})
        if not re.fullmatch("[0-9]{0,9}", cursor):
            raise InvalidParameter("cursor must be a nextCursor this endpoint returned",
                                   detail={"parameter": "cursor"})
        offset = int(cursor or 0)
        project_id = None
        if project:  # a deleted project's usage stays: asked for by its id
            found = await asyncio.to_thread(tenancy.get_project, tenant, project)
            project_id = found.id if found is not None else project
        rows, name = await asyncio.to_thread(_read, store, tenant, since_s, until_s, bucket,
                                             groups, kinds, project_id, box or None,
                                             limit + 1, offset)
        more = len(rows) > limit
        out = []
        for row in rows[:limit]:
            at, kind_, *rest = row
            dims = dict(zip(groups, rest[:-1], strict=True))
            quantity = int(rest[-1])  # type: ignore[call-overload]
            usd, credits = pricing.cost(str(kind_), quantity)
            out.append(UsageRow(
                tenant=name, project=_str(dims.get("project")), box=_str(dims.get("box")),
                kind=str(kind_), quantity=quantity, unit=UNITS.get(str(kind_), ""),
                cost_usd=usd, credits=credits, at=iso(int(at)),  # type: ignore[call-overload]
                source=_str(dims.get("source")), reason=_str(dims.get("reason"))))
        return UsagePage(out, str(offset + limit) if more else None)

    @get("/v1/projects/{project:str}/outcomes",
         summary="What happened to the project's events: accepted, refused, discarded",
         description="Per `interval` bucket (minute, hour, day) over `since`..`until`: "
                     "events accepted, refused by the server per reason (the same reasons "
                     "as /metrics), and discarded by the SDKs per the reason they reported.",
         responses=error_responses(400), opt=scope(READ))
    async def outcomes(tenant: Tenant, tenant_project: TenantProject, since: Since = "24h",
                       until: Until = "", interval: Interval = "hour") -> Outcomes:
        since_s, until_s = _window(since, until)
        bucket = _interval(interval)
        rows, _ = await asyncio.to_thread(_read, store, tenant, since_s, until_s, bucket,
                                          ["project", "reason"], list(_OUTCOME_KINDS),
                                          tenant_project.id, None, 1_000_000, 0)
        cells: dict[tuple[int, str, str], list[int]] = {}
        totals = {"accepted": 0, "refused": 0, "client_discard": 0}
        for at, kind_, _project, reason, quantity in rows:
            outcome = {"ingest": "accepted", "refused": "refused",
                       "client_discard": "client_discard"}[str(kind_).split(".")[0]]
            cell = cells.setdefault((int(at), outcome, str(reason)), [0, 0])  # type: ignore[call-overload]
            if str(kind_).endswith(".events"):
                cell[0] += int(quantity)  # type: ignore[call-overload]
                totals[outcome] += int(quantity)  # type: ignore[call-overload]
            else:
                cell[1] += int(quantity)  # type: ignore[call-overload]
        return Outcomes(interval=interval, totals=totals, rows=[
            Outcome(at=iso(at), outcome=outcome, reason=reason, events=n[0], requests=n[1])
            for (at, outcome, reason), n in sorted(cells.items())])

    return Router("", route_handlers=[read_usage, outcomes])


def _str(value: object) -> str | None:
    return None if value is None else str(value)


def _read(store: UsageStore, tenant: str, since_s: int, until_s: int, bucket: int,
          groups: list[str], kinds: list[str], project_id: str | None, box: str | None,
          limit: int, offset: int) -> tuple[list[tuple[object, ...]], str]:
    rows = store.rows(tenant, since_s, until_s, bucket, groups, kinds, project_id, box,
                      limit, offset)
    return rows, store.tenant_name(tenant)
