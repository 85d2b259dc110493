"""Tenants and projects (their API keys: ``tenancy.keys``).

Ingest keys are public
(they ship in web pages) and only let a page write to its one project. Lookups
on the ingest path are served from memory; the tables change only through here.

A known ingest key is served from memory, never waiting for the catalog: ingest's ack
depends on the WAL only, so it goes on while the catalog is out of reach or hangs. The
memory is bounded in time: a key the catalog confirmed more than :data:`KEY_REFRESH_S`
ago is read again by a thread (the request does not wait), and one not confirmed for
:data:`KEY_TRUST_S` is looked up again as a new key would be (a 503 while the catalog is
out). Nothing can change a project's key yet; the bound is there for the revocation a
later issue brings, which then takes effect within a minute on a node that reaches the
catalog and within 15 minutes on one that does not.
"""

from __future__ import annotations

import logging
import re
import secrets
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

import msgspec

from core.errors import Conflict, InvalidParameter, NotFound
from core.origins import ANY, parse_entry
from metadata.db import Database, MetadataUnavailable
from metadata.postgres import patiently
from tenancy.changes import record
from tenancy.keys import ApiKeys

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
# A project's name: a tenant's name that cannot be taken for a project id. Stated as is in
# the schema (``boxtrail.routes.NewProject``), so ECMA-262 reads it as Python does.
PROJECT_NAME_PATTERN = r"^(?!prj_)[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
_PROJECT_NAME = re.compile(PROJECT_NAME_PATTERN)
# Every ingest key this server ever made (older ones had '-').
_KEY = re.compile(r"[A-Za-z0-9_-]{1,128}")
MISS_TTL_S = 60.0
MISS_MAX = 100_000
MAX_ALLOWED_ORIGINS = 100
KEY_REFRESH_S = 60.0
KEY_TRUST_S = 900.0

log = logging.getLogger("boxtrail.tenancy")


class Project(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    id: str
    name: str
    ingest_key: str
    allowed_origins: list[str]
    created_at: str
    # For Sentry SDKs (ingest.sentry): the DSN's project id and public key, and the DSN
    # itself as this server was reached (filled in by the API, see ``with_dsn``).
    sentry_id: int
    sentry_key: str
    dsn: str = ""

    def with_dsn(self, base_url: str) -> Project:
        """This project with ``dsn`` for a server reached at ``base_url`` (scheme://host)."""
        scheme, _, host = base_url.rstrip("/").partition("://")
        return msgspec.structs.replace(
            self, dsn=f"{scheme}://{self.sentry_key}@{host}/{self.sentry_id}")


class IngestKey(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """One of a project's ingest keys, as ``/v1/projects/{p}/ingest-keys`` shows it."""

    key: str
    name: str
    enabled: bool
    rate_limit: float | None  # events/s; None: BOXTRAIL_RATE_LIMIT_EVENTS
    created_at: str
    dsn: str = ""  # the Sentry DSN built from it (filled in by the API)


_KEY_COLUMNS = "key, project_id, name, enabled, rate_limit, created_at"


def _ingest_key(r: tuple[object, ...]) -> tuple[str, IngestKey]:
    """(project id, key) of a row of ``ingest_keys``."""
    return str(r[1]), IngestKey(key=str(r[0]), name=str(r[2]), enabled=bool(r[3]),
                                rate_limit=None if r[4] is None else float(r[4]),  # type: ignore[arg-type]
                                created_at=str(r[5]))


MAX_KEY_NAME = 100


def _key_name(name: str) -> str:
    name = name.strip()
    if len(name) > MAX_KEY_NAME:
        raise InvalidParameter(f"name: at most {MAX_KEY_NAME} characters",
                               detail={"field": "name"})
    return name


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def validate_origins(origins: list[str]) -> list[str]:
    """Each entry parsed (``core.origins``) and stored in its normal form, or a 400
    naming the first entry that is not an origin."""
    if len(origins) > MAX_ALLOWED_ORIGINS:
        raise InvalidParameter(
            f"allowedOrigins has {len(origins)} entries; at most {MAX_ALLOWED_ORIGINS} "
            "(use https://*.example.com for many subdomains)",
            detail={"field": "allowedOrigins", "limit": MAX_ALLOWED_ORIGINS})
    cleaned = []
    for entry in origins:
        parsed = None if entry.strip() == ANY else parse_entry(entry)
        if parsed is None and entry.strip() != ANY:
            raise InvalidParameter(
                f"allowedOrigins: {entry!r} is not an origin like https://app.example.com, "
                "http://localhost:3000 or https://*.example.com (no path, user or query)",
                detail={"field": "allowedOrigins", "value": entry},
            )
        cleaned.append(parsed.text() if parsed else ANY)
    return cleaned


class Tenancy:
    def __init__(self, db: Database) -> None:
        self.db = db
        self.keys = ApiKeys(db)
        # Every enabled ingest key (a Sentry DSN's public key is one) -> its project.
        self._by_ingest_key: dict[str, Project] = {}
        self._rates: dict[str, float] = {}  # ingest keys with a rate limit of their own
        self._misses: dict[str, float] = {}  # unknown ingest keys, until (monotonic)
        self._confirmed: dict[str, float] = {}  # project id -> last read (monotonic)
        self._stale: set[str] = set()  # project ids to read again
        self._refreshing = False  # a thread reads the stale projects again
        self._refresher: threading.Thread | None = None  # the last one started
        self._refresh_lock = threading.Lock()
        with patiently():  # at start: every key and project, however many
            keys = self._keys_of(None)
            for project in self._select("1=1", ()):
                self._remember(project, keys.get(project.id, []))

    def _remember(self, project: Project, keys: list[IngestKey]) -> None:
        for key in keys:
            if key.enabled:
                self._by_ingest_key[key.key] = project
                self._misses.pop(key.key, None)
                if key.rate_limit is not None:
                    self._rates[key.key] = key.rate_limit
                else:
                    self._rates.pop(key.key, None)
        self._confirmed[project.id] = time.monotonic()

    def _keys_of(self, project_ids: list[str] | None) -> dict[str, list[IngestKey]]:
        """The ingest keys of these projects (None: of every project), oldest first."""
        where, params = "1=1", ()
        if project_ids is not None:
            where, params = ("project_id IN (" + ", ".join("?" * len(project_ids)) + ")",
                             tuple(project_ids))  # type: ignore[assignment]
        out: dict[str, list[IngestKey]] = {}
        for row in self.db.execute(f"SELECT {_KEY_COLUMNS} FROM ingest_keys WHERE {where} "
                                   "ORDER BY created_at, key", params):
            project_id, key = _ingest_key(row)
            out.setdefault(project_id, []).append(key)
        return out

    def _cached(self, found: Project | None) -> Project | None:
        """``found`` if the catalog confirmed it recently enough (module docstring)."""
        if found is None:
            return None
        age = time.monotonic() - self._confirmed.get(found.id, 0.0)
        if age < KEY_REFRESH_S:
            return found
        self._refresh_later(found.id)
        return found if age < KEY_TRUST_S else None

    def _refresh_later(self, project_id: str) -> None:
        with self._refresh_lock:
            self._stale.add(project_id)
            if not self._refreshing:
                self._refreshing = True
                self._refresher = threading.Thread(target=self._refresh, name="ingest-keys",
                                                   daemon=True)
                self._refresher.start()

    def _refresh(self) -> None:
        """Read the stale projects again (a thread: its calls have the thread's deadline).
        An id is taken off the stale set before its read, so a change made during the
        read is read again after it."""
        while True:
            with self._refresh_lock:
                ids = sorted(self._stale)[:500]
                if not ids:
                    self._refreshing = False
                    return
                self._stale.difference_update(ids)
            try:
                found = {p.id: p for p in self._select(
                    "id IN (" + ", ".join("?" * len(ids)) + ")", tuple(ids))}
                keys = self._keys_of(ids)
            except MetadataUnavailable as exc:
                log.warning("ingest keys could not be confirmed, kept for now: %s", exc)
                with self._refresh_lock:  # the next lookup or change starts another round
                    self._stale.update(ids)
                    self._refreshing = False
                return
            for project_id in ids:
                # Gone from the catalog: gone from here. Changed: its keys as they are now.
                self._replace(project_id, found.get(project_id), keys.get(project_id, []))

    def _replace(self, project_id: str, project: Project | None,
                 keys: list[IngestKey]) -> None:
        """The project's keys in memory made ``keys`` (none if ``project`` is None), the
        ones it keeps never missing for a moment (a lookup between would read the
        catalog)."""
        keep = set() if project is None else {k.key for k in keys if k.enabled}
        for key in [k for k, p in list(self._by_ingest_key.items()) if p.id == project_id
                    and k not in keep]:
            del self._by_ingest_key[key]
            self._rates.pop(key, None)
        if project is None:
            self._confirmed.pop(project_id, None)
        else:
            self._remember(project, keys)

    def _read_again(self, project_id: str) -> Project | None:
        """The project and its keys read now, and held (in a thread)."""
        found = self._select("id = ?", (project_id,))
        self._replace(project_id, found[0] if found else None,
                      self._keys_of([project_id]).get(project_id, []))
        return found[0] if found else None

    def changed(self, project_id: str) -> None:
        """Another node changed the project (``tenancy.changes``): read it again, off the
        event loop; its old keys serve until then (a few milliseconds)."""
        self._refresh_later(project_id)
        self._confirmed.pop(project_id, None)

    # Tenants and keys.

    def ensure_tenant(self, name: str) -> str:
        if not _NAME.fullmatch(name):
            raise InvalidParameter(f"tenant name {name!r} must match {_NAME.pattern}")
        row = self.db.execute("SELECT id FROM tenants WHERE name = ?", (name,)).fetchone()
        if row:
            return str(row[0])
        tenant_id = "ten_" + secrets.token_hex(8)
        self.db.execute("INSERT INTO tenants (id, name, created_at) VALUES (?, ?, ?)",
                        (tenant_id, name, _now()))
        return tenant_id

    def tenant_count(self) -> int:
        return int(self.db.execute("SELECT count(*) FROM tenants").fetchone()[0])

    # Projects.

    def create_project(self, tenant_id: str, name: str, allowed_origins: list[str]) -> Project:
        if not _PROJECT_NAME.fullmatch(name):
            raise InvalidParameter(
                f"project name {name!r} must be 1-64 letters, digits, '.', '_' or '-', "
                "start with a letter or digit, and not start with 'prj_'",
                detail={"field": "name"},
            )
        origins = validate_origins(allowed_origins)
        # Letters, digits and '_' only: the key is also the public key of a Sentry DSN.
        key = "bti_" + secrets.token_hex(16)
        project_id = "prj_" + secrets.token_hex(8)
        try:
            # The numbers of a cluster's nodes creating projects at once must not collide:
            # the next one is taken under a lock of the whole catalog.
            with self.db.transaction():
                self.db.serialize("sentry_id")
                sentry_id = int(self.db.execute(
                    "SELECT coalesce(max(sentry_id), 0) + 1 FROM projects").fetchone()[0])
                project = Project(id=project_id, name=name, ingest_key=key,
                                  allowed_origins=origins, created_at=_now(),
                                  sentry_id=sentry_id, sentry_key=key)
                self.db.execute(
                    "INSERT INTO projects (id, tenant_id, name, ingest_key, allowed_origins, "
                    "created_at, sentry_id, sentry_key) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (project.id, tenant_id, name, project.ingest_key,
                     msgspec.json.encode(project.allowed_origins).decode(),
                     project.created_at, project.sentry_id, project.sentry_key),
                )
                self.db.execute(
                    f"INSERT INTO ingest_keys ({_KEY_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)",
                    (key, project_id, "default", 1, None, project.created_at))
        except self.db.integrity_errors as exc:
            raise Conflict(f"a project named {name!r} exists already",
                           detail={"name": name}) from exc
        self._remember(project, [IngestKey(key=key, name="default", enabled=True,
                                           rate_limit=None, created_at=project.created_at)])
        return project

    def update_project(self, tenant_id: str, project: Project, name: str | None,
                       allowed_origins: list[str] | None) -> Project:
        """Rename the project (its id stays; the old name is free at once) or set its
        allowed origins; in force on every node at once (``tenancy.changes``)."""
        if name is not None and not _PROJECT_NAME.fullmatch(name):
            raise InvalidParameter(
                f"project name {name!r} must be 1-64 letters, digits, '.', '_' or '-', "
                "start with a letter or digit, and not start with 'prj_'",
                detail={"field": "name"})
        origins = (project.allowed_origins if allowed_origins is None
                   else validate_origins(allowed_origins))
        updated = msgspec.structs.replace(project, name=name or project.name,
                                          allowed_origins=origins)
        try:
            with self.db.transaction():
                self.db.execute(
                    "UPDATE projects SET name = ?, allowed_origins = ? WHERE id = ? AND "
                    "tenant_id = ?", (updated.name, msgspec.json.encode(origins).decode(),
                                      project.id, tenant_id))
                record(self.db, "project", project.id)
        except self.db.integrity_errors as exc:
            raise Conflict(f"a project named {name!r} exists already",
                           detail={"name": name}) from exc
        self._read_again(project.id)
        return updated

    def delete_project(self, tenant_id: str, project: Project,
                       also: Callable[[], None]) -> None:
        """Remove the project and its ingest keys, with ``also`` (the deletion job that
        erases its data, ``erasure``) in the same transaction: at once it is a 404 here,
        its keys are refused on every node (``tenancy.changes``), and its name is free."""
        with self.db.transaction():
            self.db.execute("DELETE FROM ingest_keys WHERE project_id = ?", (project.id,))
            self.db.execute("DELETE FROM projects WHERE id = ? AND tenant_id = ?",
                            (project.id, tenant_id))
            record(self.db, "project", project.id)
            also()
        self._replace(project.id, None, [])

    # A project's ingest keys: each change is in force on every node at once.

    def ingest_keys(self, project: Project) -> list[IngestKey]:
        return self._keys_of([project.id]).get(project.id, [])

    def add_ingest_key(self, project: Project, name: str, rate_limit: float | None
                       ) -> IngestKey:
        key = IngestKey(key="bti_" + secrets.token_hex(16), name=_key_name(name),
                        enabled=True, rate_limit=rate_limit, created_at=_now())
        with self.db.transaction():
            self.db.execute(
                f"INSERT INTO ingest_keys ({_KEY_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)",
                (key.key, project.id, key.name, 1, rate_limit, key.created_at))
            record(self.db, "project", project.id)
        self._read_again(project.id)
        return key

    def change_ingest_key(self, project: Project, key: str, *, name: str | None = None,
                          enabled: bool | None = None, rate_limit: float | None = None,
                          clear_rate_limit: bool = False) -> IngestKey:
        """Rename, disable or enable the key, or set its own limit (``clear_rate_limit``:
        back to the node's)."""
        with self.db.transaction():
            current = self._one_key(project, key)
            changed = msgspec.structs.replace(
                current, name=current.name if name is None else _key_name(name),
                enabled=current.enabled if enabled is None else enabled,
                rate_limit=None if clear_rate_limit else (
                    current.rate_limit if rate_limit is None else rate_limit))
            self.db.execute(
                "UPDATE ingest_keys SET name = ?, enabled = ?, rate_limit = ? WHERE key = ?",
                (changed.name, int(changed.enabled), changed.rate_limit, key))
            record(self.db, "project", project.id)
        self._read_again(project.id)
        return changed

    def delete_ingest_key(self, project: Project, key: str) -> None:
        with self.db.transaction():
            self._one_key(project, key)
            self.db.execute("DELETE FROM ingest_keys WHERE key = ?", (key,))
            record(self.db, "project", project.id)
        self._read_again(project.id)

    def _one_key(self, project: Project, key: str) -> IngestKey:
        row = self.db.execute(f"SELECT {_KEY_COLUMNS} FROM ingest_keys WHERE key = ? AND "
                              "project_id = ?", (key, project.id)).fetchone()
        if row is None:
            raise NotFound(f"project {project.name} has no ingest key {key[:80]!r}",
                           detail={"ingestKey": key[:80]})
        return _ingest_key(row)[1]

    def list_projects(self, tenant_id: str) -> list[Project]:
        return self._select("tenant_id = ? ORDER BY name", (tenant_id,))

    def get_project(self, tenant_id: str, id_or_name: str) -> Project | None:
        found = self._select("tenant_id = ? AND (id = ? OR name = ?) ORDER BY id = ? DESC",
                             (tenant_id, id_or_name, id_or_name, id_or_name))
        return found[0] if found else None

    def project_by_ingest_key(self, key: str) -> Project | None:
        """The project whose enabled ingest key ``key`` is (a Sentry DSN's public key is
        one), or None."""
        found = self._cached(self._by_ingest_key.get(key))
        return found if found is not None else self._load(key)

    def rate_limit_of(self, key: str) -> float | None:
        """The ingest key's own limit (events/s), if it has one."""
        return self._rates.get(key)

    def _load(self, key: str) -> Project | None:
        """A project made since this server started (by another node of a cluster): read
        from the database and remembered. A key found nowhere is remembered as unknown for
        a while, so a flood of made-up keys costs one lookup each per :data:`MISS_TTL_S`.
        That cannot hide a new project: its key is random, made when the project is."""
        if not _KEY.fullmatch(key):
            return None  # no key of ours looks like this: nothing to look up
        now = time.monotonic()
        if self._misses.get(key, 0.0) > now:
            return None
        row = self.db.execute("SELECT project_id FROM ingest_keys WHERE key = ? AND enabled = 1",
                              (key,)).fetchone()
        found = self._select("id = ?", (str(row[0]),)) if row else []
        if not found:
            if len(self._misses) >= MISS_MAX:
                self._misses = {k: t for k, t in self._misses.items() if t > now}
                if len(self._misses) >= MISS_MAX:
                    self._misses.clear()
            self._misses[key] = now + MISS_TTL_S
            return None
        self._remember(found[0], self._keys_of([found[0].id]).get(found[0].id, []))
        return found[0]

    def _select(self, where: str, params: tuple[str, ...]) -> list[Project]:
        # A project's ingestKey is its oldest enabled key, and its DSN's key the oldest
        # that a DSN can hold (no '-': keys made before version 3 had them); '' if none.
        first = ("coalesce((SELECT k.key FROM ingest_keys k WHERE k.project_id = projects.id "
                 "AND k.enabled = 1{} ORDER BY k.created_at, k.key LIMIT 1), '')")
        ingest, sentry = first.format(""), first.format(" AND replace(k.key, '-', '') = k.key")
        rows = self.db.execute(
            f"SELECT id, name, {ingest}, allowed_origins, created_at, sentry_id, {sentry} "
            f"FROM projects WHERE {where}",
            params,
        )
        return [
            Project(id=r[0], name=r[1], ingest_key=r[2],
                    allowed_origins=msgspec.json.decode(r[3], type=list[str]), created_at=r[4],
                    sentry_id=r[5], sentry_key=r[6])
            for r in rows
        ]
