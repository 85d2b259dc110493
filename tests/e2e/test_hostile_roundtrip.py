"""What ingest accepts, every reader returns intact: a property over the whole wire format.

Hypothesis draws hostile bodies (``tests/support/hostile.py``) and posts them to the real server,
on local disk and on the real S3 server. Each accepted event must come back as sent from
``/logs`` (by session, by box parameter, by ``box:`` query), ``/errors`` (with and without
``groupBy``), a resumed ``/tail`` and two live tails (with and without a query) while the
rows are in the live buffer; then, after a restart has flushed everything to Parquet, from
the same reads, the three MCP tools and ``boxtrail search|tail``. Every hostile row stays
in the window for every later read: one bad row must never fail a page, a tail or a call.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.query.test_mcp import call, payload, run
from tests.support import hostile
from tests.support.s3server import S3Server
from tests.support.server import Server, create_project
from tests.support.sse import Tail, messages

SINCE = "5000w"  # every row ever sent
EXAMPLES = int(os.environ.get("HOSTILE_EXAMPLES", "40"))
APP_JS = b"function f(){throw new Error('x')}\nf();\n"
APP_MAP = json.dumps({"version": 3, "sources": ["src/app.js"], "names": [],
                      "mappings": "AAAA;AACA", "sourcesContent": ["boom()\nagain()\n"]}).encode()


@pytest.fixture(params=["local", "s3"])
def storage_env(request: pytest.FixtureRequest) -> dict[str, str]:
    if request.param == "local":
        return {}
    s3: S3Server = request.getfixturevalue("s3_server")
    return {**s3.env(), "BOXTRAIL_S3_BUCKET": request.getfixturevalue("s3_bucket"),
            "BOXTRAIL_S3_PREFIX": "hostile"}


@pytest.fixture
def server(tmp_path: Path, storage_env: dict[str, str]) -> Iterator[Server]:
    # No flush until the restart: the first reads see the live buffer only.
    srv = Server(tmp_path / "data", {**storage_env, "BOXTRAIL_FLUSH_INTERVAL_S": "3600"})
    yield srv.start()
    srv.stop()
    print("".join(srv.output[-80:]))  # shown by pytest when the test failed


class Ledger:
    """Every body posted, what it must read back as, and when it was posted."""

    def __init__(self) -> None:
        self.sent: list[tuple[hostile.Body, list[str], tuple[int, int]]] = []

    def rows(self) -> Iterator[tuple[str, hostile.Sent, tuple[int, int]]]:
        for body, ids, window in self.sent:
            yield from ((i, s, window) for i, s in zip(ids, body.accepted(), strict=True))


def post(server: Server, key: str, body: hostile.Body) -> tuple[list[str], tuple[int, int]]:
    before = int(time.time() * 1000)
    r = httpx.post(f"{server.url}/v1/ingest", params={"key": key}, content=body.text(),
                   headers={"Content-Type": "application/json"}, timeout=30)
    after = int(time.time() * 1000)
    if body.refused():
        assert r.status_code == 400, r.text
        assert r.json()["error"]["code"] == "invalid_body"
        return [], (before, after)
    assert r.status_code == 202, r.text
    answer = r.json()
    assert [x["index"] for x in answer["rejected"]] == body.rejected(), answer
    assert answer["accepted"] == len(body.accepted())
    return [], (before, after)


def session_rows(api: httpx.Client, project: str, session: str) -> list[dict[str, Any]]:
    r = api.get(f"/v1/projects/{project}/logs",
                params={"since": SINCE, "limit": 1000, "query": f'session:"{_quote(session)}"'})
    assert r.status_code == 200, r.text
    return sorted(r.json()["rows"], key=lambda row: row["id"])


def _quote(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def check_body(api: httpx.Client, project: str, body: hostile.Body, ids: list[str],
               window: tuple[int, int]) -> None:
    """Every read of one body's rows, by session, box and box query, errors, resumed tail."""
    rows = session_rows(api, project, body.session)
    assert len(rows) == len(body.accepted()), rows
    for row, sent in zip(rows, body.accepted(), strict=True):
        hostile.check_row(row, sent, window)
    if not ids:
        ids += [row["id"] for row in rows]
    assert [row["id"] for row in rows] == ids
    by_id = {row["id"]: row for row in rows}
    for params in ({"boxId": body.box}, {"query": f'box:"{_quote(body.box)}"'}):
        r = api.get(f"/v1/projects/{project}/logs", params={"since": SINCE, "limit": 1000,
                                                             **params})
        assert r.status_code == 200, r.text
        mine = [row for row in r.json()["rows"] if row["id"] in by_id]
        assert sorted(mine, key=lambda row: row["id"]) == rows, params
        assert all(row["boxId"] == body.box for row in r.json()["rows"])
    r = api.get(f"/v1/projects/{project}/errors",
                params={"since": SINCE, "limit": 1000, "boxId": body.box})
    assert r.status_code == 200, r.text
    errors = {row["id"]: row for row in r.json()["rows"]}
    for event_id, sent in zip(ids, body.accepted(), strict=True):
        assert sent.row is not None
        if sent.row["level"] == "error" or sent.row["error"] is not None:
            got = errors[event_id]
            hostile.check_row(got, sent, window)
            for frame in got["error"]["frames"]:
                assert frame["symbolicated"] or frame["problem"] or frame["file"] is None \
                    or frame["raw"].endswith("[native code]"), frame
    r = api.get(f"/v1/projects/{project}/errors",
                params={"since": SINCE, "groupBy": "fingerprint", "boxId": body.box})
    assert r.status_code == 200, r.text
    # The tail, resumed from just before the body's first row.
    if ids:
        before_first = f"{int(ids[0], 16) - 1:016x}"
        tailed = read_tail(api, project, {"boxId": body.box}, before_first, set(ids))
        for event_id, sent in zip(ids, body.accepted(), strict=True):
            hostile.check_row(tailed[event_id], sent, window)


def read_tail(api: httpx.Client, project: str, params: dict[str, str], last_id: str,
              wanted: set[str]) -> dict[str, dict[str, Any]]:
    got: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + 20
    with api.stream("GET", f"/v1/projects/{project}/tail", params=params,
                    headers={"Last-Event-ID": last_id},
                    timeout=httpx.Timeout(10, read=10)) as response:
        assert response.status_code == 200
        for message in messages(response):
            if message.event == "log":
                row = message.json()
                got[str(row["id"])] = row
            assert message.event in ("log", None), message
            if wanted <= set(got) or time.monotonic() > deadline:
                break
    assert wanted <= set(got), wanted - set(got)
    return got


def test_what_ingest_accepts_every_reader_returns_intact(server: Server) -> None:
    with server.client(timeout=30) as api:
        project = create_project(api, "hostile")
        name, key = str(project["name"]), str(project["ingestKey"])
        r = api.post(f"/v1/projects/{name}/sourcemaps", data={"urlPrefix": "~/"},
                     files=[("file", ("app.min.js", APP_JS)),
                            ("file", ("app.min.js.map", APP_MAP))])
        assert r.status_code == 201, r.text
        live = Tail(api, f"/v1/projects/{name}/tail")
        live_queried = Tail(api, f"/v1/projects/{name}/tail",
                            params={"query": "-zzzqqqzzz"})
        ledger = Ledger()

        # No shrinking: every example leaves its rows in the one server, so a smaller
        # example is not the same test; the failing body is reported as drawn.
        @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck), phases=[Phase.generate],
                  report_multiple_bugs=False)
        @given(data=st.data())
        def before_flush(data: st.DataObject) -> None:
            body = data.draw(hostile.bodies(uuid.uuid4().hex))
            ids, window = post(server, key, body)
            check_body(api, name, body, ids, window)
            ledger.sent.append((body, ids, window))

        before_flush()
        assert ledger.sent
        # Both live tails saw every accepted row, intact.
        expected = {i: (s, w) for i, s, w in ledger.rows()}
        for tail in (live, live_queried):
            deadline = time.monotonic() + 20
            while not set(expected) <= {str(r["id"]) for r in tail.logs()}:
                assert time.monotonic() < deadline, "a live tail missed rows"
                time.sleep(0.1)
            tail.close()
            for row in tail.logs():
                if str(row["id"]) in expected:
                    hostile.check_row(row, *expected[str(row["id"])])

    server.stop()  # the final flush: every row to Parquet
    server.start()
    with server.client(timeout=30) as api:
        metrics = api.get("/metrics").text
        assert "\nboxtrail_buffer_rows 0" in metrics
        for body, ids, window in ledger.sent:
            check_body(api, name, body, ids, window)
        check_whole_window(api, server, name, expected)


def check_whole_window(api: httpx.Client, server: Server, project: str,
                       expected: dict[str, tuple[hostile.Sent, tuple[int, int]]]) -> None:
    """Reads over every hostile row at once: pages, errors, MCP tools, the CLI."""
    seen: dict[str, dict[str, Any]] = {}
    cursor = None
    while True:
        params: dict[str, str | int] = {"since": SINCE, "limit": 7}  # many pages
        if cursor:
            params["cursor"] = cursor
        r = api.get(f"/v1/projects/{project}/logs", params=params)
        assert r.status_code == 200, r.text
        seen |= {row["id"]: row for row in r.json()["rows"]}
        cursor = r.json()["nextCursor"]
        if not cursor:
            break
    assert set(seen) == set(expected)
    for event_id, (sent, window) in expected.items():
        hostile.check_row(seen[event_id], sent, window)
    for params in ({}, {"groupBy": "fingerprint"}):
        r = api.get(f"/v1/projects/{project}/errors", params={"since": SINCE, **params})
        assert r.status_code == 200, r.text

    for tool, arguments in (("logs_search", {}), ("logs_errors", {}),
                            ("logs_search", {"query": "-zzzqqqzzz"})):
        result = payload(run(call(server, "auto", tool,
                                  {"project": project, "since": SINCE, **arguments})))
        assert result["rows"], tool
        for row in result["rows"]:
            sent, window = expected[row["id"]]
            hostile.check_row(_uncompact(row), sent, window)

    env = {k: v for k, v in os.environ.items() if not k.startswith("BOXTRAIL_")}
    env.update(BOXTRAIL_URL=server.url, BOXTRAIL_API_KEY=server.api_key)
    for as_json in (True, False):
        out = subprocess.run(
            [sys.executable, "-m", "boxtrail", "search", "--project", project, "--since", SINCE,
             "--limit", "1000", *(["--json"] if as_json else [])],
            env=env, capture_output=True, timeout=60)
        assert out.returncode == 0, out.stderr
        text = out.stdout.decode()
        if as_json:
            rows = [json.loads(line) for line in text.splitlines()]
            assert {row["id"] for row in rows} == set(expected)
            for row in rows:
                hostile.check_row(row, *expected[row["id"]])
        else:  # one line per row and no control character reaches the terminal
            assert not any((c < " " and c != "\n") or "\x7f" <= c <= "\x9f" for c in text)
    check_mcp_tail(server, project, expected)  # last: it posts rows of its own


def check_mcp_tail(server: Server, project: str,
                   expected: dict[str, tuple[hostile.Sent, tuple[int, int]]]) -> None:
    """``logs_tail`` while the hostile rows go by again (reposted: new ids, same content)."""
    with server.client() as api:
        key = str(api.get(f"/v1/projects/{project}").json()["ingestKey"])

    async def tail_while_posting() -> dict[str, Any]:
        task = asyncio.create_task(call(server, "auto", "logs_tail",
                                        {"project": project, "seconds": 3}))
        await asyncio.sleep(1)
        async with httpx.AsyncClient(timeout=30) as http:
            for sent, _ in list(expected.values())[:50]:
                text = '{"context":{},"events":[' + sent.text + "]}"
                r = await http.post(f"{server.url}/v1/ingest", params={"key": key},
                                    content=text.encode())
                assert r.status_code == 202 and r.json()["accepted"] == 1, r.text
        return payload(await task)

    result = run(tail_while_posting())
    assert result["rows"]
    by_message = {}
    for sent, _ in list(expected.values())[:50]:
        assert sent.row is not None
        by_message.setdefault(sent.row["message"], []).append(sent.row)
    for row in result["rows"]:
        assert row["message"] in by_message, row
        assert not row.get("problem"), row


def _uncompact(row: dict[str, Any]) -> dict[str, Any]:
    """An MCP row (``None`` and empty values left out) with the fields a row always has."""
    out = {"url": None, "boxId": None, "sessionId": None, "release": None, "attrs": {},
           "truncated": None, "error": None, **row}
    if out["error"] is not None:
        # Search rows carry no stack; error rows carry frames instead of one.
        out["error"] = {"type": None, "message": None, **out["error"], "stack": _SKIP}
    return out


class _Anything:
    def __eq__(self, other: object) -> bool:
        return True


_SKIP = _Anything()
