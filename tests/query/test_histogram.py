"""``/histogram`` and ``until``: through the real server, counts checked against ``/logs``.

The tests share one server (``server`` below), each on projects of their own names: a
histogram counts one project's rows. The one that restarts its server with another flush
interval starts its own."""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from query.histogram import LADDER_S
from tests.support.server import Server, create_project

MINUTE = 60_000
LEVELS = ("debug", "info", "warn", "error")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(tmp_path_factory.mktemp("histogram") / "data").start()
    yield srv
    srv.stop()


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")[:-6] + "Z"


def ms(text: str) -> int:
    return int(datetime.fromisoformat(text).timestamp() * 1000 + 0.5)


def ingest(server: Server, key: str, events: list[dict[str, object]], box: str = "b1") -> None:
    r = httpx.post(f"{server.url}/v1/ingest", params={"key": key},
                   json={"context": {"boxId": box}, "events": events})
    assert r.status_code == 202 and r.json()["accepted"] == len(events), r.text


def logs(api: httpx.Client, project: str, **params: str) -> list[dict[str, object]]:
    """Every row /logs returns, following nextCursor."""
    rows: list[dict[str, object]] = []
    cursor = None
    while True:
        page_params: dict[str, str | int] = {"limit": 100, **params}
        if cursor:
            page_params["cursor"] = cursor
        r = api.get(f"/v1/projects/{project}/logs", params=page_params)
        assert r.status_code == 200, r.text
        rows += r.json()["rows"]
        cursor = r.json()["nextCursor"]
        if not cursor:
            return rows


def histogram(api: httpx.Client, project: str, **params: str) -> dict[str, Any]:
    r = api.get(f"/v1/projects/{project}/histogram", params=params)
    assert r.status_code == 200, r.text
    assert 0 <= int(r.headers["x-boxtrail-files-scanned"]) <= int(
        r.headers["x-boxtrail-files-total"])
    return r.json()  # type: ignore[no-any-return]


def check_layout(body: dict[str, Any], since: int, until: int, wanted: int) -> int:
    """The buckets are the ladder's narrowest fit, aligned, contiguous; returns the width."""
    width: int = body["bucketSeconds"] * 1000

    def count(w: int) -> int:
        return (until - 1) // w - since // w + 1

    assert width // 1000 in LADDER_S and count(width) <= wanted
    narrower = [s * 1000 for s in LADDER_S if s * 1000 < width]
    assert all(count(w) > wanted for w in narrower)
    starts = [ms(b["ts"]) for b in body["buckets"]]
    assert starts == [since // width * width + i * width for i in range(count(width))]
    assert (body["from"], body["to"]) == (iso(since), iso(until))
    return width


def expected(rows: list[dict[str, object]], since: int, width: int
             ) -> dict[int, Counter[str]]:
    """``rows`` (as /logs returns them) counted per bucket start and level."""
    out: dict[int, Counter[str]] = {}
    for row in rows:
        start = ms(str(row["ts"])) // width * width
        out.setdefault(start, Counter())[str(row["level"])] += 1
    return out


def as_counts(body: dict[str, Any]) -> dict[int, Counter[str]]:
    return {ms(b["ts"]): Counter(b["counts"])
            for b in body["buckets"] if b["counts"]}


def test_counts_equal_what_logs_returns(server: Server, api: httpx.Client) -> None:
    key = str(create_project(api, "h")["ingestKey"])
    base = (int(time.time() * 1000) // MINUTE - 30) * MINUTE  # 30 minutes ago, on a minute
    plan = [(0, "info"), (0, "error"), (1, "info"), (59_999, "warn"), (60_000, "debug"),
            (5 * MINUTE + 7, "error"), (5 * MINUTE + 8, "error"), (19 * MINUTE, "info"),
            (20 * MINUTE - 1, "warn"), (20 * MINUTE, "info"), (-1, "info")]
    ingest(server, key, [{"ts": base + offset, "level": level, "message": f"m {offset}"}
                         for offset, level in plan])
    ingest(server, key, [{"ts": base + 3 * MINUTE, "level": "error", "message": "checkout x"}],
           box="b2")
    since, until = base, base + 20 * MINUTE
    window = {"since": iso(since), "until": iso(until)}
    for params in ({}, {"query": "level:error OR checkout"}, {"boxId": "b2"},
                   {"query": "m", "boxId": "b1"}):
        body = histogram(api, "h", **window, **params, buckets="20")
        assert body["bucketSeconds"] == 60
        width = check_layout(body, since, until, 20)
        rows = logs(api, "h", **window, **params)
        assert body["total"] == len(rows)
        assert as_counts(body) == expected(rows, since, width)
    body = histogram(api, "h", **window, buckets="20")
    assert body["total"] == 10  # the rows at until and a ms before since are outside
    assert body["buckets"][0]["counts"] == {"info": 2, "error": 1, "warn": 1}
    assert body["buckets"][1]["counts"] == {"debug": 1}
    assert body["buckets"][2]["counts"] == {}  # every bucket is there, empty ones too
    assert body["buckets"][19]["counts"] == {"info": 1, "warn": 1}
    # A window that is not on the ladder's grid: ten buckets of one minute cannot cover
    # 10 minutes starting mid-minute, two minutes can.
    since, until = base + 30_000, base + 10 * MINUTE + 30_000
    body = histogram(api, "h", since=iso(since), until=iso(until), buckets="10")
    assert body["bucketSeconds"] == 120
    width = check_layout(body, since, until, 10)
    rows = logs(api, "h", since=iso(since), until=iso(until))
    assert as_counts(body) == expected(rows, since, width)


def test_until_pages_within_the_window(server: Server, api: httpx.Client) -> None:
    key = str(create_project(api, "u")["ingestKey"])
    base = int(time.time() * 1000) - 60 * MINUTE
    ingest(server, key, [{"ts": base + n * 1000, "message": f"n {n}"} for n in range(400)])
    until = base + 250_000
    rows = logs(api, "u", since="2h", until=iso(until))  # three pages of 100
    assert [r["message"] for r in rows] == [f"n {n}" for n in range(249, -1, -1)]
    # Durations for both: until=55m is 300 s after base and the seconds this test took.
    rows = logs(api, "u", since=iso(base + 100_000), until="55m")
    assert min(ms(str(r["ts"])) for r in rows) == base + 100_000
    assert [r["message"] for r in rows][-200:] == [f"n {n}" for n in range(299, 99, -1)]
    assert len(rows) < 200 + 30


def test_a_row_acked_a_moment_ago_counts_buffered_then_flushed(tmp_path: Path) -> None:
    server = Server(tmp_path / "data", {"BOXTRAIL_FLUSH_INTERVAL_S": "3600"}).start()
    try:
        with server.client() as api:
            key = str(create_project(api, "live")["ingestKey"])
            ingest(server, key, [{"level": "warn", "message": "now"}])
            r = api.get("/v1/projects/live/histogram")  # since 1h, until now
            assert r.status_code == 200, r.text
            assert r.headers["x-boxtrail-files-total"] == "0"  # still in the live buffer
            assert r.json()["total"] == 1
            assert r.json()["buckets"][-1]["counts"] == {"warn": 1}
            now = ms(r.json()["to"])
            window = {"since": iso(now - 60 * MINUTE), "until": iso(now + MINUTE)}
            buffered = histogram(api, "live", **window)
        server.stop()  # its final flush writes the row to Parquet
        server.env["BOXTRAIL_FLUSH_INTERVAL_S"] = "0.5"
        server.start()
        with server.client() as api:
            r = api.get("/v1/projects/live/histogram", params=window)
            assert r.headers["x-boxtrail-files-total"] == "1"
            assert r.headers["x-boxtrail-files-scanned"] == "1"
            assert r.json() == buffered
    finally:
        server.stop()


def _refusal(response: httpx.Response, status: int, parameter: str | None) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "detail"}
    if parameter is not None:
        assert body["error"]["code"] == "invalid_parameter"
        assert body["error"]["detail"]["parameter"] == parameter
        assert parameter in body["error"]["message"]


def test_bad_parameters_and_other_tenants(server: Server, api: httpx.Client) -> None:
    create_project(api, "mine")
    for path in ("logs", "histogram"):
        url = f"/v1/projects/mine/{path}"
        _refusal(api.get(url, params={"until": "yesterday"}), 400, "until")
        _refusal(api.get(url, params={"since": "1h", "until": "2h"}), 400, "until")
        _refusal(api.get(url, params={"since": "2026-01-01T00:00:00Z",
                                      "until": "2026-01-01T00:00:00Z"}), 400, "until")
        _refusal(api.get(url, params={"since": "soon"}), 400, "since")
        _refusal(api.get(url, params={"query": "level:error )"}), 400, None)
    for buckets in ("0", "501", "-3"):
        _refusal(api.get("/v1/projects/mine/histogram", params={"buckets": buckets}), 400,
                 "buckets")
    _refusal(api.get("/v1/projects/mine/histogram", params={"buckets": "many"}), 400, None)
    assert histogram(api, "mine", buckets="500")["total"] == 0
    assert len(histogram(api, "mine", buckets="1")["buckets"]) == 1

    other_key = server.create_key("other")
    with httpx.Client(base_url=server.url, timeout=10,
                      headers={"Authorization": f"Bearer {other_key}"}) as other:
        theirs = create_project(other, "theirs")
        assert other.get("/v1/projects/theirs/histogram").status_code == 200
    for ref in ("theirs", str(theirs["id"])):
        _refusal(api.get(f"/v1/projects/{ref}/histogram"), 404, None)
        assert api.get(f"/v1/projects/{ref}/histogram").json()["error"]["code"] == "not_found"


def test_histogram_matches_a_python_count(server: Server, api: httpx.Client) -> None:
    """Random rows, windows and bucket counts: every bucket's counts per level are what
    counting the rows sent gives (rows in Parquet and in the buffer alike: the server
    flushes every 0.5 s while examples run)."""
    base = (int(time.time() * 1000) // MINUTE - 180) * MINUTE  # three hours ago
    span = 120 * MINUTE
    names = (f"p{n}" for n in itertools.count())

    @settings(max_examples=30, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck), phases=[Phase.generate])
    @given(rows=st.lists(st.tuples(st.integers(0, span - 1), st.sampled_from(LEVELS)),
                         max_size=120),
           edges=st.tuples(st.integers(0, span - 1), st.integers(1, span)),
           buckets=st.integers(1, 500))
    def check(rows: list[tuple[int, str]], edges: tuple[int, int], buckets: int) -> None:
        project = next(names)
        key = str(create_project(api, project)["ingestKey"])
        if rows:
            ingest(server, key, [{"ts": base + offset, "level": level, "message": "x"}
                                 for offset, level in rows])
        since, until = base + edges[0], base + min(edges[0] + edges[1], span)
        if until <= since:
            return
        body = histogram(api, project, since=iso(since), until=iso(until),
                         buckets=str(buckets))
        width = check_layout(body, since, until, buckets)
        wanted: dict[int, Counter[str]] = {}
        for offset, level in rows:
            if since <= base + offset < until:
                wanted.setdefault((base + offset) // width * width, Counter())[level] += 1
        assert as_counts(body) == wanted
        assert body["total"] == sum(sum(c.values()) for c in wanted.values())

    check()


def _moment(draw_ms: int, offset_min: int) -> str:
    """An ISO-8601 time at epoch ms ``draw_ms``, written with an offset of ``offset_min``."""
    local = datetime.fromtimestamp(draw_ms / 1000, UTC).replace(tzinfo=None)
    try:
        local += timedelta(minutes=offset_min)
    except OverflowError:
        offset_min = 0
    sign = "-" if offset_min < 0 else "+"
    return (local.isoformat(timespec="milliseconds")
            + f"{sign}{abs(offset_min) // 60:02d}:{abs(offset_min) % 60:02d}")


_FIRST_MS = int(datetime(1, 1, 1, tzinfo=UTC).timestamp() * 1000)
_LAST_MS = int(datetime(9999, 12, 31, 23, 59, 59, 999000, tzinfo=UTC).timestamp() * 1000)
_EDGES = ("0001-01-01T00:00:00Z", "0001-01-01T00:00:00.000+00:01", "9999-12-31T23:59:59.999Z",
          "9999-12-31T23:59:59.998Z", "9999-12-31T23:59:59.999-00:01", "1970-01-01T00:00:00Z")
_TIMES = st.one_of(
    st.sampled_from(_EDGES),
    st.builds(_moment, st.integers(_FIRST_MS, _LAST_MS), st.integers(-1439, 1439)),
    st.sampled_from(("1s", "1h", "7d", "1000000w")))


def test_any_window_in_the_time_range_gets_an_answer_never_a_500(
        server: Server, api: httpx.Client) -> None:
    """Windows anywhere from year 1 to 9999, at its very edges, with offsets that push past
    them, or open-ended: /logs, /histogram and /errors answer 200, or 400 in the error
    shape."""
    create_project(api, "edges")

    @settings(max_examples=60, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck), phases=[Phase.generate])
    @given(since=_TIMES, until=st.one_of(st.just(""), _TIMES))
    def check(since: str, until: str) -> None:
        params = {"since": since, **({"until": until} if until else {})}
        for path in ("logs", "histogram", "errors"):
            r = api.get(f"/v1/projects/edges/{path}", params=params)
            if r.status_code != 200:
                _refusal(r, 400, None)

    for since in _EDGES:  # each edge without an end, whatever the generator picks
        for path in ("logs", "histogram", "errors"):
            r = api.get(f"/v1/projects/edges/{path}", params={"since": since})
            assert r.status_code == 200, (path, since, r.text)
    check()
