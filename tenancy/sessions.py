"""Web console sessions: the cookie a browser holds instead of the API key.

A session is made by signing in with an API key (``POST /v1/session``, in
``boxtrail.routes``) and is read by the tenancy guard (``tenancy.guard``). As with API
keys, only the SHA-256 of the token is stored; its CSRF token is stored as it is (it is
worth nothing without the cookie). Expired rows are deleted as they are met.
"""

from __future__ import annotations

import secrets
import time
from datetime import UTC, datetime

import msgspec

from metadata.db import Database
from tenancy.tenants import hash_key

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


class Sessions:
    def __init__(self, db: Database) -> None:
        self.db = db

    def create(self, tenant_id: str, ttl_s: int) -> tuple[str, Session]:
        """A new session of the tenant and its token (shown once, to the browser)."""
        now = time.time()
        self.db.execute("DELETE FROM sessions WHERE expires_at <= ?", (now,))
        token = "btc_" + secrets.token_urlsafe(32)
        csrf = secrets.token_urlsafe(32)
        self.db.execute(
            "INSERT INTO sessions (hash, tenant_id, csrf, created_at, expires_at) "
            "VALUES (?, ?, ?, ?, ?)",
            (hash_key(token), tenant_id, csrf,
             datetime.fromtimestamp(now, UTC).isoformat(timespec="milliseconds")[:-6] + "Z",
             now + ttl_s))
        name = self.db.execute("SELECT name FROM tenants WHERE id = ?", (tenant_id,)).fetchone()
        return token, Session(tenant_id=tenant_id, tenant_name=name[0], csrf=csrf,
                              expires_at=now + ttl_s)

    def lookup(self, token: str) -> Session | None:
        """The live session of a token; None if unknown, revoked or expired."""
        digest = hash_key(token)
        row = self.db.execute(
            "SELECT s.tenant_id, t.name, s.csrf, s.expires_at FROM sessions s "
            "JOIN tenants t ON t.id = s.tenant_id WHERE s.hash = ?", (digest,)).fetchone()
        if row is None:
            return None
        if row[3] <= time.time():
            self.db.execute("DELETE FROM sessions WHERE hash = ?", (digest,))
            return None
        return Session(tenant_id=row[0], tenant_name=row[1], csrf=row[2], expires_at=row[3])

    def revoke(self, token: str) -> None:
        self.db.execute("DELETE FROM sessions WHERE hash = ?", (hash_key(token),))
