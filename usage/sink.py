"""The sink: usage events pushed to ``BOXTRAIL_USAGE_SINK_URL`` as their minutes close,
signed as Standard Webhooks says, at least once.

One node sends (the lease ``usage-sink``; another takes over within ``LEASE_S`` of its
end). Each round it does two steps, both safe to repeat after a crash:

1. **Close.** Rows of ``usage_minutes`` whose minute ended ``close_s`` ago (every node has
   flushed it by then) and whose quantity is above what was sent become events in
   ``usage_outbox``, and the row's ``sent`` moves to that quantity, in one transaction. An
   event's id is made of the row's key and the quantity it starts from, so a retried event
   has the same id and the same body: a receiver that keeps the ids it has seen counts it
   once. A share that arrives after its minute closed (a node that was down flushes it at
   its start) is sent as one more event, with its own id.
2. **Deliver.** Due events are POSTed, up to ``PARALLEL`` at once. A 2xx deletes one; any
   other answer or a connection error tries it again after ``Retry-After`` if the sink
   sent one, else after a backoff with full jitter, capped at
   ``BOXTRAIL_USAGE_SINK_MAX_BACKOFF_S``. A 410 Gone stops the sink for that URL (on every
   node, across restarts): events wait in the outbox until the URL is changed.

Nothing here runs on ingest's or a reader's path: the loop's catalog calls are in threads.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
import time
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

import httpx
import msgspec
from standardwebhooks.webhooks import Webhook

from core.config import Config, prices
from core.metrics import Registry
from core.usage import UNITS
from metadata.catalog import Catalog
from metadata.db import Database
from metadata.postgres import patiently

log = logging.getLogger("boxtrail.usage")

TICK_S = 0.5
LEASE_S = 15.0
PARALLEL = 8
BATCH = 256
FIRST_BACKOFF_S = 0.5
_LEASE = "usage-sink"
_GONE = "usage_sink_gone"  # cluster_settings: the URL that answered 410


class UsageEvent(msgspec.Struct, frozen=True, kw_only=True):
    """One usage event, in the platform's shape (``GET /v1/usage`` rows are the same)."""

    id: str
    tenant: str  # the tenant's name
    project: str  # the project's id
    box: str
    kind: str
    quantity: int
    unit: str
    cost_usd: float
    credits: float
    at: str  # the start of its minute (storage: of its hour), UTC
    source: str
    reason: str


class Envelope(msgspec.Struct, frozen=True):
    """The webhook's body (Standard Webhooks: type, timestamp, data)."""

    type: str
    timestamp: str
    data: UsageEvent


def iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds").replace(
        "+00:00", "Z")


class Pricing:
    def __init__(self, config: Config) -> None:
        self.prices = prices(config)
        self.credits_per_usd = config.usage_credits_per_usd

    def cost(self, kind: str, quantity: int) -> tuple[float, float]:
        usd = round(quantity * self.prices.get(kind, 0.0), 9)
        return usd, round(usd * self.credits_per_usd, 9)


def event_id(key: tuple[object, ...], start: int) -> str:
    """The id of the event that carries a row's quantity from ``start`` on."""
    text = "\x1f".join(map(str, (*key, start)))
    return "usg_" + hashlib.sha256(text.encode()).hexdigest()[:32]


class Sink:
    def __init__(self, config: Config, db: Database, catalog: Catalog, metrics: Registry
                 ) -> None:
        self.url = config.usage_sink_url
        self.webhook = Webhook(config.usage_sink_secret) if self.url else None
        self.max_backoff_s = config.usage_sink_max_backoff_s
        # Every node has flushed a minute this long after it ended.
        self.close_s = config.flush_interval_s + 5.0
        self.db = db
        self.catalog = catalog
        self.pricing = Pricing(config)
        self.stopped = False
        m = metrics
        self.m_sent = m.counter("boxtrail_usage_sink_sent_total",
                                "Usage events the sink answered with a 2xx")
        self.m_retried = m.counter("boxtrail_usage_sink_retried_total",
                                   "Usage event deliveries that were a retry")
        self.m_failed = m.counter("boxtrail_usage_sink_failed_total",
                                  "Usage event deliveries that failed (tried again later)")
        self._oldest = 0.0
        self._held_until = 0.0  # the lease, as this node last took it (monotonic)
        m.callback("boxtrail_usage_sink_lag_seconds",
                   "Age of the oldest usage event not yet delivered (0: none waits)",
                   lambda: max(0.0, time.time() - self._oldest) if self._oldest else 0.0)
        m.callback("boxtrail_usage_sink_stopped",
                   "1 when the sink answered 410 Gone: nothing is sent to that URL",
                   lambda: float(self.stopped))

    async def run(self) -> None:
        async with httpx.AsyncClient(timeout=10.0) as client:
            with patiently():
                while True:
                    await asyncio.sleep(TICK_S)
                    try:
                        await self.round(client)
                    except Exception as exc:  # the catalog out of reach: next round
                        log.warning("usage sink: round failed, will retry: %s", exc)

    async def round(self, client: httpx.AsyncClient) -> None:
        # Renewed at half its time: a write (an fsync) each LEASE_S / 2, not each round.
        if time.monotonic() > self._held_until - LEASE_S / 2:
            taken = time.monotonic()
            if not await asyncio.to_thread(self.catalog.try_lease, _LEASE, LEASE_S):
                self._oldest, self._held_until = 0.0, 0.0
                return
            self._held_until = taken + LEASE_S
        self.stopped = await asyncio.to_thread(self._gone)
        await asyncio.to_thread(self.close, time.time())
        if self.stopped:
            return
        due = await asyncio.to_thread(self._due, time.time())
        semaphore = asyncio.Semaphore(PARALLEL)

        async def one(row: tuple[str, str, int]) -> None:
            async with semaphore:
                if not self.stopped:  # a 410 to one in flight stops those still waiting
                    await self._deliver(client, *row)

        await asyncio.gather(*(one(row) for row in due))

    def _gone(self) -> bool:
        row = self.db.execute("SELECT value FROM cluster_settings WHERE name = ?",
                              (_GONE,)).fetchone()
        return row is not None and row[0] == self.url

    def close(self, now: float) -> int:
        """Step 1: closed rows' unsent quantity into the outbox; how many events."""
        closed = int(now - 60 - self.close_s)
        rows = self.db.execute(
            "SELECT u.tenant_id, u.minute, u.project_id, u.box, u.kind, u.source, u.reason, "
            "u.quantity, u.sent, t.name FROM usage_minutes u LEFT JOIN tenants t ON "
            "t.id = u.tenant_id WHERE u.quantity > u.sent AND u.minute <= ? "
            "ORDER BY u.minute LIMIT ?", (closed, BATCH)).fetchall()
        made = 0
        with self.db.transaction():
            for tenant_id, minute, project, box, kind, source, reason, quantity, sent, name \
                    in rows:
                key = (tenant_id, minute, project, box, kind, source, reason)
                moved = self.db.execute(
                    "UPDATE usage_minutes SET sent = ? WHERE tenant_id = ? AND minute = ? "
                    "AND project_id = ? AND box = ? AND kind = ? AND source = ? "
                    "AND reason = ? AND sent = ?", (quantity, *key, sent)).rowcount
                if not moved:
                    continue
                delta = int(quantity) - int(sent)
                usd, credits = self.pricing.cost(kind, delta)
                ident = event_id(key, int(sent))
                body = msgspec.json.encode(Envelope("usage.recorded", iso(now), UsageEvent(
                    id=ident, tenant=name or tenant_id, project=project, box=box, kind=kind,
                    quantity=delta, unit=UNITS.get(kind, ""), cost_usd=usd, credits=credits,
                    at=iso(int(minute)), source=source, reason=reason))).decode()
                self.db.execute(
                    "INSERT INTO usage_outbox (id, body, created_at, attempts, next_at) "
                    "VALUES (?, ?, ?, 0, ?) ON CONFLICT (id) DO NOTHING",
                    (ident, body, now, now))
                made += 1
        return made

    def _due(self, now: float) -> list[tuple[str, str, int]]:
        oldest = self.db.execute("SELECT MIN(created_at) FROM usage_outbox").fetchone()
        self._oldest = float(oldest[0]) if oldest and oldest[0] is not None else 0.0
        return [(r[0], r[1], int(r[2])) for r in self.db.execute(
            "SELECT id, body, attempts FROM usage_outbox WHERE next_at <= ? "
            "ORDER BY next_at, id LIMIT ?", (now, BATCH)).fetchall()]

    async def _deliver(self, client: httpx.AsyncClient, ident: str, body: str,
                       attempts: int) -> None:
        assert self.webhook is not None
        if attempts:
            self.m_retried.inc()
        now = datetime.now(UTC)
        headers = {"content-type": "application/json", "webhook-id": ident,
                   "webhook-timestamp": str(int(now.timestamp())),
                   "webhook-signature": self.webhook.sign(ident, now, body)}
        wait: float | None = None
        try:
            answer = await client.post(self.url, content=body.encode(), headers=headers)
            status = answer.status_code
            wait = retry_after(answer.headers.get("retry-after"))
        except httpx.HTTPError as exc:
            status = 0
            log.info("usage sink: %s: %s", self.url, exc)
        if 200 <= status < 300:
            self.m_sent.inc()
            await asyncio.to_thread(self._done, ident)
            return
        self.m_failed.inc()
        if status == 410:
            if not self.stopped:
                log.error("usage sink: %s answered 410 Gone; no more usage events are sent "
                          "to it (they wait in the outbox until BOXTRAIL_USAGE_SINK_URL "
                          "changes)", self.url)
            self.stopped = True
            await asyncio.to_thread(self._stop)
            return
        if wait is None:  # full jitter over an exponential backoff
            wait = random.uniform(0, min(self.max_backoff_s, FIRST_BACKOFF_S * 2 ** attempts))
        await asyncio.to_thread(self._later, ident, time.time() + min(wait, 3600.0))

    def _done(self, ident: str) -> None:
        with self.db.transaction():
            self.db.execute("DELETE FROM usage_outbox WHERE id = ?", (ident,))

    def _later(self, ident: str, at: float) -> None:
        with self.db.transaction():
            self.db.execute("UPDATE usage_outbox SET attempts = attempts + 1, next_at = ? "
                            "WHERE id = ?", (at, ident))

    def _stop(self) -> None:
        with self.db.transaction():
            self.db.execute(
                "INSERT INTO cluster_settings (name, value) VALUES (?, ?) ON CONFLICT (name) "
                "DO UPDATE SET value = excluded.value", (_GONE, self.url))


def retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (seconds or an HTTP date), if it has one."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
