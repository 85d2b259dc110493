"""Tenancy is decided by one guard for every route: a walk over every route of the app.

The routes come from the app itself (``app.routes``), so a route added later is walked
without this file knowing it: unless it is declared public, it must answer 401 without
a key and with a wrong one, and 404 for another tenant's project, as the real server
answers them.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import httpx
import pytest
from litestar import Litestar, get
from litestar.routes import ASGIRoute, HTTPRoute
from litestar.testing import AsyncTestClient

from boxtrail.app import assemble
from core.config import load
from metadata.sqlite import open_db
from tenancy.guard import TenantProject, scope
from tenancy.keys import ANY, READ
from tenancy.tenants import Project, Tenancy
from tests.support.server import Server, create_project

# Routes anyone may call: probes and the scraper, the schema, and ingest (its key is
# the public ingest key). Adding one here is a decision for review, not a side effect.
# Sentry's intake is keyed by the DSN's public key, as /v1/ingest by the ingest key.
# The console's files (the same for everyone; what they show comes from guarded routes).
PUBLIC_PATHS = {"/healthz", "/readyz", "/metrics", "/v1/ingest", "/api/{project:str}/envelope",
                "/api/{project:str}/store", "/", "/console/{path:path}",
                "/v1/session"}  # POST signs in with an API key in the body
PUBLIC_PREFIXES = ("/schema",)

# A mount answers every method; these are the ones a client of /mcp sends.
MOUNT_METHODS = ("GET", "POST", "DELETE")
_PARAM = re.compile(r"{(\w+)(?::\w+)?}")


def _is_public_path(path: str) -> bool:
    return path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES)


def _endpoints(app: Litestar) -> list[tuple[str, str, bool]]:
    """(method, path, declared public) for every handler of every route."""
    out: list[tuple[str, str, bool]] = []
    for route in app.routes:
        if isinstance(route, HTTPRoute):
            for handler in route.route_handlers:
                out += [(method, route.path, bool(handler.opt.get("public")))
                        for method in sorted(handler.http_methods)]
        elif isinstance(route, ASGIRoute):
            public = bool(route.route_handler.opt.get("public"))
            out += [(method, route.path, public) for method in MOUNT_METHODS]
        else:  # a websocket route: teach this test how to open one
            pytest.fail(f"{route.path}: a {type(route).__name__} is not walked yet")
    return out


async def _app_endpoints(data_dir: Path) -> list[tuple[str, str, bool]]:
    app, _ = assemble(load({"BOXTRAIL_DATA_DIR": str(data_dir)}))
    async with app.lifespan():  # started and stopped, so it leaves nothing open
        return _endpoints(app)


def _other_tenant_key(server: Server) -> str:
    return server.create_key("other")


def _fill(path: str, project: str) -> str:
    def value(match: re.Match[str]) -> str:
        if match.group(1) == "org":  # Sentry's organization: boxtrail has none, any will do
            return "any-org"
        if match.group(1) == "key_id":  # an API key's id: the tenant's own is for later
            return "key_0123456789abcdef"
        if match.group(1) == "key":  # an ingest key of the project
            return "bti_nosuch"
        if match.group(1) == "deletion_id":  # a deletion job: the tenant's own is for later
            return "del_nosuch"
        if match.group(1) != "project":
            pytest.fail(f"{path}: a path parameter {match.group(1)!r} this test cannot fill")
        return project
    return _PARAM.sub(value, path)


def _refused(response: httpx.Response, status: int, code: str, where: str) -> None:
    assert response.status_code == status, f"{where}: {response.status_code} {response.text}"
    assert response.json()["error"]["code"] == code, where


def test_every_route_is_guarded_unless_declared_public(server: Server, tmp_path: Path) -> None:
    endpoints = asyncio.run(_app_endpoints(tmp_path / "routes"))
    declared = {path for _, path, public in endpoints if public}
    assert declared == {p for _, p, _ in endpoints if _is_public_path(p)}, \
        "public routes changed: update PUBLIC_PATHS if that is meant"
    guarded = [(m, p) for m, p, public in endpoints if not public]
    assert {p for _, p in guarded} >= {"/v1/projects", "/v1/projects/{project:str}/logs",
                                       "/v1/projects/{project:str}/tail", "/mcp"}

    with server.client() as mine:
        create_project(mine, "mine")
    with httpx.Client(base_url=server.url, timeout=10,
                      headers={"Authorization": f"Bearer {_other_tenant_key(server)}"}
                      ) as other:
        theirs = create_project(other, "theirs")

    keys = {"no key": {}, "unknown key": {"Authorization": "Bearer btk_" + "x" * 40},
            "empty bearer": {"Authorization": "Bearer"},
            "not bearer": {"Authorization": f"Basic {server.api_key}"}}
    with httpx.Client(base_url=server.url, timeout=10) as client:
        for method, path in guarded:
            url = _fill(path, "mine")
            for name, headers in keys.items():
                r = client.request(method, url, headers=headers)
                _refused(r, 401, "unauthorized", f"{method} {url} with {name}")
            if "{project" not in path:
                continue
            mine = {"Authorization": f"Bearer {server.api_key}"}
            missing = client.request(method, _fill(path, "nosuch"), headers=mine)
            _refused(missing, 404, "not_found", f"{method} {path} of no project")
            for ref in (str(theirs["name"]), str(theirs["id"])):
                r = client.request(method, _fill(path, ref), headers=mine)
                _refused(r, 404, "not_found", f"{method} {path} of another tenant's {ref}")
                # Exactly as if it did not exist: the same answer but for the name given.
                assert r.text.replace(ref, "nosuch") == missing.text
                assert r.headers.get("content-type") == missing.headers.get("content-type")

        for path in ("/healthz", "/metrics", "/schema/openapi.json"):
            assert client.get(path).status_code == 200, path


def _seed(data_dir: Path) -> tuple[str, Project, Project]:
    """A key of tenant ``a``, a project of ``a`` and one of tenant ``b``."""
    data_dir.mkdir(parents=True)
    db = open_db(data_dir / "meta.sqlite")
    try:
        tenancy = Tenancy(db)
        key, made = tenancy.keys.create(tenancy.ensure_tenant("a"), "a")
        b = tenancy.ensure_tenant("b")
        return key, tenancy.create_project(made.tenant_id, "ours", []), tenancy.create_project(
            b, "theirs", [])
    finally:
        db.close()


def test_a_route_added_later_is_guarded_and_must_name_its_scope(tmp_path: Path) -> None:
    key, ours, theirs = _seed(tmp_path / "data")
    app, _ = assemble(load({"BOXTRAIL_DATA_DIR": str(tmp_path / "data")}))

    @get("/v1/projects/{project:str}/unsaid")
    async def unsaid(tenant_project: TenantProject) -> dict[str, str]:
        return {"project": tenant_project.id}

    with pytest.raises(RuntimeError, match="declares the scope it needs"):
        app.register(unsaid)  # neither public nor scoped: refused, so the app cannot start

    @get("/v1/projects/{project:str}/later", opt=scope(READ))
    async def later(tenant_project: TenantProject) -> dict[str, str]:
        return {"project": tenant_project.id}

    @get("/v1/console/whoami", opt=scope(ANY))
    async def whoami() -> dict[str, str]:  # asks for nothing, still guarded
        return {"ok": "yes"}

    app.register(later)
    app.register(whoami)

    async def run() -> None:
        async with AsyncTestClient(app) as client:
            auth = {"Authorization": f"Bearer {key}"}
            assert (await client.get("/v1/console/whoami")).status_code == 401
            assert (await client.get("/v1/console/whoami", headers=auth)).json() == {"ok": "yes"}
            assert (await client.get("/v1/projects/ours/later")).status_code == 401
            r = await client.get(f"/v1/projects/{theirs.id}/later", headers=auth)
            assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
            r = await client.get("/v1/projects/ours/later", headers=auth)
            assert r.json() == {"project": ours.id}

    asyncio.run(run())
