"""Sentry envelopes (ingest.envelope, ingest.sentry): the frame, what items become, and the
endpoints as Sentry's SDKs use them, against the real server."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import brotli  # type: ignore[import-untyped]
import httpx
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from ingest.envelope import split, to_events
from ingest.errors import InvalidBody
from tests.e2e.test_hostile_roundtrip import read_tail
from tests.query.test_mcp import call, payload, run
from tests.support.server import Server, create_project, search_all


def envelope(*items: tuple[dict[str, Any], bytes], header: dict[str, Any] | None = None,
             lengths: bool = True) -> bytes:
    out = [json.dumps(header or {"event_id": "e" * 32}).encode()]
    for item_header, body in items:
        if lengths:
            item_header = {**item_header, "length": len(body)}
        out += [json.dumps(item_header).encode(), body]
    return b"\n".join(out) + b"\n"


def item(kind: str, payload: object, **headers: object) -> tuple[dict[str, Any], bytes]:
    return {"type": kind, **headers}, json.dumps(payload).encode()


THROWN = {"type": "TypeError", "value": "x is undefined",
          "mechanism": {"type": "onerror", "handled": False},
          "stacktrace": {"frames": [
              {"abs_path": "https://b.example/app.js", "function": "main", "lineno": 1,
               "colno": 5, "in_app": True},
              {"abs_path": "https://b.example/app.js", "function": "render", "lineno": 3,
               "colno": 17, "in_app": True}]}}
EVENT = {"event_id": "e" * 32, "timestamp": 1_790_000_000.25, "level": "error",
         "contexts": {"trace": {"trace_id": "t" * 32, "data": {"nested": 1}},
                      "os": {"name": "Linux"}, "weird": "not an object"},
         "release": "2.1", "environment": "prod", "tags": [["feature", "cart"]],
         "user": {"id": 42, "email": "a@b.example"},
         "request": {"url": "https://b.example/cart", "headers": {"User-Agent": "UA/9"}},
         "debug_meta": {"images": [{"type": "sourcemap", "code_file": "https://b.example/app.js",
                                    "debug_id": "0f9e1b2c-3d4e-4f5a-8b6c-7d8e9f0a1b2c"}]},
         "exception": {"values": [{"type": "Error", "value": "the cause"}, THROWN]}}
LOGS = {"items": [
    {"timestamp": 1_790_000_001.5, "level": "warn", "body": "stock low", "trace_id": "t" * 32,
     "severity_number": 13, "attributes": {
         "sku": {"value": "A-1", "type": "string"}, "left": {"value": 3, "type": "integer"},
         "ratio": {"value": 0.5, "type": "double"}, "ok": {"value": False, "type": "boolean"}}},
    {"timestamp": 1_790_000_002, "level": "fatal", "body": "gone", "attributes": {}}]}


# --- the frame -------------------------------------------------------------------------


def test_items_with_and_without_length() -> None:
    raw = envelope(item("event", {"a": 1}), item("log", LOGS), lengths=False)
    header, items = split(raw)
    _, with_lengths = split(envelope(item("event", {"a": 1}), item("log", LOGS)))
    assert [(i.type, i.payload) for i in items] == [(i.type, i.payload) for i in with_lengths]
    assert header == {"event_id": "e" * 32}
    assert [i.type for i in items] == ["event", "log"]
    # A payload may hold newlines when its length is given; no trailing newline is fine.
    payload = b'{"message":\n"two\\nlines"}'
    header, [one] = split(b'{}\n{"type":"event","length":%d}\n%s' % (len(payload), payload))
    assert one.payload == payload


@pytest.mark.parametrize("raw", [
    b"", b"\n", b"not json\n", b"[]\n", b'{}\n{"length": 2}\n{}\n', b'{}\nnope\n{}\n',
    b'{}\n{"type": "event", "length": 10}\n{}\n',  # shorter than its length
    b'{}\n{"type": "event", "length": 1}\n{}\n',  # longer than its length
    b'{}\n{"type": "event", "length": -1}\n{}\n', b'{}\n{"type": "event", "length": "2"}\n{}\n',
    b'{}\n{"type": 7}\n{}\n', b"{}\n" + b'{"type":"x","length":0}\n\n' * 1001,
    b"{}\n" + b"[" * 100_000,
])
def test_a_broken_frame_refuses_the_envelope(raw: bytes) -> None:
    with pytest.raises(InvalidBody):
        split(raw)


# --- what items become -------------------------------------------------------------------


def test_an_event_becomes_one_error_row_with_its_context() -> None:
    out = to_events(*split(envelope(item("event", EVENT))), 1000)
    [row] = out.events
    assert (row.level, row.ts, row.url) == ("error", 1_790_000_000_250, "https://b.example/cart")
    assert row.message == "TypeError: x is undefined"
    assert row.error is not None and row.error.type == "TypeError"
    # The exception thrown (last in Sentry's list), its frames innermost first, as V8 prints.
    assert row.error.stack == ("TypeError: x is undefined\n"
                               "    at render (https://b.example/app.js:3:17)\n"
                               "    at main (https://b.example/app.js:1:5)")
    assert json.loads(bytes(row.attrs)) == {
        "feature": "cart", "user.id": 42, "user.email": "a@b.example", "environment": "prod",
        "trace.trace_id": "t" * 32, "os.name": "Linux", "sentry.event_id": "e" * 32}
    context = out.context()
    assert (context.release, context.user_agent) == ("2.1", "UA/9")
    assert context.debug_ids == {"https://b.example/app.js":
                                 "0f9e1b2c-3d4e-4f5a-8b6c-7d8e9f0a1b2c"}


def test_capture_message_is_a_log_line_not_an_error() -> None:
    message = {"message": "checkout opened", "level": "info", "exception": {"values": [
        {"value": "checkout opened", "mechanism": {"type": "generic", "synthetic": True},
         "stacktrace": {"frames": [{"abs_path": "https://b.example/app.js", "lineno": 1}]}}]}}
    [row] = to_events(*split(envelope(item("event", message))), 1000).events
    assert (row.level, row.message, row.error) == ("info", "checkout opened", None)


def test_log_items_become_rows_with_typed_attributes() -> None:
    rows = to_events(*split(envelope(item("log", LOGS, item_count=2))), 1000).events
    assert [(r.level, r.message, r.ts) for r in rows] == [
        ("warn", "stock low", 1_790_000_001_500), ("error", "gone", 1_790_000_002_000)]
    assert json.loads(bytes(rows[0].attrs)) == {"sku": "A-1", "left": 3, "ratio": 0.5,
                                                "ok": False}


def test_other_items_are_dropped_and_a_broken_item_alone() -> None:
    raw = envelope(item("session", {"sid": "s"}), item("event", {"message": "kept"}),
                   ({"type": "event"}, b"{not json"), item("transaction", {}),
                   ({"type": "log"}, b"\xff\xfe"), item("mystery", [1]))
    out = to_events(*split(raw), 1000)
    assert [e.message for e in out.events] == ["kept"]
    assert out.dropped == ["session", "invalid_event", "transaction", "invalid_log", "mystery"]


# --- the endpoints, on the real server ---------------------------------------------------


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, dict[str, Any]]]:
    # No flush until a restart: the last test reads what the fuzz stored from the live
    # buffer, then from Parquet.
    srv = Server(tmp_path_factory.mktemp("sentry") / "data",
                 {"BOXTRAIL_FLUSH_INTERVAL_S": "3600"}).start()
    with srv.client() as api:
        project = create_project(api, "shop", ["https://*.box.parallelsandbox.com"])
    yield srv, project
    srv.stop()


def post(server: Server, project: dict[str, Any], body: bytes, *, path_id: object = None,
         headers: dict[str, str] | None = None, kind: str = "envelope",
         key: str | None = None) -> httpx.Response:
    params = {"sentry_version": "7", "sentry_client": "sentry.javascript.browser/11.12.0"}
    params["sentry_key"] = key if key is not None else project["sentryKey"]
    return httpx.post(f"{server.url}/api/{path_id or project['sentryId']}/{kind}/",
                      params=params, content=body,
                      headers={"Content-Type": "text/plain;charset=UTF-8", **(headers or {})})


def rows(server: Server, project: str = "shop", **params: str) -> list[dict[str, Any]]:
    with server.client() as api:
        r = api.get(f"/v1/projects/{project}/logs", params={"since": "5000w", **params})
        assert r.status_code == 200, r.text
        return r.json()["rows"]  # type: ignore[no-any-return]


def test_an_envelope_is_stored_and_read_back(live: tuple[Server, dict[str, Any]]) -> None:
    server, project = live
    assert project["dsn"] == (f"http://{project['sentryKey']}@"
                              f"{server.url.split('://')[1]}/{project['sentryId']}")
    origin = "https://b7.box.parallelsandbox.com"
    r = post(server, project, envelope(item("event", EVENT), item("log", LOGS),
                                       item("client_report", {})), headers={"Origin": origin})
    assert r.status_code == 200, r.text
    assert r.json() == {"id": "e" * 32}
    assert r.headers["access-control-allow-origin"] == origin
    assert "X-Sentry-Rate-Limits" in r.headers["access-control-expose-headers"]
    got = {row["message"]: row for row in rows(server, boxId="b7")}
    assert set(got) == {"TypeError: x is undefined", "stock low", "gone"}
    error = got["TypeError: x is undefined"]
    assert (error["release"], error["url"]) == ("2.1", "https://b.example/cart")
    assert got["stock low"]["attrs"] == {"sku": "A-1", "left": 3, "ratio": 0.5, "ok": False}
    with server.client() as api:
        errors = api.get("/v1/projects/shop/errors",
                         params={"since": "5000w", "boxId": "b7"}).json()["rows"]
        # The fatal log line is an error row too (level error), without frames.
        assert sorted(r["message"] for r in errors) == ["TypeError: x is undefined", "gone"]
        [frames] = [r["error"]["frames"] for r in errors if r["error"]["frames"]]
        assert [(f["function"], f["line"], f["column"]) for f in frames] == [
            ("render", 3, 17), ("main", 1, 5)]
        metrics = api.get("/metrics").text
    assert 'boxtrail_sentry_items_total{type="client_report",outcome="dropped"}' in metrics


def test_the_key_in_the_auth_header_and_the_store_endpoint(
        live: tuple[Server, dict[str, Any]]) -> None:
    server, project = live
    auth = f"Sentry sentry_version=7, sentry_client=x/1, sentry_key={project['sentryKey']}"
    r = post(server, project, json.dumps({"message": "via store", "level": "warning",
                                          "tags": {"boxId": "s1"}}).encode(),
             kind="store", key="", headers={"X-Sentry-Auth": auth})
    assert r.status_code == 200, r.text
    assert [(x["level"], x["message"]) for x in rows(server, boxId="s1")] == [
        ("warn", "via store")]


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "br"])
def test_compressed_envelopes(live: tuple[Server, dict[str, Any]], encoding: str) -> None:
    server, project = live
    raw = envelope(item("event", {"message": f"packed {encoding}", "tags": {"boxId": "z"}}))
    body = {"gzip": gzip.compress, "deflate": zlib.compress, "br": brotli.compress}[encoding](raw)
    r = post(server, project, body, headers={"Content-Encoding": encoding})
    assert r.status_code == 200, r.text
    assert f"packed {encoding}" in [x["message"] for x in rows(server, boxId="z")]


def test_refusals_have_the_error_shape_and_store_nothing(
        live: tuple[Server, dict[str, Any]]) -> None:
    server, project = live
    with server.client() as api:
        other = create_project(api, "other")
    before = len(rows(server)) + len(rows(server, "other"))
    raw = envelope(item("event", {"message": "must not be stored"}))
    bomb = gzip.compress(b"{}\n" + b" " * (50 << 20))
    br_bomb = brotli.compress(b"{}\n" + b" " * (50 << 20), quality=1)
    cases = [
        (post(server, project, raw, key="bts_nope"), 401, "unknown_ingest_key"),
        # My key, another project's id: refused, not stored under either.
        (post(server, project, raw, path_id=other["sentryId"]), 401, "project_mismatch"),
        (post(server, project, raw, path_id="abc"), 401, "project_mismatch"),
        (post(server, project, raw, headers={"Origin": "https://evil.example"}), 403,
         "origin_not_allowed"),
        (post(server, project, b"garbage\n"), 400, "invalid_body"),
        (post(server, project, raw, headers={"Content-Encoding": "zstd"}), 415,
         "unsupported_encoding"),
        (post(server, project, br_bomb, headers={"Content-Encoding": "br"}), 413,
         "body_too_large"),
        (post(server, project, brotli.compress(raw)[:-3], headers={"Content-Encoding": "br"}),
         400, "invalid_body"),
        (post(server, project, bomb, headers={"Content-Encoding": "gzip"}), 413,
         "body_too_large"),
        (post(server, project, b"\x1f\x8b" + b"x" * 50, headers={"Content-Encoding": "gzip"}),
         400, "invalid_body"),
        (post(server, project, b"[1]", kind="store"), 400, "invalid_body"),
    ]
    for response, status, code in cases:
        assert (response.status_code, response.json()["error"]["code"]) == (status, code), \
            response.text
    assert len(rows(server)) + len(rows(server, "other")) == before


def test_preflight(live: tuple[Server, dict[str, Any]]) -> None:
    server, project = live
    url = f"{server.url}/api/{project['sentryId']}/envelope/?sentry_key={project['sentryKey']}"
    origin = "https://b1.box.parallelsandbox.com"
    r = httpx.options(url, headers={"Origin": origin, "Access-Control-Request-Method": "POST"})
    assert r.status_code == 204
    assert r.headers["access-control-allow-origin"] == origin
    assert "x-sentry-auth" in r.headers["access-control-allow-headers"].lower()
    r = httpx.options(url, headers={"Origin": "https://evil.example"})
    assert r.status_code == 403


def test_rate_limited_with_sentry_headers(tmp_path: Path) -> None:
    server = Server(tmp_path / "data", {"BOXTRAIL_RATE_LIMIT_EVENTS": "1",
                                        "BOXTRAIL_RATE_LIMIT_BURST": "2"}).start()
    try:
        with server.client() as api:
            project = create_project(api, "slow")
        logs = {"items": [{"timestamp": time.time(), "level": "info", "body": f"l{n}"}
                          for n in range(2)]}
        assert post(server, project, envelope(item("log", logs))).status_code == 200
        r = post(server, project, envelope(item("log", logs)))
        assert r.status_code == 429
        assert int(r.headers["retry-after"]) >= 1
        assert r.headers["x-sentry-rate-limits"].split(":")[0] == r.headers["retry-after"]
        assert len(rows(server, "slow")) == 2
    finally:
        server.stop()


# --- hostile envelopes -----------------------------------------------------------------

# Any code point, lone surrogates too (json.dumps writes them as "\ud800" escapes).
_TEXT = st.text(st.one_of(st.characters(codec=None), st.characters(categories=["Cs"])),
                max_size=30)
_ANY_JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
              st.floats(allow_nan=False, allow_infinity=False), _TEXT),
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12)
_FRAME = st.fixed_dictionaries({}, optional={
    "abs_path": _ANY_JSON, "filename": _ANY_JSON, "function": _ANY_JSON, "lineno": _ANY_JSON,
    "colno": _ANY_JSON, "in_app": _ANY_JSON})
_EVENT = st.fixed_dictionaries({}, optional={
    "event_id": _ANY_JSON, "timestamp": st.one_of(_ANY_JSON, st.floats(-1e20, 1e20),
                                                  st.sampled_from(["2026-01-01T00:00:00",
                                                                   "9999-12-31T23:59:59Z",
                                                                   "0001-01-01", "x"])),
    "level": st.one_of(_ANY_JSON, st.sampled_from(["fatal", "warning", "debug", "WARN"])),
    "message": _ANY_JSON, "logentry": _ANY_JSON, "tags": _ANY_JSON, "user": _ANY_JSON,
    "release": _ANY_JSON, "request": _ANY_JSON, "debug_meta": _ANY_JSON, "sdk": _ANY_JSON,
    "exception": st.one_of(_ANY_JSON, st.fixed_dictionaries({"values": st.lists(
        st.fixed_dictionaries({}, optional={
            "type": _ANY_JSON, "value": _ANY_JSON, "mechanism": _ANY_JSON,
            "stacktrace": st.fixed_dictionaries({"frames": st.lists(_FRAME, max_size=4)})}),
        max_size=3)}))})
# Log lines the compiled core reads (a time, a Sentry level, any text in the body and
# the attributes) beside anything at all, so hostile text reaches every reader both ways.
_NOW_S = time.time()
_LOG = st.fixed_dictionaries({}, optional={
    "timestamp": _ANY_JSON, "level": _ANY_JSON, "body": _ANY_JSON,
    "attributes": st.one_of(_ANY_JSON, st.dictionaries(
        st.text(max_size=10), st.fixed_dictionaries({"value": _ANY_JSON, "type": _ANY_JSON}),
        max_size=5))})
_CORE_LOG = st.fixed_dictionaries({"timestamp": st.floats(_NOW_S - 86_400, _NOW_S)}, optional={
    "level": st.sampled_from(["trace", "info", "warning", "fatal", ""]), "body": st.text(),
    "attributes": st.dictionaries(st.text(max_size=10), st.fixed_dictionaries({"value": st.one_of(
        st.text(), st.integers(-(2**63), 2**63 - 1), st.booleans(), st.none())}), max_size=5)})
_ITEMS = st.lists(st.one_of(
    st.tuples(st.just({"type": "event"}), _EVENT.map(lambda e: json.dumps(e).encode())),
    st.tuples(st.just({"type": "log"}), st.lists(st.one_of(_LOG, _CORE_LOG), max_size=4).map(
        lambda logs: json.dumps({"items": logs}).encode())),
    st.tuples(st.just({"type": "log"}), st.lists(_CORE_LOG, min_size=1, max_size=4).map(
        lambda logs: json.dumps({"items": logs}, ensure_ascii=False).encode(
            errors="surrogatepass"))),
    st.tuples(st.fixed_dictionaries({"type": st.text(min_size=1, max_size=10)}),
              st.binary(max_size=40).filter(lambda b: b"\n" not in b))), max_size=4)


@settings(max_examples=60, deadline=None, derandomize=True, phases=[Phase.generate],
          suppress_health_check=list(HealthCheck))
@given(items=_ITEMS, lengths=st.booleans(), cut=st.integers(0, 3))
def test_hostile_envelopes_never_break_the_server_or_a_read(
        live: tuple[Server, dict[str, Any]], items: list[tuple[dict[str, Any], bytes]],
        lengths: bool, cut: int) -> None:
    server, project = live
    raw = envelope(*items, lengths=lengths)
    raw = raw[:len(raw) - cut]  # sometimes truncated mid-item
    r = post(server, project, raw)
    assert r.status_code in (200, 400, 413), r.text
    if r.status_code != 200:
        assert r.json()["error"]["code"] in ("invalid_body", "too_many_events")
    with server.client() as api:
        for path in ("logs", "errors"):
            answer = api.get(f"/v1/projects/shop/{path}", params={"since": "5000w"})
            assert answer.status_code == 200, answer.text
        grouped = api.get("/v1/projects/shop/errors",
                          params={"since": "5000w", "groupBy": "fingerprint"})
        assert grouped.status_code == 200, grouped.text


def test_frames_are_read_as_sent_not_parsed_from_their_text(
        live: tuple[Server, dict[str, Any]]) -> None:
    """A frame without a position whose file name ends like one prints exactly as a frame
    at line 10, column 20 would: read back from the text, it would be mapped there."""
    server, project = live
    event = {"message": "odd frames", "tags": {"boxId": "frames"}, "exception": {"values": [
        {"type": "Error", "value": "odd", "stacktrace": {"frames": [
            {"abs_path": "https://b.example/app.js:10:20", "function": "noPosition"},
            {"abs_path": "https://b.example/app.js", "function": "g [as h]", "lineno": 2,
             "colno": 7}]}}]}}
    assert post(server, project, envelope(item("event", event))).status_code == 200
    with server.client() as api:
        [row] = api.get("/v1/projects/shop/errors",
                        params={"since": "5000w", "boxId": "frames"}).json()["rows"]
    frames = row["error"]["frames"]
    assert [(f["function"], f["file"], f["line"], f["column"], f["problem"]) for f in frames] == [
        ("g [as h]", "https://b.example/app.js", 2, 7, "missing_sourcemap"),
        ("noPosition", "https://b.example/app.js:10:20", None, None, "no_location")]
    assert row["error"]["rawStack"].endswith("at noPosition (https://b.example/app.js:10:20)")


def test_lone_surrogates_are_kept_replaced_as_on_v1_ingest(
        live: tuple[Server, dict[str, Any]]) -> None:
    server, project = live
    event = {"message": "half \ud83d", "tags": {"boxId": "surrogates", "k\udfff": "v"},
             "exception": {"values": [{"type": "Error", "value": "x", "stacktrace": {"frames": [
                 {"abs_path": "https://b.example/\udc00.js", "function": "f\ud800",
                  "lineno": 1, "colno": 2}]}}]}}
    body = envelope(({"type": "event"}, json.dumps(event).encode()))  # "\ud83d" escapes
    assert b"\\ud83d" in body
    assert post(server, project, body).status_code == 200
    with server.client() as api:
        [row] = api.get("/v1/projects/shop/errors",
                        params={"since": "5000w", "boxId": "surrogates"}).json()["rows"]
    assert row["message"] == "half \ufffd" and row["attrs"]["k\ufffd"] == "v"
    [frame] = row["error"]["frames"]
    assert (frame["function"], frame["file"]) == ("f\ufffd", "https://b.example/\ufffd.js")


def _every_reader(server: Server) -> int:
    """Every row of the project through every reader; the number of rows."""
    with server.client(timeout=30) as api:
        rows = search_all(api, "shop", "5000w")
        for params in ({}, {"groupBy": "fingerprint"}):
            r = api.get("/v1/projects/shop/errors", params={"since": "5000w", **params})
            assert r.status_code == 200, r.text
        tailed = read_tail(api, "shop", {}, "0000000000000000", {str(r["id"]) for r in rows})
        assert len(tailed) >= len(rows)
    for tool in ("logs_search", "logs_errors"):
        assert payload(run(call(server, "auto", tool, {"project": "shop", "since": "5000w"})))
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOXTRAIL_")}
    env.update(BOXTRAIL_URL=server.url, BOXTRAIL_API_KEY=server.api_key)
    out = subprocess.run([sys.executable, "-m", "boxtrail", "search", "--project", "shop",
                          "--since", "5000w", "--limit", "1000", "--json"],
                         env=env, capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return len(rows)


def test_every_reader_returns_what_the_fuzz_stored_before_and_after_the_flush(
        live: tuple[Server, dict[str, Any]]) -> None:
    """Last in this module: the rows every test above stored, the fuzz's among them."""
    server, _ = live
    buffered = _every_reader(server)
    assert buffered > 50
    server.stop()  # flushes everything to Parquet
    server.start()
    assert _every_reader(server) == buffered


@pytest.mark.parametrize("report", [
    {"discarded_events": [{"reason": "ratelimit_backoff", "category": "error", "quantity": 2},
                          {"reason": "sample_rate", "category": "transaction", "quantity": 9},
                          {"reason": ["x"], "category": "log_item", "quantity": 3},
                          {"reason": "queue_overflow", "category": {"a": 1}, "quantity": 4},
                          {"reason": "network_error", "category": "error", "quantity": True},
                          "not an item"]},
    {"discarded_events": "nope"}, [], "text", None])
def test_a_client_report_counts_the_rows_it_says_were_dropped_and_any_json_is_read(
        report: object) -> None:
    out = to_events(*split(envelope(item("client_report", report),
                                    item("event", {"message": "kept"}))), 1000)
    assert [e.message for e in out.events] == ["kept"]
    assert out.discarded == ({"ratelimit_backoff": 2, "other": 3}
                             if isinstance(report, dict) and isinstance(
                                 report.get("discarded_events"), list) else {})
