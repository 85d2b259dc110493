"""Every query the search language accepts can be sent, in any script.

The language takes up to ``MAX_LENGTH`` characters and ``MAX_TERMS`` terms; percent-encoded,
a character of an astral script takes 12 URL bytes, so a query at the limit of emoji is
24,000 bytes of URL before its path and other parameters. The server's URL limit is sized
from that (``BOXTRAIL_MAX_URL_BYTES``, at least 32 KiB), so a search, a histogram and a tail
(an ``EventSource`` can only GET) at every limit at once are answered, and find what they
should. Queries are generated: scripts of 1 to 4 UTF-8 bytes a character, with the ASCII
that percent-encodes, split into any number of terms up to the limit.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.config import RANGES, load
from query.language import MAX_LENGTH, MAX_TERMS, compile_query
from query.rows import MAX_ID, MAX_TS_MS, Cursor, encode_cursor
from tests.support.server import Server, create_project
from tests.support.sse import Tail

# Characters that are never query syntax, by how many UTF-8 bytes each takes.
SCRIPTS = {
    "emoji": [chr(c) for c in range(0x1F300, 0x1F5FF)],  # 4 bytes
    "math": [chr(c) for c in range(0x1D400, 0x1D4FF) if chr(c).isalpha()],  # 4 bytes
    "cjk": [chr(c) for c in range(0x4E00, 0x4FFF)],  # 3 bytes
    "hangul": [chr(c) for c in range(0xAC00, 0xACFF)],  # 3 bytes
    "arabic": [chr(c) for c in range(0x0627, 0x064B)],  # 2 bytes
    "devanagari": [chr(c) for c in range(0x0905, 0x093A)] + [chr(c) for c in range(0x093E,
                                                                                    0x094D)],
    "encoded-ascii": list("%&#+=?;,.!@$~"),  # 1 byte, 3 in the URL
}
BOX = "b" * 63 + "x"  # the longest box id ingest accepts
PROJECT = "p" * 64  # the longest project name
SINCE, UNTIL = "2000-01-01T00:00:00.000+00:00", "9999-12-31T23:59:59.999+00:00"
CURSOR = encode_cursor(Cursor(ts=MAX_TS_MS, id=MAX_ID))  # the last page of all


def a_query(chars: list[str], terms: int, rnd: random.Random) -> tuple[str, str]:
    """A query of exactly MAX_LENGTH characters in ``terms`` terms joined by OR, and its
    first term (which the stored row holds, so the query finds it)."""
    budget = MAX_LENGTH - 4 * (terms - 1)  # " OR " between terms
    sizes = [budget // terms + (1 if i < budget % terms else 0) for i in range(terms)]
    words = ["".join(rnd.choice(chars) for _ in range(size)) for size in sizes]
    return " OR ".join(words), words[0]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(tmp_path_factory.mktemp("long-queries") / "data").start()
    with srv.client() as api:
        create_project(api, PROJECT)
    yield srv
    srv.stop()


def ingest(server: Server, message: str) -> None:
    with server.client() as api:
        key = api.get(f"/v1/projects/{PROJECT}").json()["ingestKey"]
    body = {"context": {"boxId": BOX}, "events": [{"level": "error", "message": message}]}
    answer = httpx.post(f"{server.url}/v1/ingest", params={"key": key}, json=body)
    assert answer.status_code == 202 and answer.json()["accepted"] == 1, answer.text


def test_the_url_limit_holds_the_longest_query_by_default_and_at_its_least() -> None:
    longest = len(quote(chr(0x1F600) * MAX_LENGTH, safe=""))
    assert longest == 12 * MAX_LENGTH
    assert load({}).max_url_bytes == RANGES["max_url_bytes"][0] >= longest + (8 << 10)


def check(server: Server, query: str, first: str) -> None:
    compile_query(query)  # the language accepts it: this is a query at its limits
    ingest(server, f"checkout failed near {first} today")
    with server.client() as api:
        params = {"query": query, "boxId": BOX, "since": SINCE, "until": UNTIL}
        logs = api.get(f"/v1/projects/{PROJECT}/logs",
                       params={**params, "limit": 1000, "cursor": CURSOR})
        assert logs.status_code == 200, logs.text[:300]
        assert len(str(logs.url)) > 2 * MAX_LENGTH  # it really went in the URL
        assert any(first in str(r["message"]) for r in logs.json()["rows"]), logs.text[:300]
        counts = api.get(f"/v1/projects/{PROJECT}/histogram", params={**params, "buckets": 500})
        assert counts.status_code == 200, counts.text[:300]
        assert sum(sum(b["counts"].values()) for b in counts.json()["buckets"]) >= 1


@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.parametrize("terms", [1, MAX_TERMS])
def test_a_query_at_every_limit_is_answered(server: Server, script: str, terms: int) -> None:
    query, first = a_query(SCRIPTS[script], terms, random.Random(f"{script}{terms}"))
    check(server, query, first)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mix=st.lists(st.sampled_from(sorted(SCRIPTS)), min_size=1, max_size=4, unique=True),
       terms=st.integers(1, MAX_TERMS), seed=st.integers(0, 2**32))
def test_generated_queries_at_the_length_limit_are_answered(
        server: Server, mix: list[str], terms: int, seed: int) -> None:
    chars = [c for name in mix for c in SCRIPTS[name]]
    query, first = a_query(chars, terms, random.Random(seed))
    check(server, query, first)


def test_a_tail_at_the_limits_streams_what_matches(server: Server) -> None:
    query, first = a_query(SCRIPTS["emoji"], MAX_TERMS, random.Random(7))
    with server.client(timeout=30) as api:
        tail = Tail(api, f"/v1/projects/{PROJECT}/tail", {"query": query, "boxId": BOX})
        try:
            assert tail.status == 200
            ingest(server, f"tail sees {first}")
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not tail.logs():
                time.sleep(0.05)
            assert [row["message"] for row in tail.logs()] == [f"tail sees {first}"]
        finally:
            tail.close()


def test_one_character_past_the_limit_is_the_languages_refusal_not_the_urls(
        server: Server) -> None:
    with server.client() as api:
        answer = api.get(f"/v1/projects/{PROJECT}/logs",
                         params={"query": chr(0x1F600) * (MAX_LENGTH + 1)})
    assert answer.status_code == 400, answer.text[:300]
    error = answer.json()["error"]
    assert error["code"] == "invalid_query"
    assert f"longer than {MAX_LENGTH} characters" in error["message"]
