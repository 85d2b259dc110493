"""Values ingest accepted and a reader once choked on (issue: every page holds the ingest
key), one test each, before and after the flush. ``test_hostile_roundtrip`` generates the
class; these pin the cases that were found."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from boxtrail_client.cli import format_row
from query.rows import to_row
from tests.support.server import Server, create_project
from tests.support.sse import messages

NOW_MS = int(time.time() * 1000)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    # Flushes only when asked (a restart): each test reads the live buffer, then Parquet.
    srv = Server(tmp_path_factory.mktemp("poison") / "data",
                 {"BOXTRAIL_FLUSH_INTERVAL_S": "3600"})
    yield srv.start()
    srv.stop()


def send(server: Server, key: str, events: list[dict[str, object]] | bytes,
         **context: object) -> dict[str, object]:
    if isinstance(events, bytes):
        content = b'{"context": %s, "events": %s}' % (
            httpx.Response(200, json=context).content, events)
    else:
        content = httpx.Response(200, json={"context": context, "events": events}).content
    r = httpx.post(f"{server.url}/v1/ingest", params={"key": key}, content=content, timeout=10)
    assert r.status_code == 202, r.text
    return r.json()  # type: ignore[no-any-return]


def logs(api: httpx.Client, project: str, **params: str) -> list[dict[str, object]]:
    r = api.get(f"/v1/projects/{project}/logs", params={"since": "1d", **params})
    assert r.status_code == 200, r.text
    return r.json()["rows"]  # type: ignore[no-any-return]


def flushed(server: Server) -> None:
    server.stop()
    server.start()


def test_attrs_out_of_float_range_are_refused_and_duplicates_read_one_way(
        server: Server) -> None:
    with server.client() as api:
        key = str(create_project(api, "numbers")["ingestKey"])
        # Valid as sent in every other way: the batch takes ingest's fast path.
        answer = send(server, key, b"""[
            {"ts": %d, "message": "inf", "attrs": {"a": 1e999}},
            {"ts": %d, "message": "ninf", "attrs": {"a": -1e999, "b": 2}},
            {"ts": %d, "message": "dup", "attrs": {"k": "first", "k": "last", "n": 1E2}},
            {"ts": %d, "message": "big", "attrs": {"n": 123456789012345678901234567890}}]"""
                      % ((NOW_MS,) * 4))
        assert answer["accepted"] == 2
        assert [r["index"] for r in answer["rejected"]] == [0, 1]  # type: ignore[index]
    for flush in (False, True):  # before and after the flush (a restart: a new port)
        if flush:
            flushed(server)
        with server.client() as api:
            rows = {r["message"]: r for r in logs(api, "numbers")}
            assert rows["dup"]["attrs"] == {"k": "first", "n": 100.0}
            assert rows["big"]["attrs"] == {"n": 123456789012345678901234567890}
            # The search reads the value the row shows (the first, as DuckDB's json_extract).
            assert [r["message"] for r in logs(api, "numbers", query="attr.k:first")] == ["dup"]
            assert logs(api, "numbers", query="attr.k:last") == []
            assert api.get("/v1/projects/numbers/errors", params={"since": "1d"}).status_code \
                == 200


@pytest.mark.parametrize("box", ["123", "0123", "2026-01-01", "1e5", "true", "nan"])
def test_box_ids_that_look_like_numbers_or_dates_come_back_as_sent(
        server: Server, box: str) -> None:
    project = f"box-{box}"
    with server.client() as api:
        key = str(create_project(api, project)["ingestKey"])
        send(server, key, [{"message": "in a box"}], boxId=box)
        send(server, key, [{"message": "no box"}])
    flushed(server)
    with server.client() as api:
        rows = logs(api, project)
        assert sorted((r["message"], r["boxId"]) for r in rows) == [("in a box", box),
                                                                    ("no box", None)]
        assert [r["boxId"] for r in logs(api, project, boxId=box)] == [box]
        assert [r["boxId"] for r in logs(api, project, query=f'box:"{box}"')] == [box]


def test_windows_and_cursors_out_of_range_are_answered(server: Server) -> None:
    with server.client() as api:
        create_project(api, "ranges")
        for since in ("999999999w", "9999-12-31T23:59:59-14:00", "0001-01-01T00:00:00+14:00"):
            r = api.get("/v1/projects/ranges/logs", params={"since": since})
            assert r.status_code == 200, (since, r.text)
            r = api.get("/v1/projects/ranges/errors", params={"since": since})
            assert r.status_code == 200, (since, r.text)
        # Cursors that decode but hold values no page ever had, and ones that do not decode.
        for cursor in ("kc__________8", "ks8AAAD_____zwAAAAAAAAAA", "A" * 5000, "!!"):
            r = api.get("/v1/projects/ranges/logs", params={"cursor": cursor})
            assert r.status_code == 400, (cursor, r.text)
            assert r.json()["error"]["detail"] == {"parameter": "cursor"}
        for last in ("f" * 17, "ffffffffffffffff", "1" * 5000, "0x10", "1_0", "-1"):
            r = api.get("/v1/projects/ranges/tail", headers={"Last-Event-ID": last})
            assert r.status_code == 400, (last, r.text)  # before the stream starts
            assert r.json()["error"]["detail"] == {"parameter": "Last-Event-ID"}


def test_a_timestamp_from_the_future_is_marked_and_counted(server: Server) -> None:
    with server.client() as api:
        key = str(create_project(api, "future")["ingestKey"])
        before = api.get("/metrics").text
        send(server, key, [{"message": "ahead", "ts": NOW_MS + 86_400_000},
                           {"message": "on time", "ts": NOW_MS}])
        rows = {r["message"]: r for r in logs(api, "future")}
        assert rows["ahead"]["truncated"] == ["ts"]
        assert rows["on time"]["truncated"] is None
        metric = 'boxtrail_events_truncated_total{field="ts"}'
        counted = [line for line in api.get("/metrics").text.splitlines()
                   if line.startswith(metric)]
        assert counted and counted[0] != next(
            (line for line in before.splitlines() if line.startswith(metric)), None)


def test_line_separators_never_split_a_tail_frame(server: Server) -> None:
    text = "a\u2028b\u2029c\x85d\re\nf"
    with server.client() as api:
        key = str(create_project(api, "lines")["ingestKey"])
        send(server, key, [{"message": text, "attrs": {"k\u2028": "v\x85"}}])
        with api.stream("GET", "/v1/projects/lines/tail", headers={"Last-Event-ID": "0"},
                        timeout=httpx.Timeout(10, read=10)) as response:
            # httpx splits lines as str.splitlines does: on U+2028 and NEL too.
            first = next(m for m in messages(response) if m.event == "log")
        assert first.json()["message"] == text
        assert first.json()["attrs"] == {"k\u2028": "v\x85"}


def test_a_stored_value_no_reader_can_decode_comes_back_raw_and_marked() -> None:
    # As rows stored before ingest refused such attrs read back from Parquet.
    row = to_row((1, NOW_MS, "info", "m", None, None, None, None, '{"a": 1e999}', None, None,
                  None, None))
    assert row.attrs == {}
    assert row.raw_attrs == '{"a": 1e999}'
    assert row.problem is not None and row.problem.startswith("unreadable_attrs")


def test_the_terminal_shows_escapes_not_control_characters() -> None:
    row = {"ts": "t", "level": "error", "boxId": "b\x1b[2J", "message": "x\x1b]0;pwned\x07\nFAKE",
           "error": {"stack": "E\n    at f (\u202eevil.js:1:1)\r"}}
    shown = format_row(row, color=False)
    assert "\x1b" not in shown and "\x07" not in shown and "\r" not in shown
    assert "\u202e" not in shown
    assert shown.count("\n") == 2  # the row's line and the stack's two lines
    assert "\\u001b" in shown


def test_a_frame_url_that_does_not_parse_leaves_the_errors_page_up(server: Server) -> None:
    with server.client() as api:
        key = str(create_project(api, "urls")["ingestKey"])
        stack = "TypeError: x\n    at f (https://[x/app.js:1:2)\n    at g (https://a.test/b.js:3:4)"
        send(server, key, [{"level": "error", "message": "bad url",
                            "error": {"type": "TypeError", "stack": stack}}])
        for params in ({}, {"groupBy": "fingerprint"}):
            r = api.get("/v1/projects/urls/errors", params={"since": "1d", **params})
            assert r.status_code == 200, r.text
        [row] = api.get("/v1/projects/urls/errors", params={"since": "1d"}).json()["rows"]
        assert row["error"]["frames"][0]["file"] == "https://[x/app.js"
