"""Web console sessions: the cookie a browser holds instead of the API key.

A session is made by signing in with an API key (``POST /v1/session``, in
``tenancy.routes``) and is read by the tenancy guard (``tenancy.guard``). As with API
keys, only the SHA-256 of the token is stored; its CSRF token is stored as it is (it is
worth nothing without the cookie). Expired rows are deleted as they are met.

A session belongs to the key that opened it and has that key's scopes. Revoking the key
deletes its sessions (``tenancy.keys``). A session whose key has expired is refused.
Sessions opened before keys had scopes (no key) keep every scope.
"""

from __future__ import annotations

import secrets
import time
from datetime import UTC, datetime

import msgspec

from metadata.db import Database
from tenancy.keys import EVERY_SCOPE, ApiKey, hash_key

COOKIE = "boxtrail_session"
# Over https the cookie is named with the ``__Host-`` prefix, which a browser accepts only
# from this very host (Secure, Path=/, no Domain): a page on a sibling subdomain (a box, on
# a shared parent domain) cannot plant a session of its own. Over https only that name is
# read; over plain http (a laptop, a test) the plain one.
SECURE_COOKIE = "__Host-" + COOKIE


def is_https(scheme: str, forwarded_proto: str | None) -> bool:
    """The client reached us over https: directly, or through a proxy that ended TLS and
    says so in ``X-Forwarded-Proto`` (a forged header only makes the cookie stricter)."""
    forwarded = (forwarded_proto or "").split(",")[0].strip().lower()
    return "https" in (scheme, forwarded)


def cookie_name(https: bool) -> str:
    return SECURE_COOKIE if https else COOKIE


class Session(msgspec.Struct, frozen=True, kw_only=True):
    tenant_id: str
    tenant_name: str
    csrf: str
    expires_at: float  # Unix time
    key_hash: str  # the API key that opened it ('' before keys had scopes)
    scopes: frozenset[str]


class Sessions:
    def __init__(self, db: Database) -> None:
        self.db = db

    def create(self, key: ApiKey, ttl_s: int) -> tuple[str, Session]:
        """A new session opened with ``key``, and its token (shown once, to the
        browser). It ends at the key's expiry, if that comes first."""
        tenant_id = key.tenant_id
        now = time.time()
        self.db.execute("DELETE FROM sessions WHERE expires_at <= ?", (now,))
        token = "btc_" + secrets.token_urlsafe(32)
        csrf = secrets.token_urlsafe(32)
        expires = min(now + ttl_s, key.expires_at or now + ttl_s)
        self.db.execute(
            "INSERT INTO sessions (hash, tenant_id, csrf, created_at, expires_at, key_hash) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (hash_key(token), tenant_id, csrf,
             datetime.fromtimestamp(now, UTC).isoformat(timespec="milliseconds")[:-6] + "Z",
             expires, key.hash))
        name = self.db.execute("SELECT name FROM tenants WHERE id = ?", (tenant_id,)).fetchone()
        return token, Session(tenant_id=tenant_id, tenant_name=name[0], csrf=csrf,
                              expires_at=expires, key_hash=key.hash, scopes=key.scopes)

    def lookup(self, token: str) -> Session | None:
        """The live session of a token; None if unknown, signed out, expired, or its key
        was revoked."""
        digest = hash_key(token)
        row = self.db.execute(
            "SELECT s.tenant_id, t.name, s.csrf, s.expires_at, s.key_hash, k.scopes "
            "FROM sessions s JOIN tenants t ON t.id = s.tenant_id "
            "LEFT JOIN api_keys k ON k.hash = s.key_hash WHERE s.hash = ?",
            (digest,)).fetchone()
        if row is None:
            return None
        if row[3] <= time.time() or (row[4] and row[5] is None):
            self.db.execute("DELETE FROM sessions WHERE hash = ?", (digest,))
            return None
        scopes = frozenset(str(row[5]).split()) if row[4] else EVERY_SCOPE
        return Session(tenant_id=row[0], tenant_name=row[1], csrf=row[2], expires_at=row[3],
                       key_hash=row[4], scopes=scopes)

    def revoke(self, token: str) -> None:
        self.db.execute("DELETE FROM sessions WHERE hash = ?", (hash_key(token),))
