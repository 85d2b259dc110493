"""API keys on one real server: made, listed, scoped, revoked, expired.

The scope matrix is generated from the served OpenAPI schema: every operation, called with
a key of each single scope, is allowed or refused with 403 ``insufficient_scope``
naming the scope the schema states, never anything else. A revoked key's SSE tail, MCP
``logs_tail`` and console session end within a second of the revocation.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from metadata.sqlite import open_db
from tenancy.tenants import Tenancy
from tests.query.test_mcp import call
from tests.support.server import Server, create_project
from tests.support.sse import Tail

SCOPES = ("read", "sourcemaps:write", "admin")
_PARAM = re.compile(r"{(\w+)}")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(tmp_path_factory.mktemp("keys") / "data").start()
    with srv.client() as api:
        create_project(api, "shop")
    yield srv
    srv.stop()


def make_key(server: Server, *scopes: str, name: str = "k", **extra: object) -> dict[str, Any]:
    with server.client() as api:
        r = api.post("/v1/keys", json={"name": name, "scopes": list(scopes), **extra})
    assert r.status_code == 201, r.text
    return r.json()  # type: ignore[no-any-return]


def as_key(server: Server, key: str) -> httpx.Client:
    return httpx.Client(base_url=server.url, timeout=10,
                        headers={"Authorization": f"Bearer {key}"})


def test_a_key_is_shown_once_listed_without_its_secret_and_checked(server: Server) -> None:
    made = make_key(server, "read", name="grafana")
    assert made["key"].startswith("btk_") and made["key"].startswith(made["prefix"])
    assert made["scopes"] == ["read"] and made["expiresAt"] is None
    with server.client() as api:
        listed = {k["id"]: k for k in api.get("/v1/keys").json()}
        assert "key" not in listed[made["id"]]
        assert listed[made["id"]]["name"] == "grafana"
        for body, field in [({"name": "x", "scopes": []}, "scopes"),
                            ({"name": "x", "scopes": ["write"]}, "scopes"),
                            ({"name": "x", "scopes": ["read"], "expiresIn": 0}, "expiresIn"),
                            ({"name": "x", "scopes": ["read"], "expiresIn": "1d"},
                             "expiresIn")]:
            r = api.post("/v1/keys", json=body)
            assert r.status_code == 400, (body, r.text)
            assert field in r.text, r.text  # the error names the field
        assert api.delete("/v1/keys/key_nosuch").status_code == 404
    # Another tenant neither lists nor revokes it.
    other = server.create_key("other")
    with as_key(server, other) as them:
        assert made["id"] not in {k["id"] for k in them.get("/v1/keys").json()}
        assert them.delete(f"/v1/keys/{made['id']}").status_code == 404
    with as_key(server, made["key"]) as mine:
        assert mine.get("/v1/projects/shop/logs", params={"since": "1h"}).status_code == 200
        with server.client() as api:  # used, so listed as used (from memory: no write)
            [info] = [k for k in api.get("/v1/keys").json() if k["id"] == made["id"]]
        assert info["lastUsedAt"] is not None


def operations(server: Server) -> list[tuple[str, str, str]]:
    """(method, path, scope) of every operation the schema says needs a key."""
    schema = httpx.get(f"{server.url}/schema/openapi.json", timeout=10).json()
    assert set(schema["components"]["securitySchemes"]) == {"apiKey"}
    out = []
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            if method not in ("get", "post", "put", "patch", "delete"):
                continue
            security = operation.get("security")
            if security is None:
                continue  # public: ingest, probes
            [[(name, scopes)]] = [list(s.items()) for s in security]
            assert name == "apiKey" and len(scopes) <= 1, (path, security)
            out.append((method.upper(), path, scopes[0] if scopes else "any"))
    return out


def fill(path: str) -> str:
    values = {"project": "shop", "org": "any-org", "key_id": "key_0123456789abcdef",
              "key": "bti_nosuch", "deletion_id": "del_nosuch"}
    return _PARAM.sub(lambda m: values[m.group(1)], path)


def test_every_operation_by_every_scope_is_allowed_or_insufficient_scope(
        server: Server) -> None:
    ops = operations(server)
    assert {scope for _, _, scope in ops} == {"read", "sourcemaps:write", "admin", "any",
                                               "usage:read"}
    assert ("POST", "/v1/keys", "admin") in ops and ("GET", "/v1/projects/{project}/logs",
                                                     "read") in ops
    assert ("GET", "/v1/usage", "usage:read") in ops
    keys = {scope: make_key(server, scope, name=scope)["key"] for scope in SCOPES}
    for scope, key in keys.items():
        with as_key(server, key) as client:
            for method, path, needed in ops:
                target = fill(path)
                if (method, path) == ("DELETE", "/v1/projects/{project}"):
                    # Allowed, it deletes the project: each key gets one of its own.
                    with server.client() as admin:
                        doomed = create_project(admin, "doomed-" + scope.replace(":", "-"))
                    target = f"/v1/projects/{doomed['id']}"
                # Bounded: a tail would stream; its first bytes are its answer.
                with client.stream(method, target, params={"since": "1h"},
                                   timeout=10) as r:
                    body = r.read() if r.status_code != 200 else b""
                where = f"{method} {path} with a {scope} key"
                # What an admin key may see anyway: the usage (tenancy.guard).
                if needed in ("any", scope) or (needed, scope) == ("usage:read", "admin"):
                    assert r.status_code not in (401, 403), f"{where}: {r.status_code} {body!r}"
                else:
                    assert r.status_code == 403, f"{where}: {r.status_code} {body!r}"
                    error = httpx.Response(403, content=body).json()["error"]
                    assert error["code"] == "insufficient_scope", where
                    assert error["detail"] == {"scope": needed}, where


def test_the_mcp_tools_need_read_and_say_so_as_a_tool_error(server: Server) -> None:
    maps = make_key(server, "sourcemaps:write", name="ci")["key"]
    reader = make_key(server, "read", name="agent")["key"]
    refused = asyncio.run(call(server, "auto", "logs_search", {"project": "shop"}, key=maps))
    assert refused.is_error and "read" in refused.content[0].text  # type: ignore[union-attr]
    allowed = asyncio.run(call(server, "auto", "logs_search", {"project": "shop"}, key=reader))
    assert not allowed.is_error, allowed.content


def _console_session(server: Server, key: str) -> httpx.Client:
    client = httpx.Client(base_url=server.url, timeout=10)
    r = client.post("/v1/session", json={"apiKey": key}, headers={"Origin": server.url})
    assert r.status_code == 201, r.text
    return client


def test_a_revoked_key_loses_its_tail_its_mcp_tail_and_its_session_within_a_second(
        server: Server, capsys: pytest.CaptureFixture[str]) -> None:
    key = make_key(server, "read", name="leaked")
    console = _console_session(server, key["key"])
    assert console.get("/v1/session").status_code == 200
    with as_key(server, key["key"]) as client:
        tail = Tail(client, "/v1/projects/shop/tail",
                    headers={"Authorization": f"Bearer {key['key']}"})
        assert tail.status == 200
        ended: dict[str, float] = {}
        result: dict[str, Any] = {}

        def mcp_tail() -> None:
            result["r"] = asyncio.run(call(server, "auto", "logs_tail",
                                           {"project": "shop", "seconds": 30}, key=key["key"]))
            ended["mcp"] = time.monotonic()

        runner = threading.Thread(target=mcp_tail, daemon=True)
        runner.start()
        time.sleep(1.5)  # the MCP tail is open and waiting for rows
        assert runner.is_alive()
        with server.client() as api:
            revoked_at = time.monotonic()
            assert api.delete(f"/v1/keys/{key['id']}").status_code == 204
        tail._thread.join(5)
        ended["sse"] = time.monotonic()
        runner.join(5)
        sse_s, mcp_s = ended["sse"] - revoked_at, ended["mcp"] - revoked_at
        with capsys.disabled():
            print(f"\nrevoked: the SSE tail ended after {sse_s * 1000:.0f} ms, the MCP "
                  f"logs_tail after {mcp_s * 1000:.0f} ms")
        assert sse_s < 1.0 and mcp_s < 1.0
        closing = [m for m in tail.received if m.event == "closed"]
        assert closing and closing[0].json()["error"]["detail"] == {"reason": "revoked"}
        assert result["r"].is_error and "revoked" in result["r"].content[0].text
        r = client.get("/v1/projects/shop/logs")
        assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
    assert console.get("/v1/session").status_code == 401
    assert console.get("/v1/projects").status_code == 401
    console.close()


def test_an_expired_key_is_refused_and_its_tail_ends(server: Server) -> None:
    key = make_key(server, "read", name="short", expiresIn=3)
    expires = datetime.fromisoformat(key["expiresAt"].replace("Z", "+00:00"))
    assert key["expiresAt"] is not None
    with as_key(server, key["key"]) as client:
        assert client.get("/v1/projects/shop/logs").status_code == 200
        tail = Tail(client, "/v1/projects/shop/tail",
                    headers={"Authorization": f"Bearer {key['key']}"})
        tail._thread.join(10)
        assert not tail._thread.is_alive(), "the tail outlived its key"
        ended = time.time()
        assert ended - expires.timestamp() < 1.0
        closing = [m for m in tail.received if m.event == "closed"]
        assert closing and closing[0].json()["error"]["detail"] == {"reason": "expired"}
        assert client.get("/v1/projects/shop/logs").status_code == 401


def test_the_cli_makes_lists_and_revokes_keys_and_the_running_server_obeys(
        server: Server) -> None:
    env = {"BOXTRAIL_DATA_DIR": str(server.data_dir), "PATH": os.environ["PATH"]}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "boxtrail", "keys", *args], env=env,
                              capture_output=True, text=True, timeout=60)

    made = cli("create", "--tenant", "dev", "--name", "from-cli", "--scope", "read")
    assert made.returncode == 0, made.stderr
    secret = made.stdout.strip()
    with as_key(server, secret) as client:
        assert client.get("/v1/projects/shop/logs").status_code == 200
        assert client.get("/v1/keys").status_code == 403  # read only
        listed = cli("list", "--tenant", "dev")
        [line] = [x for x in listed.stdout.splitlines() if "from-cli" in x]
        key_id = line.split()[0]
        assert secret[:8] in line and "read" in line
        assert cli("revoke", "--tenant", "dev", key_id).returncode == 0
        deadline = time.monotonic() + 1.0
        while client.get("/v1/projects/shop/logs").status_code != 401:
            assert time.monotonic() < deadline, "the server still takes a key the CLI revoked"
            time.sleep(0.05)
    assert cli("revoke", "--tenant", "dev", key_id).returncode != 0  # gone already


def test_a_key_revoked_while_another_node_reads_it_is_not_held_after(tmp_path: Path) -> None:
    """A node that does not hold a key yet reads it from the database (in a thread: the
    console's session login does). A revocation that lands between that read and the node
    remembering the key must win: refused then and after, not held until a restart."""
    maker = Tenancy(open_db(tmp_path / "meta.sqlite"))
    tenant = maker.ensure_tenant("t")
    secret, key = maker.keys.create(tenant, "k")
    reader_db = open_db(tmp_path / "meta.sqlite")
    reader = Tenancy(reader_db).keys
    reader._by_hash.clear()  # as if made after this node started
    real = reader_db.execute

    def execute(sql: str, params: Any = ()) -> Any:
        rows = real(sql, params).fetchall()
        if sql.startswith("SELECT") and "FROM api_keys WHERE hash" in sql and rows:
            # The read saw the key; now it is revoked and this node told, before it is held.
            reader.forget(maker.keys.revoke(tenant, key.id))
        return _Rows(rows)

    reader_db.execute = execute  # type: ignore[method-assign]
    assert reader.authenticate(secret) is None
    reader_db.execute = real  # type: ignore[method-assign]
    assert reader.authenticate(secret) is None and key.hash not in reader._by_hash


class _Rows:
    def __init__(self, rows: list[Any]) -> None:
        self.rows = rows

    def fetchone(self) -> Any:
        return self.rows[0] if self.rows else None
