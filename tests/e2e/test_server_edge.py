"""Refusals made by the HTTP server itself, over raw sockets to the real server.

A request that never reaches the app (not HTTP, a URL or headers too large, headers that
do not arrive in time) is still answered in the one JSON error shape, with
``Connection: close``, and the connection is closed. Every wait here is bounded by
``BOUND_S``; nothing asserts how fast the server is.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from tests.support.server import Server, create_project

BOUND_S = 10.0
HEADER_TIMEOUT_S = 0.5
ORIGIN = "https://app.example.com"


class Answer(msgspec.Struct):
    status: int
    headers: dict[str, str]
    body: bytes
    closed: bool  # the server closed the connection (EOF) within BOUND_S

    def error(self) -> dict[str, object]:
        assert self.headers.get("content-type") == "application/json", self.headers
        envelope = msgspec.json.decode(self.body)
        assert set(envelope) == {"error"}
        error: dict[str, object] = envelope["error"]
        assert set(error) == {"code", "message", "detail"}
        assert isinstance(error["message"], str) and error["message"]
        assert isinstance(error["detail"], dict)
        return error


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(tmp_path_factory.mktemp("edge") / "data",
                 {"BOXTRAIL_HEADER_TIMEOUT_S": str(HEADER_TIMEOUT_S)}).start()
    yield srv
    srv.stop()


def connect(server: Server) -> socket.socket:
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=BOUND_S)
    return sock


def read_answer(sock: socket.socket) -> Answer:
    """Everything the server sends until it closes the connection (or BOUND_S passes)."""
    data = b""
    closed = False
    deadline = time.monotonic() + BOUND_S
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            break
        if not chunk:
            closed = True
            break
        data += chunk
    return parse(data, closed)


def parse(data: bytes, closed: bool) -> Answer:
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    assert lines[0].startswith("HTTP/1.1 "), data[:200]
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if "content-length" in headers:
        assert len(body) == int(headers["content-length"]), data[:300]
    return Answer(int(lines[0].split()[1]), headers, body, closed)


def exchange(server: Server, request: bytes) -> Answer:
    with connect(server) as sock:
        # Refused before all of it was read: the answer is still there to read.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(request)
        return read_answer(sock)


def assert_refused(answer: Answer, status: int, code: str) -> dict[str, object]:
    assert answer.status == status, answer
    assert answer.headers.get("connection") == "close"
    assert answer.closed, "the server did not close the connection"
    error = answer.error()
    assert error["code"] == code
    return error


def test_over_long_url_is_414_in_the_error_shape(server: Server) -> None:
    answer = exchange(server, b"GET /v1/projects?q=" + b"a" * 40_000 + b" HTTP/1.1\r\n"
                      b"Host: x\r\n\r\n")
    error = assert_refused(answer, 414, "uri_too_long")
    assert error["detail"] == {"limit": 32768}
    assert "BOXTRAIL_MAX_URL_BYTES" in str(error["message"])
    assert "access-control-allow-origin" not in answer.headers  # no Origin was sent


def test_over_long_url_on_ingest_with_origin_is_readable_by_the_page(server: Server) -> None:
    # The headers after the URL are still read (up to a cap), so the browser SDK gets a
    # status it can read instead of an opaque network error.
    with server.client() as api:
        key = str(create_project(api, "long-url")["ingestKey"])
    answer = exchange(server, b"POST /v1/ingest?key=" + key.encode() + b"&pad=" + b"a" * 100_000
                      + b" HTTP/1.1\r\nHost: x\r\nOrigin: " + ORIGIN.encode()
                      + b"\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\n{}")
    assert_refused(answer, 414, "uri_too_long")
    assert answer.headers["access-control-allow-origin"] == ORIGIN
    assert answer.headers["vary"] == "Origin"


def test_a_url_past_any_browser_limit_is_refused_without_reading_on(server: Server) -> None:
    answer = exchange(server, b"GET /?" + b"a" * (3 << 20) + b" HTTP/1.1\r\n"
                      b"Origin: " + ORIGIN.encode() + b"\r\n\r\n")
    assert_refused(answer, 414, "uri_too_long")
    assert "access-control-allow-origin" not in answer.headers


@pytest.mark.parametrize("request_bytes", [
    b"GARBAGE\r\n\r\n",
    b"GET / HTTP/9.9\r\nHost: x\r\n\r\n",
    b"GET /\x01 HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /\xff\xfe HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET / HTTP/1.1\r\nHo\x01st: x\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\x00y\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost x\r\n\r\n",
    b"POST /v1/ingest HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n{}",
    b"POST /v1/ingest HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
], ids=["garbage", "version", "control-in-url", "non-ascii-url", "control-in-name",
        "nul-in-value", "no-colon", "two-lengths", "bad-chunk"])
def test_invalid_http_is_400_in_the_error_shape(server: Server, request_bytes: bytes) -> None:
    assert_refused(exchange(server, request_bytes), 400, "invalid_http")


def test_invalid_http_after_an_origin_echoes_it(server: Server) -> None:
    answer = exchange(server, b"POST /v1/ingest HTTP/1.1\r\nOrigin: " + ORIGIN.encode()
                      + b"\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n{}")
    assert_refused(answer, 400, "invalid_http")
    assert answer.headers["access-control-allow-origin"] == ORIGIN


def test_an_origin_that_cannot_be_a_header_value_is_not_echoed(server: Server) -> None:
    answer = exchange(server, b"GET /?" + b"a" * 40_000 + b" HTTP/1.1\r\n"
                      b"Origin: https://a.example.com\tevil\r\n\r\n")
    assert_refused(answer, 414, "uri_too_long")
    assert "access-control-allow-origin" not in answer.headers


def test_too_many_headers_is_431(server: Server) -> None:
    headers = b"".join(b"X-H%d: v\r\n" % i for i in range(101))
    answer = exchange(server, b"GET /healthz HTTP/1.1\r\nOrigin: " + ORIGIN.encode() + b"\r\n"
                      + headers + b"\r\n")
    error = assert_refused(answer, 431, "headers_too_large")
    assert error["detail"] == {"limit": 100, "unit": "headers"}
    assert answer.headers["access-control-allow-origin"] == ORIGIN


@pytest.mark.parametrize("headers", [
    b"X-Big: " + b"v" * 40_000 + b"\r\n",  # one header
    b"".join(b"X-H%d: " % i + b"v" * 4000 + b"\r\n" for i in range(10)),  # their sum
    b"X-Endless: " + b"v" * (4 << 20),  # never ends: refused while it is still arriving
], ids=["one", "sum", "endless"])
def test_headers_too_large_are_431(server: Server, headers: bytes) -> None:
    answer = exchange(server, b"GET /healthz HTTP/1.1\r\n" + headers + b"\r\n")
    error = assert_refused(answer, 431, "headers_too_large")
    assert error["detail"] == {"limit": 32768, "unit": "bytes"}


def test_headers_sent_slowly_get_408_and_the_connection_closed(server: Server) -> None:
    # A header line every 0.1 s: each read is prompt, but the head never completes.
    with connect(server) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nOrigin: " + ORIGIN.encode() + b"\r\n")
        deadline = time.monotonic() + BOUND_S
        data = b""
        sock.settimeout(0.1)
        for i in range(int(BOUND_S / 0.1)):
            try:
                sock.sendall(b"X-Slow-%d: v\r\n" % i)
            except (BrokenPipeError, ConnectionResetError):
                break
            try:
                data = sock.recv(65536)
            except TimeoutError:
                continue
            break
        assert data, "no answer while headers trickled in"
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        while chunk := sock.recv(65536):
            data += chunk
    answer = parse(data, closed=True)
    error = assert_refused(answer, 408, "request_timeout")
    assert error["detail"] == {"limit": HEADER_TIMEOUT_S}
    assert answer.headers["access-control-allow-origin"] == ORIGIN


def test_a_connection_that_sends_nothing_is_closed_without_an_answer(server: Server) -> None:
    with connect(server) as sock:
        assert sock.recv(65536) == b""  # EOF within BOUND_S (recv would time out)


def test_a_keep_alive_request_after_an_idle_pause_is_served(server: Server) -> None:
    # The header clock starts with a request's first byte, not when the connection opened
    # or the previous response ended.
    request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    with connect(server) as sock:
        for _ in range(2):
            sock.sendall(request)
            data = b""
            while b"\r\n\r\n" not in data or not data.endswith(b"}"):
                chunk = sock.recv(65536)
                assert chunk, "closed"
                data += chunk
            assert data.startswith(b"HTTP/1.1 200 ")
            time.sleep(HEADER_TIMEOUT_S * 2)


def test_a_slow_second_request_on_a_kept_connection_gets_408(server: Server) -> None:
    with connect(server) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        data = b""
        while not data.endswith(b"}"):
            data += sock.recv(65536)
        assert data.startswith(b"HTTP/1.1 200 ")
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # and no more
        answer = read_answer(sock)
    assert_refused(answer, 408, "request_timeout")


def test_pipelined_requests_are_all_answered(server: Server) -> None:
    request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    with connect(server) as sock:
        sock.sendall(request * 3 + b"GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := sock.recv(65536):  # until the server closes (or BOUND_S: an error)
            data += chunk
    assert data.count(b"HTTP/1.1 200 ") == 4, data


def test_bodies_are_not_counted_as_headers(server: Server) -> None:
    # Large bodies on one kept connection, each arriving after its head, and a head split
    # over two reads whose second also carries the whole body.
    with server.client() as api:
        for size in (40_000, 100_000, 1_000_000):
            response = api.post("/v1/projects", content=b"x" * size,
                                headers={"Content-Type": "application/json"})
            assert response.json()["error"]["code"] == "invalid_parameter"
    with connect(server) as sock:
        for _ in range(2):
            sock.sendall(b"POST /v1/ingest?key=nope HTTP/1.1\r\nHost: x\r\n")
            time.sleep(0.05)
            sock.sendall(b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
                         + b"x" * 100_000)
            data = b""
            while b"}}" not in data:
                chunk = sock.recv(65536)
                assert chunk, data
                data += chunk
            assert data.startswith(b"HTTP/1.1 401 "), data


def test_ordinary_requests_and_ingest_still_work(server: Server, tmp_path: Path) -> None:
    with server.client() as api:
        key = create_project(api, "ordinary", [ORIGIN])["ingestKey"]
        response = api.post("/v1/ingest", params={"key": key}, headers={"Origin": ORIGIN},
                            json={"events": [{"ts": 1, "level": "info", "message": "hi"}]})
        assert response.status_code == 202, response.text
        assert response.headers["access-control-allow-origin"] == ORIGIN
        assert api.get("/v1/projects/nothing").json()["error"]["code"] == "not_found"
