"""A project's ingest keys on one real server: several at once, each with a name, an
on/off switch and its own rate limit; rotation (add, move over, delete the old); a key
disabled or deleted, and the Sentry DSN built from it, refused from the next request."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.server import Server, create_project


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(tmp_path_factory.mktemp("ingest-keys") / "data").start()
    yield srv
    srv.stop()


def send(server: Server, key: str, n: int = 1) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/ingest", params={"key": key}, timeout=10,
                      json={"events": [{"message": f"m{i}"} for i in range(n)]})


def sentry(server: Server, project: dict[str, Any], key: str) -> httpx.Response:
    event = json.dumps({"event_id": "a" * 32, "message": "from sentry"}).encode()
    body = b"\n".join([json.dumps({"event_id": "a" * 32}).encode(),
                       json.dumps({"type": "event", "length": len(event)}).encode(), event])
    return httpx.post(f"{server.url}/api/{project['sentryId']}/envelope/",
                      params={"sentry_key": key}, content=body + b"\n", timeout=10)


def refused(response: httpx.Response) -> bool:
    return (response.status_code == 401
            and response.json()["error"]["code"] == "unknown_ingest_key")


def test_rotation_add_move_over_then_delete_the_old(server: Server) -> None:
    with server.client() as api:
        project = create_project(api, "rotating")
        old = str(project["ingestKey"])
        base = "/v1/projects/rotating/ingest-keys"
        [default] = api.get(base).json()
        assert (default["key"], default["name"], default["enabled"]) == (old, "default", True)
        assert default["dsn"].endswith(f"/{project['sentryId']}") and old in default["dsn"]
        made = api.post(base, json={"name": "2027"})
        assert made.status_code == 201, made.text
        new = made.json()["key"]
        assert new != old and made.json()["dsn"]
        for key in (old, new):  # both work while the pages move over
            assert send(server, key).status_code == 202
            assert sentry(server, project, key).status_code == 200
        assert api.delete(f"{base}/{old}").status_code == 204
        assert refused(send(server, old)) and refused(sentry(server, project, old))
        assert send(server, new).status_code == 202
        assert api.get("/v1/projects/rotating").json()["ingestKey"] == new
        assert [k["key"] for k in api.get(base).json()] == [new]
        assert api.delete(f"{base}/{old}").status_code == 404


def test_a_disabled_key_is_refused_until_enabled_again(server: Server) -> None:
    with server.client() as api:
        project = create_project(api, "switch")
        key = str(project["ingestKey"])
        base = f"/v1/projects/switch/ingest-keys/{key}"
        r = api.patch(base, json={"enabled": False})
        assert r.status_code == 200 and r.json()["enabled"] is False, r.text
        assert refused(send(server, key)) and refused(sentry(server, project, key))
        assert api.get("/v1/projects/switch").json()["ingestKey"] == ""  # none enabled
        assert api.patch(base, json={"enabled": True}).status_code == 200
        assert send(server, key).status_code == 202
        assert sentry(server, project, key).status_code == 200
        # Another project's key cannot be named through this one.
        other = create_project(api, "other")
        r = api.patch(f"/v1/projects/switch/ingest-keys/{other['ingestKey']}",
                      json={"enabled": False})
        assert r.status_code == 404
        assert send(server, str(other["ingestKey"])).status_code == 202


def test_a_key_with_its_own_rate_limit(server: Server) -> None:
    with server.client() as api:
        create_project(api, "limited")
        base = "/v1/projects/limited/ingest-keys"
        slow = api.post(base, json={"name": "slow", "rateLimit": 2}).json()
        assert slow["rateLimit"] == 2
        fast = api.get(base).json()[0]["key"]  # the default: the server's (no) limit
        assert send(server, slow["key"], 2).status_code == 202
        r = send(server, slow["key"], 2)
        assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limited", r.text
        assert int(r.headers["retry-after"]) >= 1
        assert send(server, fast, 50).status_code == 202
        r = api.patch(f"{base}/{slow['key']}", json={"rateLimit": None})
        assert r.status_code == 200 and r.json()["rateLimit"] is None
        assert send(server, slow["key"], 50).status_code == 202
        for bad in ({"rateLimit": 0}, {"rateLimit": -1}, {"name": "x" * 101},
                    {"enabled": "no"}):
            assert api.patch(f"{base}/{slow['key']}", json=bad).status_code == 400, bad
