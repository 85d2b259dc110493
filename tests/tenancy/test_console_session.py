"""The web console's sign-in: the API key pasted once, a session cookie after it.

Against the real server: the cookie reads what the key reads (the SSE tail included,
which an EventSource opens without headers), a request that changes something needs
the session's CSRF token and no foreign Origin, and an ended session reads as no key.

Most tests share one server (``server`` below): each signs in a session of its own and
reads only what it made. The two that list the tenant's projects start their own
(``own_server``), as does the one that needs sessions to expire within a second.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from tests.support.server import Server, create_project
from tests.support.sse import messages

COOKIE = "boxtrail_session"
CSRF = "X-Boxtrail-CSRF"
FOREIGN = "https://evil.example"


def _refused(response: httpx.Response, status: int, code: str) -> dict[str, object]:
    assert response.status_code == status, response.text
    body = response.json()
    assert list(body) == ["error"] and set(body["error"]) == {"code", "message", "detail"}
    assert body["error"]["code"] == code, body
    return body["error"]  # type: ignore[no-any-return]


def _attributes(set_cookie: str) -> tuple[str, set[str]]:
    """The cookie's ``name=value`` and its attributes."""
    first, *rest = set_cookie.split("; ")
    return first, set(rest)


@contextmanager
def _signed_in(server: Server, key: str) -> Iterator[tuple[httpx.Client, dict[str, str]]]:
    """A client that holds only the session cookie (no Authorization), and the answer."""
    with httpx.Client(base_url=server.url, timeout=10) as client:
        response = client.post("/v1/session", json={"apiKey": key})
        assert response.status_code == 201, response.text
        assert client.cookies[COOKIE].startswith("btc_")
        yield client, response.json()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(tmp_path_factory.mktemp("console-session") / "data").start()
    yield srv
    srv.stop()


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[Server]:
    """A fresh server: the dev tenant's projects are this test's alone."""
    srv = Server(tmp_path / "data").start()
    yield srv
    srv.stop()


@pytest.fixture
def console(server: Server) -> Iterator[tuple[httpx.Client, dict[str, str]]]:
    with _signed_in(server, server.api_key) as signed_in:
        yield signed_in


@pytest.fixture
def own_console(own_server: Server) -> Iterator[tuple[httpx.Client, dict[str, str]]]:
    with _signed_in(own_server, own_server.api_key) as signed_in:
        yield signed_in


def test_sign_in_answers_a_strict_cookie_that_reads_as_the_key(own_server: Server) -> None:
    server = own_server  # a fresh one: the tenant's projects are listed below
    with server.client() as api:
        project = create_project(api, "web")
    started = len(server.output)  # a new data directory's dev key is printed at start
    with httpx.Client(base_url=server.url, timeout=10) as client:
        origin = server.url  # the console's own page: the same origin is accepted
        response = client.post("/v1/session", json={"apiKey": server.api_key},
                               headers={"Origin": origin})
        assert response.status_code == 201, response.text
        session = response.json()
        assert set(session) == {"tenantId", "tenantName", "csrfToken", "expiresAt", "scopes"}
        assert session["scopes"] == ["admin", "read", "sourcemaps:write",
                                     "usage:read"]  # the dev key's
        assert session["tenantName"] == "dev"
        expires = datetime.fromisoformat(session["expiresAt"])
        assert abs(expires - (datetime.now(UTC) + timedelta(days=7))) < timedelta(minutes=1)
        value, attributes = _attributes(response.headers["set-cookie"])
        assert value.startswith(f"{COOKIE}=btc_")
        assert attributes == {"HttpOnly", "SameSite=Strict", "Path=/", "Max-Age=604800"}

        assert client.get("/v1/session").json() == session  # a reloaded page gets it back
        listed = client.get("/v1/projects")
        assert listed.status_code == 200 and [p["id"] for p in listed.json()] == [project["id"]]
        logs = client.get("/v1/projects/web/logs", params={"since": "1h"})
        assert logs.status_code == 200, logs.text

        # The tail, by cookie alone: a row ingested after it opens arrives on it.
        with client.stream("GET", "/v1/projects/web/tail") as tail:
            assert tail.status_code == 200
            assert tail.headers["content-type"].startswith("text/event-stream")
            sent = httpx.post(f"{server.url}/v1/ingest", params={"key": str(project["ingestKey"])},
                              json={"events": [{"message": "seen by the console"}]})
            assert sent.status_code == 202, sent.text
            log = next(m for m in messages(tail) if m.event == "log")
            assert log.json()["message"] == "seen by the console"

    assert not any(server.api_key in line for line in server.output[started:])


def test_a_change_by_cookie_needs_the_csrf_token_and_no_foreign_origin(
        own_console: tuple[httpx.Client, dict[str, str]]) -> None:
    client, session = own_console  # on a server of its own: the tenant's projects are listed
    body = {"name": "made-by-console"}
    error = _refused(client.post("/v1/projects", json=body), 403, "csrf_failed")
    assert CSRF in str(error["message"])
    _refused(client.post("/v1/projects", json=body, headers={CSRF: "btc_wrong"}),
             403, "csrf_failed")
    right = {CSRF: session["csrfToken"]}
    _refused(client.post("/v1/projects", json=body, headers={**right, "Origin": FOREIGN}),
             403, "csrf_failed")
    assert client.get("/v1/projects").json() == []  # nothing was made by the refused ones
    made = client.post("/v1/projects", json=body, headers=right)
    assert made.status_code == 201, made.text
    # MCP reads the bearer key itself: the cookie is not a key there.
    _refused(client.post("/mcp", json={}, headers=right), 401, "unauthorized")
    own = {**right, "Origin": str(client.base_url).rstrip("/")}
    made = client.post("/v1/projects", json={"name": "from-the-page"}, headers=own)
    assert made.status_code == 201, made.text
    # Behind a proxy that ends TLS the page's origin is https on the same host: its own.
    host = str(client.base_url.netloc.decode())
    made = client.post("/v1/projects", json={"name": "via-tls-proxy"},
                       headers={**right, "Origin": f"https://{host}"})
    assert made.status_code == 201, made.text
    # Another port, another host, a sandboxed frame's "null": not the console's page.
    port = int(host.rsplit(":", 1)[1])
    for origin in (f"http://127.0.0.1:{port + 1}", f"http://localhost.evil:{port}", "null",
                   f"http://{host}.evil", f"ftp://{host}"):
        _refused(client.post("/v1/projects", json={"name": "never"},
                             headers={**right, "Origin": origin}), 403, "csrf_failed")


def test_the_cookie_is_secure_behind_a_proxy_that_ends_tls(server: Server) -> None:
    """Over https the cookie is ``__Host-``-prefixed (a sibling subdomain cannot plant
    one), and only that name is read there."""
    https = {"X-Forwarded-Proto": "https"}
    with httpx.Client(base_url=server.url, timeout=10) as client:
        r = client.post("/v1/session", json={"apiKey": server.api_key}, headers=https)
        assert r.status_code == 201, r.text
        pair, attributes = _attributes(r.headers["set-cookie"])
        name, _, token = pair.partition("=")
        assert name == "__Host-" + COOKIE and {"Secure", "Path=/"} <= attributes
        assert not any(a.lower().startswith("domain") for a in attributes)
    with httpx.Client(base_url=server.url, timeout=10, headers=https,
                      cookies={"__Host-" + COOKIE: token}) as client:
        assert client.get("/v1/session").status_code == 200
    # The plain name, as a sibling subdomain could set it, is not read over https.
    with httpx.Client(base_url=server.url, timeout=10, headers=https,
                      cookies={COOKIE: token}) as client:
        _refused(client.get("/v1/projects"), 401, "unauthorized")


def test_signing_in_again_ends_the_session_it_replaces(server: Server) -> None:
    with _signed_in(server, server.api_key) as (client, _):
        first = client.cookies[COOKIE]
        again = client.post("/v1/session", json={"apiKey": server.api_key})
        assert again.status_code == 201 and client.cookies[COOKIE] != first
    with httpx.Client(base_url=server.url, timeout=10, cookies={COOKIE: first}) as stale:
        _refused(stale.get("/v1/session"), 401, "unauthorized")


def test_sign_in_refusals(server: Server) -> None:
    started = len(server.output)
    unknown = "btk_" + "x" * 40
    with httpx.Client(base_url=server.url, timeout=10) as client:
        key = {"apiKey": server.api_key}
        _refused(client.post("/v1/session", json=key, headers={"Origin": FOREIGN}),
                 403, "csrf_failed")
        _refused(client.post("/v1/session", json={"apiKey": unknown}), 401, "unauthorized")
        _refused(client.post("/v1/session", json={**key, "remember": True}),
                 400, "invalid_parameter")
        _refused(client.get("/v1/session"), 401, "unauthorized")
        assert COOKIE not in client.cookies
        # A bearer key is not a console session.
        bearer = {"Authorization": f"Bearer {server.api_key}"}
        _refused(client.get("/v1/session", headers=bearer), 401, "unauthorized")
    assert not any(server.api_key in line or unknown in line
                   for line in server.output[started:])


def test_sign_out_ends_the_session(server: Server,
                                   console: tuple[httpx.Client, dict[str, str]]) -> None:
    client, session = console
    token = client.cookies[COOKIE]
    _refused(client.delete("/v1/session"), 403, "csrf_failed")  # a change like any other
    out = client.delete("/v1/session", headers={CSRF: session["csrfToken"]})
    assert out.status_code == 204, out.text
    value, attributes = _attributes(out.headers["set-cookie"])
    assert value == f"{COOKIE}=" and "Max-Age=0" in attributes
    with httpx.Client(base_url=server.url, timeout=10, cookies={COOKIE: token}) as old:
        _refused(old.get("/v1/session"), 401, "unauthorized")
        _refused(old.get("/v1/projects"), 401, "unauthorized")


def test_another_tenants_project_is_not_found_by_cookie(
        server: Server, console: tuple[httpx.Client, dict[str, str]]) -> None:
    other_key = server.create_key("other")
    with httpx.Client(base_url=server.url, timeout=10,
                      headers={"Authorization": f"Bearer {other_key}"}) as other:
        theirs = create_project(other, "theirs")
    client, _ = console
    for ref in ("theirs", str(theirs["id"])):
        _refused(client.get(f"/v1/projects/{ref}"), 404, "not_found")
        _refused(client.get(f"/v1/projects/{ref}/logs"), 404, "not_found")
    with _signed_in(server, other_key) as (other_console, session):
        assert session["tenantName"] == "other"
        assert [p["name"] for p in other_console.get("/v1/projects").json()] == ["theirs"]


def test_an_expired_session_reads_as_no_key(tmp_path: Path) -> None:
    server = Server(tmp_path / "data", {"BOXTRAIL_SESSION_TTL_S": "1"}).start()
    try:
        with _signed_in(server, server.api_key) as (signed_in, _):
            token = signed_in.cookies[COOKIE]
        # Sent as a browser that kept it would: the server, not the client, ends it.
        with httpx.Client(base_url=server.url, timeout=10,
                          headers={"Cookie": f"{COOKIE}={token}"}) as client:
            assert client.get("/v1/projects").status_code == 200
            time.sleep(1.5)
            error = _refused(client.get("/v1/projects"), 401, "unauthorized")
            assert "console session" in str(error["message"])
            _refused(client.get("/v1/session"), 401, "unauthorized")
    finally:
        server.stop()
