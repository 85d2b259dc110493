"""Bad input gets its documented status and error code, never a 500, and good
neighbours in a batch are kept. Every response is checked for the one error shape.

Most tests share one server (``server`` below), each on a project of its own name: they
read only that project's rows and their own answers, and a server per test was two
thirds of the module's time (~1.3 s each of ~47 s). The tests that read a counter of
/metrics, or the server's RSS, start their own (``own_server``) so no neighbour adds to it."""

from __future__ import annotations

import gzip
import re
import socket
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingest.body import MAX_GZIP_MEMBERS
from tests.support.server import Server, create_project

GOOD = {"message": "good"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(tmp_path_factory.mktemp("bad-input") / "data").start()
    yield srv
    srv.stop()


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[Server]:
    """A fresh server: its /metrics count this test's requests alone."""
    srv = Server(tmp_path / "data").start()
    yield srv
    srv.stop()


@pytest.fixture
def own_api(own_server: Server) -> Iterator[httpx.Client]:
    with own_server.client() as client:
        yield client


def error_code(response: httpx.Response) -> str:
    body = response.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"code", "message", "detail"}, body
    assert body["error"]["message"], body
    return str(body["error"]["code"])


def gzip_bomb(inflated: int) -> bytes:
    """A few kB of gzip that inflates to ``inflated`` bytes of zeros."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    chunk = b"\0" * (1 << 20)
    parts = [compressor.compress(chunk) for _ in range(inflated // len(chunk))]
    return b"".join(parts) + compressor.flush()


def deep(levels: int) -> bytes:
    return b'{"events": [{"message": "x", "attrs": ' + b"[" * levels + b"]" * levels + b"}]}"


CASES = [
    # name, body bytes, headers, status, code
    ("not json", b"hello", {}, 400, "invalid_body"),
    ("empty body", b"", {}, 400, "invalid_body"),
    ("json but an array", b"[1, 2]", {}, 400, "invalid_body"),
    ("events not a list", b'{"events": 3}', {}, 400, "invalid_body"),
    ("context wrong type", b'{"context": 5, "events": []}', {}, 400, "invalid_body"),
    ("invalid utf-8", b'{"events": [{"message": "\xff\xfe"}]}', {}, 400, "invalid_body"),
    ("deep nesting", deep(100_000), {}, 400, "invalid_body"),
    ("bad box id", b'{"context": {"boxId": "../../etc"}, "events": [{"message": "x"}]}', {},
     400, "invalid_body"),
    ("1001 events", b'{"events": [' + b",".join([b'{"message": "x"}'] * 1001) + b"]}", {},
     413, "too_many_events"),
    ("10 MB body", b'{"events": [{"message": "' + b"a" * (10 << 20) + b'"}]}', {}, 413,
     "body_too_large"),
    ("unsupported type", b'{"events": []}', {"Content-Type": "application/xml"}, 415,
     "unsupported_media_type"),
    ("unsupported encoding", b'{"events": []}', {"Content-Encoding": "br"}, 415,
     "unsupported_encoding"),
    ("gzip that is not gzip", b"nope", {"Content-Encoding": "gzip"}, 400, "invalid_body"),
    ("truncated gzip", gzip.compress(b'{"events": []}')[:-10], {"Content-Encoding": "gzip"},
     400, "invalid_body"),
]


@pytest.mark.parametrize(("name", "body", "headers", "status", "code"), CASES,
                         ids=[c[0] for c in CASES])
def test_bad_bodies(server: Server, api: httpx.Client, name: str, body: bytes,
                    headers: dict[str, str], status: int, code: str) -> None:
    project = "case-" + re.sub(r"[^a-z0-9]+", "-", name)  # the server is shared
    key = str(create_project(api, project)["ingestKey"])
    sent = {"Content-Type": "application/json", **headers}
    r = httpx.post(f"{server.url}/v1/ingest", params={"key": key}, content=body, headers=sent,
                   timeout=30)
    assert r.status_code == status, r.text
    assert error_code(r) == code
    # Nothing of a refused request is stored; the server still takes good input.
    ok = httpx.post(f"{server.url}/v1/ingest", params={"key": key}, json={"events": [GOOD]})
    assert ok.status_code == 202
    rows = api.get(f"/v1/projects/{project}/logs").json()["rows"]
    assert [row["message"] for row in rows] == ["good"]


def test_bad_events_are_rejected_alone(own_server: Server, own_api: httpx.Client) -> None:
    key = str(create_project(own_api, "p")["ingestKey"])
    events = [
        GOOD,
        {"message": 5},                              # wrong type
        {"level": "loud", "message": "x"},           # unknown level
        {"ts": 1_700_000_000, "message": "x"},       # seconds, not ms
        {"ts": "yesterday", "message": "x"},         # not a time
        {"attrs": {"nested": {"a": 1}}, "message": "x"},  # attrs must be scalars
        {"level": "info"},                           # no message, no error
        "just a string",                             # not an object
        {"level": "warning", "message": "also good", "ts": "2026-01-02T03:04:05.678Z"},
    ]
    r = httpx.post(f"{own_server.url}/v1/ingest", params={"key": key}, json={"events": events})
    assert r.status_code == 202, r.text
    body = r.json()
    assert body["accepted"] == 2
    assert [(x["index"], x["code"]) for x in body["rejected"]] == [
        (1, "invalid_event"), (2, "invalid_level"), (3, "invalid_timestamp"),
        (4, "invalid_timestamp"), (5, "invalid_event"), (6, "invalid_event"),
        (7, "invalid_event")]
    assert all(x["error"] for x in body["rejected"])
    rows = own_api.get("/v1/projects/p/logs", params={"since": "2000d"}).json()["rows"]
    assert sorted((row["message"], row["level"]) for row in rows) == [
        ("also good", "warn"), ("good", "info")]
    metrics = own_api.get("/metrics").text
    assert 'boxtrail_events_rejected_total{reason="invalid_level"} 1' in metrics
    assert 'boxtrail_events_rejected_total{reason="invalid_event"} 4' in metrics
    assert 'boxtrail_events_rejected_total{reason="invalid_timestamp"} 2' in metrics


def test_attrs_that_are_not_utf8_reject_their_event_alone(server: Server,
                                                        api: httpx.Client) -> None:
    """Bytes that are not UTF-8 inside ``attrs`` (which the decoder keeps raw, as sent)
    reject that event, whichever path the batch takes; the rest are stored. Such a batch
    of valid events otherwise (the path that keeps attrs as sent) was answered 500."""
    key = str(create_project(api, "attrs-not-utf8")["ingestKey"])
    for extra in (b"", b', "level": "loud"'):  # a batch valid but for it, and one that is not
        body = (b'{"events": [{"message": "good", "ts": 1760000000000}, '
                b'{"message": "a", "ts": 1760000000000, "attrs": {"a": "\xff"}' + extra
                + b'}]}')
        r = httpx.post(f"{server.url}/v1/ingest", params={"key": key}, content=body,
                       headers={"Content-Type": "application/json"})
        assert r.status_code == 202, r.text
        rejected = r.json()["rejected"]
        assert r.json()["accepted"] == 1 and [x["index"] for x in rejected] == [1], r.text


_RAW_KEYS: dict[str, str] = {}


# Pieces that break encodings: stray and cut UTF-8, an escape's start, a quote, a NUL, a
# control character, and plain text between them; and any bytes at all.
_PIECES = st.lists(st.sampled_from([b"\xff", b"\xc3", b"\x80", b"\xe2\x82", b"\xed\xa0\x80",
                                    b"\\", b"\\u", b'"', b"\x00", b"\x1f", b"a", b"\xc3\xa9"]),
                    min_size=1, max_size=8).map(b"".join)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.one_of(_PIECES, st.binary(min_size=1, max_size=24)),
       where=st.sampled_from(["attrs value", "attrs key", "message", "url", "level"]),
       all_valid=st.booleans())
def test_any_bytes_in_any_string_get_a_clear_answer(server: Server, api: httpx.Client,
                                                    raw: bytes, where: str,
                                                    all_valid: bool) -> None:
    """Any bytes inside a string of an event (UTF-8 or not, quotes and backslashes
    included): a 202 that takes the good event and answers for the other, or a 400
    invalid_body; never a 500. With ``all_valid`` false, a neighbour sends the batch down
    the per-event path; otherwise it may take the path that keeps attrs as sent."""
    if server.url not in _RAW_KEYS:
        _RAW_KEYS[server.url] = str(create_project(api, "raw-bytes")["ingestKey"])
    fields = {"message": b'"m"', "ts": b"1760000000000", "level": b'"info"'}
    inside = b'"' + raw + b'"'
    if where == "attrs value":
        fields["attrs"] = b'{"a": ' + inside + b"}"
    elif where == "attrs key":
        fields["attrs"] = b"{" + inside + b': "v"}'
    else:
        fields[where] = inside
    event = b"{" + b", ".join(b'"%s": %s' % (k.encode(), v) for k, v in fields.items()) + b"}"
    good = b'{"message": "good", "ts": 1760000000000%s}' % (b"" if all_valid
                                                           else b', "level": "loud"')
    body = b'{"events": [{"message": "keep", "ts": 1760000000000}, ' + event + b", " + good + b"]}"
    r = httpx.post(f"{server.url}/v1/ingest", params={"key": _RAW_KEYS[server.url]},
                   content=body, headers={"Content-Type": "application/json"}, timeout=30)
    assert r.status_code in (202, 400), r.text
    if r.status_code == 400:
        assert error_code(r) == "invalid_body"
        return
    answer = r.json()
    indexes = [x["index"] for x in answer["rejected"]]
    assert 0 not in indexes and answer["accepted"] + len(indexes) == 3, answer


def test_long_strings_are_truncated_and_marked(own_server: Server, own_api: httpx.Client) -> None:
    key = str(create_project(own_api, "p")["ingestKey"])
    event = {"message": "é" * 20_000, "attrs": {"big": "x" * 5000, "small": 1},
             "error": {"type": "Error", "message": "m", "stack": "s" * 100_000}}
    r = httpx.post(f"{own_server.url}/v1/ingest", params={"key": key}, json={"events": [event]})
    assert r.json() == {"accepted": 1, "rejected": []}
    [row] = own_api.get("/v1/projects/p/logs").json()["rows"]
    assert len(row["message"].encode()) <= 16 << 10
    assert len(row["error"]["stack"]) == 64 << 10
    assert len(row["attrs"]["big"]) == 1024 and row["attrs"]["small"] == 1
    assert row["truncated"] == ["message", "error.stack", "attrs.big"]
    assert 'boxtrail_events_truncated_total{field="message"} 1' in own_api.get("/metrics").text


def test_gzip_bomb_is_refused_without_inflating(own_server: Server, own_api: httpx.Client) -> None:
    key = str(create_project(own_api, "p")["ingestKey"])
    bomb = gzip_bomb(2 << 30)  # 2 GiB of zeros: ~2 MB compressed, refused before inflating
    assert len(bomb) > 1 << 20
    small_bomb = gzip_bomb(512 << 20)  # under the compressed limit: refused while inflating
    assert len(small_bomb) < 1 << 20
    before = own_server.rss_kb()
    for body in (bomb, small_bomb):
        r = httpx.post(f"{own_server.url}/v1/ingest", params={"key": key}, content=body,
                       headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
                       timeout=30)
        assert r.status_code == 413 and error_code(r) == "body_too_large"
    assert own_server.rss_kb() - before < 50 * 1024
    good = gzip.compress(b'{"events": [{"message": "zipped"}]}')
    r = httpx.post(f"{own_server.url}/v1/ingest", params={"key": key}, content=good,
                   headers={"Content-Type": "text/plain", "Content-Encoding": "gzip"})
    assert r.status_code == 202


def test_refusals_by_key_and_origin(own_server: Server, own_api: httpx.Client) -> None:
    create_project(own_api, "locked", ["https://app.example.com"])
    key = own_api.get("/v1/projects/locked").json()["ingestKey"]
    r = httpx.post(f"{own_server.url}/v1/ingest", params={"key": "bti_nope"}, json={"events": []})
    assert r.status_code == 401 and error_code(r) == "unknown_ingest_key"
    r = httpx.post(f"{own_server.url}/v1/ingest", json={"events": []})
    assert r.status_code == 401 and error_code(r) == "unknown_ingest_key"
    r = httpx.post(f"{own_server.url}/v1/ingest", params={"key": key}, json={"events": [GOOD]},
                   headers={"Origin": "https://other.example.com"})
    assert r.status_code == 403 and error_code(r) == "origin_not_allowed"
    assert r.headers["access-control-allow-origin"] == "https://other.example.com"
    metrics = own_api.get("/metrics").text
    assert 'boxtrail_ingest_requests_rejected_total{reason="unknown_ingest_key"} 2' in metrics
    assert 'boxtrail_ingest_requests_rejected_total{reason="origin_not_allowed"} 1' in metrics


def test_rate_limit(tmp_path: object) -> None:
    from pathlib import Path
    server = Server(Path(str(tmp_path)) / "d", {"BOXTRAIL_RATE_LIMIT_EVENTS": "100",
                                                "BOXTRAIL_RATE_LIMIT_BURST": "150"}).start()
    try:
        with server.client() as api:
            key = str(create_project(api, "p")["ingestKey"])
            batch = {"events": [GOOD] * 100}
            url = f"{server.url}/v1/ingest"
            assert httpx.post(url, params={"key": key}, json=batch).status_code == 202
            r = httpx.post(url, params={"key": key}, json=batch)
            assert r.status_code == 429 and error_code(r) == "rate_limited"
            wait = int(r.headers["retry-after"])
            assert 1 <= wait <= 2
            time.sleep(wait)
            assert httpx.post(url, params={"key": key}, json=batch).status_code == 202
            metrics = api.get("/metrics").text
            assert 'boxtrail_events_rejected_total{reason="rate_limited"} 100' in metrics
    finally:
        server.stop()


def test_api_errors_have_the_one_shape(server: Server, api: httpx.Client) -> None:
    create_project(api, "shape")
    checks = [
        (httpx.get(f"{server.url}/v1/projects"), 401, "unauthorized"),
        (httpx.get(f"{server.url}/v1/projects", headers={"Authorization": "Bearer nope"}),
         401, "unauthorized"),
        (api.get("/v1/projects/missing"), 404, "not_found"),
        (api.get("/v1/projects/missing/logs"), 404, "not_found"),
        (api.get("/nowhere"), 404, "not_found"),
        (api.delete("/v1/projects"), 405, "method_not_allowed"),
        (api.post("/v1/projects", json={"name": "bad name!"}), 400, "invalid_parameter"),
        (api.post("/v1/projects", json={"nom": "x"}), 400, "invalid_parameter"),
        (api.post("/v1/projects", content=b"{"), 400, "invalid_parameter"),
        (api.post("/v1/projects", json={"name": "q", "allowedOrigins": ["nope"]}), 400,
         "invalid_parameter"),
        (api.post("/v1/projects", json={"name": "shape"}), 409, "conflict"),
        (api.get("/v1/projects/shape/logs", params={"limit": 0}), 400, "invalid_parameter"),
        (api.get("/v1/projects/shape/logs", params={"limit": 1001}), 400, "invalid_parameter"),
        (api.get("/v1/projects/shape/logs", params={"limit": "many"}), 400, "invalid_parameter"),
        (api.get("/v1/projects/shape/logs", params={"cursor": "!!"}), 400, "invalid_parameter"),
        (api.get("/v1/projects/shape/logs", params={"since": "10 parsecs"}), 400,
         "invalid_parameter"),
    ]
    for response, status, code in checks:
        assert response.status_code == status, (response.request.url, response.text)
        assert error_code(response) == code, response.request.url


def test_a_lone_surrogate_costs_nothing(server: Server, api: httpx.Client) -> None:
    """Half an emoji (JSON.stringify of a cut string) is replaced, not the batch refused."""
    key = str(create_project(api, "surrogate")["ingestKey"])
    body = b'{"events":[{"message":"ok"},{"message":"cut \\ud83d"}]}'
    r = httpx.post(f"{server.url}/v1/ingest", params={"key": key}, content=body,
                   headers={"Content-Type": "text/plain"})
    assert r.status_code == 202 and r.json() == {"accepted": 2, "rejected": []}
    rows = api.get("/v1/projects/surrogate/logs").json()["rows"]
    assert sorted(row["message"] for row in rows) == ["cut \ufffd", "ok"]

    # After a malformed event, too: the strict pass stops at it, before the surrogate.
    body = b'{"events":[{"message":"x","ts":1e999},{"message":"cut again \\ud800"}]}'
    r = httpx.post(f"{server.url}/v1/ingest", params={"key": key}, content=body,
                   headers={"Content-Type": "text/plain"})
    assert r.status_code == 202, r.text
    assert r.json()["accepted"] == 1 and [e["index"] for e in r.json()["rejected"]] == [0]
    rows = api.get("/v1/projects/surrogate/logs").json()["rows"]
    assert "cut again \ufffd" in [row["message"] for row in rows]


def test_a_chunked_body_is_read_and_held_to_the_limit(server: Server, api: httpx.Client) -> None:
    """No Content-Length (Transfer-Encoding: chunked): the body is read as it comes and
    refused as soon as it passes the limit."""
    key = str(create_project(api, "chunked")["ingestKey"])

    def small() -> Iterator[bytes]:
        yield b'{"events": ['
        yield b'{"message": "sent in chunks"}'
        yield b"]}"

    def huge() -> Iterator[bytes]:
        yield b'{"events": [{"message": "'
        for _ in range(40):
            yield b"a" * (64 << 10)
        yield b'"}]}'

    sent = {"Content-Type": "application/json"}
    r = httpx.post(f"{server.url}/v1/ingest", params={"key": key}, content=small(), headers=sent)
    assert r.status_code == 202, r.text
    r = httpx.post(f"{server.url}/v1/ingest", params={"key": key}, content=huge(), headers=sent)
    assert r.status_code == 413
    assert error_code(r) == "body_too_large"
    rows = api.get("/v1/projects/chunked/logs").json()["rows"]
    assert [row["message"] for row in rows] == ["sent in chunks"]


def test_a_client_gone_mid_body_leaves_no_trace(server: Server, api: httpx.Client) -> None:
    key = str(create_project(api, "gone")["ingestKey"])
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    for _ in range(5):
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            sock.sendall(f"POST /v1/ingest?key={key} HTTP/1.1\r\nHost: x\r\n"
                         "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
                         '{"events": [{"message": "cut'.encode())
    r = httpx.post(f"{server.url}/v1/ingest", params={"key": key}, json={"events": [GOOD]})
    assert r.status_code == 202
    assert [row["message"] for row in api.get("/v1/projects/gone/logs").json()["rows"]] == ["good"]
    assert not [line for line in server.output if "internal error" in line or "Traceback" in line]


def test_gzip_members_are_read_and_trailing_bytes_refused(server: Server,
                                                          api: httpx.Client) -> None:
    key = str(create_project(api, "members")["ingestKey"])
    zipped = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    # Two gzip members (RFC 1952) make one body.
    body = gzip.compress(b'{"events": [{"message": "first half') + gzip.compress(b' and'
                                                                                 b' more"}]}')
    r = httpx.post(f"{server.url}/v1/ingest", params={"key": key}, content=body, headers=zipped)
    assert r.status_code == 202, r.text
    # Bytes after the stream that are not another member are an error, not silently dropped.
    body = gzip.compress(b'{"events": [{"message": "x"}]}') + b"GARBAGE"
    r = httpx.post(f"{server.url}/v1/ingest", params={"key": key}, content=body, headers=zipped)
    assert r.status_code == 400 and error_code(r) == "invalid_body"
    assert [row["message"] for row in api.get("/v1/projects/members/logs").json()["rows"]] == [
        "first half and more"]
    # Members past MAX_GZIP_MEMBERS are refused before they are inflated: each member's end
    # copies the rest of the body, and 52,000 empty ones held the server for seconds.
    empty = gzip.compress(b"", mtime=0)
    for members, status in ((MAX_GZIP_MEMBERS, 202), (MAX_GZIP_MEMBERS + 1, 400),
                            (52_000, 400)):
        body = empty * (members - 1) + gzip.compress(b'{"events": [{"message": "m"}]}')
        r = httpx.post(f"{server.url}/v1/ingest", params={"key": key}, content=body,
                       headers=zipped, timeout=30)
        assert r.status_code == status, r.text
        if status == 400:
            assert error_code(r) == "invalid_body" and "members" in r.json()["error"]["message"]


def test_preflight_refusals_have_the_error_shape(server: Server, api: httpx.Client) -> None:
    create_project(api, "preflight", ["https://app.example.com"])
    key = api.get("/v1/projects/preflight").json()["ingestKey"]
    url = f"{server.url}/v1/ingest"
    asked = {"Access-Control-Request-Method": "POST"}
    r = httpx.options(url, params={"key": "bti_nope"},
                      headers={"Origin": "https://app.example.com", **asked})
    assert r.status_code == 401 and error_code(r) == "unknown_ingest_key"
    r = httpx.options(url, params={"key": key},
                      headers={"Origin": "https://other.example.com", **asked})
    assert r.status_code == 403 and error_code(r) == "origin_not_allowed"
    r = httpx.options(url, params={"key": key},
                      headers={"Origin": "https://app.example.com", **asked})
    assert r.status_code == 204
    assert r.headers["access-control-allow-origin"] == "https://app.example.com"


def test_repeated_headers_are_read_as_the_first(server: Server, api: httpx.Client) -> None:
    """Every path (the ingest POST, the preflight) judges the first of repeated headers."""
    create_project(api, "repeated", ["https://app.example.com"])
    key = api.get("/v1/projects/repeated").json()["ingestKey"]
    url = f"{server.url}/v1/ingest"
    good, evil = ("origin", "https://app.example.com"), ("origin", "https://evil.example.com")
    for origins, status in (([good, evil], 202), ([evil, good], 403)):
        for path in (url, url + "/"):  # a trailing slash reaches the same code
            r = httpx.post(path, params={"key": key}, json={"events": [GOOD]}, headers=origins)
            assert r.status_code == status, (path, origins, r.text)
        r = httpx.options(url, params={"key": key}, headers=origins)
        assert r.status_code == (204 if status == 202 else 403), origins
    r = httpx.post(url, params={"key": key}, content=b'{"events": []}',
                   headers=[("content-type", "application/json"), ("content-type", "image/png")])
    assert r.status_code == 202


def test_attribute_keys_never_become_metric_labels(own_server: Server,
                                                   own_api: httpx.Client) -> None:
    key = str(create_project(own_api, "p")["ingestKey"])
    events = [{"message": "x", "attrs": {f"key-{i},{i}": "v" * 2000}} for i in range(50)]
    r = httpx.post(f"{own_server.url}/v1/ingest", params={"key": key}, json={"events": events})
    assert r.status_code == 202
    metrics = own_api.get("/metrics").text
    assert 'boxtrail_events_truncated_total{field="attrs.value"} 50' in metrics
    assert "key-" not in metrics
    rows = own_api.get("/v1/projects/p/logs", params={"limit": 50}).json()["rows"]
    assert sorted(row["truncated"][0] for row in rows) == sorted(
        f"attrs.key-{i},{i}" for i in range(50))


def test_tokens_are_spent_only_on_batches_that_could_be_stored(tmp_path: object) -> None:
    """A 400 costs no tokens; a 503 gives its tokens back; a batch over the burst is told
    to come back when the bucket is full, not when it would hold the whole batch."""
    from pathlib import Path
    server = Server(Path(str(tmp_path)) / "d", {
        "BOXTRAIL_RATE_LIMIT_EVENTS": "10", "BOXTRAIL_RATE_LIMIT_BURST": "100",
        "BOXTRAIL_BUFFER_MAX_ROWS": "60", "BOXTRAIL_FLUSH_INTERVAL_S": "3600"}).start()
    try:
        with server.client() as api:
            key = str(create_project(api, "p")["ingestKey"])
            url = f"{server.url}/v1/ingest"
            bad_box = {"context": {"boxId": "../x"}, "events": [GOOD] * 100}
            r = httpx.post(url, params={"key": key}, json=bad_box)
            assert r.status_code == 400
            # The bucket is still full: 70 events pass (and fill the buffer past its cap).
            assert httpx.post(url, params={"key": key},
                              json={"events": [GOOD] * 70}).status_code == 202
            # 30 left: the buffer refuses these 30 with 503, twice; had the tokens been
            # kept, the second try would be a 429.
            for _ in range(2):
                r = httpx.post(url, params={"key": key}, json={"events": [GOOD] * 30})
                assert r.status_code == 503 and error_code(r) == "overloaded", r.text
            # 150 events (over the burst of 100) with 30 tokens: back in (100 - 30) / 10 s.
            r = httpx.post(url, params={"key": key}, json={"events": [GOOD] * 150})
            assert r.status_code == 429
            assert int(r.headers["retry-after"]) == 7
    finally:
        server.stop()
