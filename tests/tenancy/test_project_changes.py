"""``PATCH /v1/projects/{p}`` on one real server: a rename keeps the id and frees the old
name at once; new allowed origins hold from the next request."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.support.server import Server, create_project


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(tmp_path_factory.mktemp("patch") / "data").start()
    yield srv
    srv.stop()


def send(server: Server, key: str, origin: str) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/ingest", params={"key": key}, timeout=10,
                      headers={"Origin": origin}, json={"events": [{"message": "hi"}]})


def test_a_rename_keeps_the_id_and_frees_the_old_name(server: Server) -> None:
    with server.client() as api:
        made = create_project(api, "shop")
        create_project(api, "taken")
        r = api.patch("/v1/projects/shop", json={"name": "store"})
        assert r.status_code == 200, r.text
        assert (r.json()["id"], r.json()["name"]) == (made["id"], "store")
        assert r.json()["ingestKey"] == made["ingestKey"]
        assert api.get("/v1/projects/store").json()["id"] == made["id"]
        assert api.get("/v1/projects/shop").status_code == 404
        again = create_project(api, "shop")  # the freed name, taken again at once
        assert again["id"] != made["id"]
        r = api.patch("/v1/projects/store", json={"name": "taken"})
        assert r.status_code == 409 and r.json()["error"]["code"] == "conflict", r.text
        for bad in ("prj_x", "", "a b", "x" * 65):
            r = api.patch("/v1/projects/store", json={"name": bad})
            assert r.status_code == 400, (bad, r.text)
        assert api.patch("/v1/projects/store", json={}).json()["name"] == "store"


def test_new_allowed_origins_hold_from_the_next_request(server: Server) -> None:
    with server.client() as api:
        project = create_project(api, "web", ["https://a.example"])
        key = str(project["ingestKey"])
        assert send(server, key, "https://a.example").status_code == 202
        r = api.patch("/v1/projects/web", json={"allowedOrigins": ["https://b.example"]})
        assert r.status_code == 200 and r.json()["allowedOrigins"] == ["https://b.example"]
        refused = send(server, key, "https://a.example")
        assert refused.status_code == 403, refused.text
        assert refused.json()["error"]["code"] == "origin_not_allowed"
        assert send(server, key, "https://b.example").status_code == 202
        r = api.patch("/v1/projects/web", json={"allowedOrigins": ["not an origin"]})
        assert r.status_code == 400 and "allowedOrigins" in r.text
