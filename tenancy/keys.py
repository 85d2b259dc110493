"""API keys: who calls, with what scopes, until when.

A key is shown once, when it is made, and kept as its SHA-256 (``hash``). It also has an id
to name it by (``key_...``), a name, its scopes, an optional expiry and the time it was last
used. The key's first characters (``prefix``) are kept so a listing can show which key is
which.

Scopes (:data:`SCOPES`) are what a route asks of the key that calls it (``tenancy.guard``):

- ``read``: search, errors, histogram, tail, and the MCP tools;
- ``sourcemaps:write``: upload, list and delete source maps, and the endpoints
  ``sentry-cli`` uploads through. This is what CI needs;
- ``admin``: API keys and projects;
- ``usage:read``: the tenant's usage (``admin`` may read it too), for a billing system
  that must not read logs; a project's outcomes need ``read``.

A few routes ask only for a valid key (:data:`ANY`). Examples are listing a tenant's
projects and the console's session. Keys made before scopes existed, and the dev key, have
every scope.

**At once, on every node.** A node keeps the keys it has met in memory, so the request path
never waits for the catalog. A revocation deletes the key's row, the console sessions it
opened, and writes a change (``tenancy.changes``). The node that revoked the key forgets it
before it answers. Every other node reads the change within ``Changes.POLL_S`` and forgets
the key too. Forgetting a key also ends what it holds open: an SSE tail, or an MCP
``logs_tail`` (:meth:`ApiKeys.hold`). An expired key is refused by the next request, on
every node, from memory. The streams it holds end at the next sweep.

**Last used** is approximate: each node notes uses in memory and writes them every
``LAST_USED_WRITE_S``. A request never writes.
"""

from __future__ import annotations

import hashlib
import itertools
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime

import msgspec

from core.errors import InvalidParameter, NotFound
from metadata.db import Database
from metadata.postgres import patiently
from tenancy.changes import record

READ = "read"
SOURCEMAPS_WRITE = "sourcemaps:write"
ADMIN = "admin"
USAGE_READ = "usage:read"
SCOPES = (READ, SOURCEMAPS_WRITE, ADMIN, USAGE_READ)
EVERY_SCOPE = frozenset(SCOPES)
ANY = "any"
"""A route's scope when any valid key may call it."""
MAX_NAME = 100
LAST_USED_WRITE_S = 10.0

Ending = Callable[[str], None]
"""Ends one stream a key holds, with the reason (``revoked``, ``expired``)."""


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def iso(unix: float | None) -> str | None:
    if unix is None:
        return None
    return datetime.fromtimestamp(unix, UTC).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z")


def parse_scopes(scopes: Iterable[str]) -> frozenset[str]:
    """The scopes, each one of :data:`SCOPES`, or a 400 naming the first that is not."""
    found = frozenset(scopes)
    if not found:
        raise InvalidParameter(f"scopes must name at least one of {', '.join(SCOPES)}",
                               detail={"field": "scopes"})
    for scope in sorted(found):
        if scope not in EVERY_SCOPE:
            raise InvalidParameter(f"scopes: {scope!r} is not one of {', '.join(SCOPES)}",
                                   detail={"field": "scopes", "value": scope})
    return found


class ApiKey(msgspec.Struct, frozen=True, kw_only=True):
    hash: str
    id: str
    tenant_id: str
    name: str
    prefix: str
    scopes: frozenset[str]
    created_at: str
    expires_at: float | None  # Unix time

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and self.expires_at <= now

    def allows(self, scope: str) -> bool:
        return scope == ANY or scope in self.scopes


class KeyInfo(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """An API key as ``GET /v1/keys`` lists it: never the key itself."""

    id: str
    name: str
    prefix: str
    scopes: list[str]
    created_at: str
    expires_at: str | None
    last_used_at: str | None


class NewKey(KeyInfo, frozen=True, kw_only=True, rename="camel"):
    """The answer to ``POST /v1/keys``: the one time the key is shown."""

    key: str


_COLUMNS = "hash, id, tenant_id, name, prefix, scopes, created_at, expires_at"


def _row(r: tuple[object, ...]) -> ApiKey:
    return ApiKey(hash=str(r[0]), id=str(r[1]), tenant_id=str(r[2]), name=str(r[3]),
                  prefix=str(r[4]), scopes=frozenset(str(r[5]).split()),
                  created_at=str(r[6]), expires_at=None if r[7] is None else float(r[7]))  # type: ignore[arg-type]


class ApiKeys:
    def __init__(self, db: Database) -> None:
        self.db = db
        self._by_hash: dict[str, ApiKey] = {}
        self._used: dict[str, float] = {}  # hash -> last use here, not yet written
        self._written_at = time.monotonic()
        self._holds: dict[str, dict[int, Ending]] = {}
        self._hold_ids = itertools.count()
        # Keys forgotten so far, under the lock: a key read from the database in a thread is
        # held only if none was forgotten meanwhile (its revocation may have raced the read).
        self._forgotten = 0
        self._lock = threading.Lock()
        with patiently():  # at start: every key, however many
            for row in db.execute(f"SELECT {_COLUMNS} FROM api_keys"):
                key = _row(row)
                self._by_hash[key.hash] = key

    # Made, listed, revoked.

    def create(self, tenant_id: str, name: str, scopes: Iterable[str] = SCOPES,
               expires_at: float | None = None) -> tuple[str, ApiKey]:
        """A new key of the tenant, and the key itself (only its hash is kept)."""
        name = name.strip()
        if len(name) > MAX_NAME:
            raise InvalidParameter(f"name: at most {MAX_NAME} characters",
                                   detail={"field": "name"})
        granted = parse_scopes(scopes)
        if expires_at is not None and expires_at <= time.time():
            raise InvalidParameter("expiresAt must be in the future",
                                   detail={"field": "expiresAt"})
        secret = "btk_" + secrets.token_urlsafe(30)
        key = ApiKey(hash=hash_key(secret), id="key_" + secrets.token_hex(8),
                     tenant_id=tenant_id, name=name, prefix=secret[:8],
                     scopes=granted, created_at=iso(time.time()) or "",
                     expires_at=expires_at)
        self.db.execute(
            "INSERT INTO api_keys (hash, id, tenant_id, name, prefix, scopes, created_at, "
            "expires_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (key.hash, key.id, tenant_id, key.name, key.prefix, " ".join(sorted(granted)),
             key.created_at, expires_at))
        self._by_hash[key.hash] = key
        return secret, key

    def info(self, key: ApiKey, last_used_at: float | None = None) -> KeyInfo:
        return KeyInfo(id=key.id, name=key.name, prefix=key.prefix,
                       scopes=sorted(key.scopes), created_at=key.created_at,
                       expires_at=iso(key.expires_at),
                       last_used_at=iso(max(filter(None, (last_used_at,
                                                          self._used.get(key.hash))),
                                            default=None)))

    def list(self, tenant_id: str) -> list[KeyInfo]:
        rows = self.db.execute(
            f"SELECT {_COLUMNS}, last_used_at FROM api_keys WHERE tenant_id = ? "
            "ORDER BY created_at, id", (tenant_id,)).fetchall()
        return [self.info(_row(r), r[8]) for r in rows]

    def revoke(self, tenant_id: str, key_id: str) -> str:
        """Delete the tenant's key ``key_id`` and the console sessions it opened, and tell
        every node (``tenancy.changes``); its hash. Call :meth:`forget` with it on the
        event loop. A 404 if the tenant has no such key."""
        with self.db.transaction():
            row = self.db.execute("SELECT hash FROM api_keys WHERE id = ? AND tenant_id = ?",
                                  (key_id, tenant_id)).fetchone()
            if row is None:
                raise NotFound(f"no API key {key_id!r}", detail={"key": key_id})
            digest = str(row[0])
            self.db.execute("DELETE FROM api_keys WHERE hash = ?", (digest,))
            self.db.execute("DELETE FROM sessions WHERE key_hash = ?", (digest,))
            record(self.db, "api_key", digest)
        return digest

    def forget(self, digest: str, reason: str = "revoked") -> None:
        """The key is gone (revoked here or on another node): refuse it from now on and
        end the streams it holds. On the event loop."""
        with self._lock:
            self._forgotten += 1
            self._by_hash.pop(digest, None)
        self._used.pop(digest, None)
        for end in list(self._holds.pop(digest, {}).values()):
            end(reason)

    # The request path.

    def authenticate(self, secret: str) -> ApiKey | None:
        """The live key ``secret`` is, or None (unknown, revoked or expired)."""
        digest = hash_key(secret)
        key = self._by_hash.get(digest)
        while key is None:  # made on another node, or by the CLI, since this one started
            forgotten = self._forgotten
            row = self.db.execute(f"SELECT {_COLUMNS} FROM api_keys WHERE hash = ?",
                                  (digest,)).fetchone()
            if row is None:
                return None
            with self._lock:
                if self._forgotten == forgotten:  # else read again: it may be revoked now
                    key = self._by_hash[digest] = _row(row)
        now = time.time()
        if key.expired(now):
            return None
        self._used[digest] = now
        return key

    def hold(self, digest: str, end: Ending) -> Callable[[], None]:
        """``end`` is called (on the event loop) if the key is revoked or expires while
        the caller holds it; call the result when done."""
        token = next(self._hold_ids)
        self._holds.setdefault(digest, {})[token] = end

        def release() -> None:
            held = self._holds.get(digest)
            if held is not None:
                held.pop(token, None)
                if not held:
                    del self._holds[digest]

        return release

    # Now and then (tenancy.changes runs these).

    def sweep(self) -> None:
        """End the streams of keys that expired. On the event loop."""
        now = time.time()
        for digest in list(self._holds):
            key = self._by_hash.get(digest)
            if key is not None and key.expired(now):
                for end in list(self._holds.pop(digest, {}).values()):
                    end("expired")

    def due_uses(self) -> dict[str, float]:
        """The uses to write now (every ``LAST_USED_WRITE_S``), taken from memory."""
        if time.monotonic() - self._written_at < LAST_USED_WRITE_S or not self._used:
            return {}
        self._written_at = time.monotonic()
        used, self._used = self._used, {}
        return used

    def write_uses(self, used: dict[str, float]) -> None:
        """Write ``due_uses``' answer (in a thread)."""
        for digest, at in used.items():
            self.db.execute("UPDATE api_keys SET last_used_at = ? WHERE hash = ? AND "
                            "(last_used_at IS NULL OR last_used_at < ?)", (at, digest, at))
