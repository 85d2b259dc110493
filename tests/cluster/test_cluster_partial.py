"""Three nodes; one node's link to one engine (PostgreSQL, Redis or S3) is reset, blackholed,
flapped or delayed (tests/support/faultproxy.py) while every node takes paced ingest with a ledger
(tests/support/partial.py), then healed. For every engine x mode:

- every acked event is stored once, and read on every node;
- every refusal is a 503 with ``Retry-After``;
- freshness (a row sent to one node read on the others within 1 s, both ways) is back
  within ``RECOVER_S`` (15 s) of the heal: in these runs within ~0.1-3 s;
- no node is restarted (same process), and every node is ready again.

PostgreSQL: ingest for known keys keeps acking through the cut. Its p99 on the cut node
over the whole cut must stay within ``max(3 x p99 before, p99 before + 50 ms)``, both
measured in the same run, from ``CATALOG_SENDERS`` senders to the cut node (some 240
requests in the cut and 45-90 before it: with one sender, 80 and 30, the "p99" was the
slowest request, and one 142 ms scheduling stall of a loaded CI machine failed a run):
the node does no catalog call for a known key on the event loop, so what the cut may add
is scheduling noise on a 2-core machine that also runs the cut node's reconnect attempts;
a catalog call that held the loop would add at least ``LOOP_DEADLINE_S`` (0.5 s), ten
times the bound's margin. The window holds the probes
(``PROBE_AFTER_S`` into the cut: searches and a project creation on the cut node, what
needs the catalog): each must answer within 2.5 s, a 503 with Retry-After unless the link
passes at that moment (a flap's heal half). A search's plan reads the catalog in a thread
(``query.engine``), so the searches hold the loop no more than the rest.

S3: flushes stall or fail; under a blackhole or a reset the cut node's buffer fills and
ingest answers 503 ``overloaded`` at ``BOXTRAIL_BUFFER_MAX_ROWS``, and everything is
written after the heal.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator

import httpx
import pytest

from metadata.postgres import Postgres
from tests.support.cluster import Cluster
from tests.support.partial import CUT, Outcome, p99, run_scenario, timed
from tests.support.pgserver import PgServer
from tests.support.redisserver import RedisServer
from tests.support.s3server import S3Server

# Bounds on latencies and catch-up times under a cut: run alone (make test, after the rest).
pytestmark = pytest.mark.serial

MODES = ("reset", "blackhole", "flap", "delay")
# Rows a node may hold unwritten: the S3 cut (6 s, the cut node taking 800 events/s)
# passes it after ~4 s; a catalog cut (4 s at 200 events/s) does not, nor the Redis cut
# (3 s: 600 rows queued for the bus), so no bus entry is let go.
BUFFER_MAX_ROWS = 3000
S3_CUT_BATCH = 40
CUT_S = {"pg": 4.0, "redis": 3.0, "s3": 6.0}
# What needs the catalog answers within this during a cut: a request's project lookup
# (its guard, in a thread: REQUEST_DEADLINE_S, 1 s) or, past it, the wait for a flush's
# commit (GATE_WAIT_S, 1 s) and the plan's read (in a thread on the loop's terms:
# LOOP_DEADLINE_S, 0.5 s), each ended at its deadline; 2 s plus what a busy 2-core machine
# adds to the hops between.
CATALOG_ANSWER_S = 2.5
PROBE_AFTER_S = 2.5  # into the PostgreSQL cut
CATALOG_SENDERS = 3  # to the cut node, each paced as the others' one


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, pg_server: PgServer,
            s3_server: S3Server) -> Iterator[Cluster]:
    """One cluster for every scenario (each has its own project and ledger): starting
    three nodes costs seconds, a scenario ~10 s."""
    with RedisServer() as redis:
        cluster = Cluster(tmp_path_factory.mktemp("partial"), pg_server.new_database(),
                          redis.url(), s3_server, s3_server.new_bucket(),
                          env={"BOXTRAIL_BUFFER_MAX_ROWS": str(BUFFER_MAX_ROWS)},
                          proxied=True).start()
        try:
            yield cluster
        finally:
            cluster.stop()


def catalog_probe(cluster: Cluster, out: Outcome) -> None:
    with cluster[CUT].client(timeout=30) as api:
        out.probes.append(timed("projects", lambda: api.get("/v1/projects")))
        out.probes.append(timed("search", lambda: api.get(
            f"/v1/projects/{out.project}/logs", params={"since": "1h"})))
        out.probes.append(timed("search again", lambda: api.get(
            f"/v1/projects/{out.project}/logs", params={"since": "1h"})))
        out.probes.append(timed("create project", lambda: api.post(
            "/v1/projects", json={"name": f"{out.project}-during"})))
        # A key the node has not seen must be looked up: it cannot be told unknown.
        unseen = "bti_" + secrets.token_hex(16)
        out.probes.append(timed("ingest, unseen key", lambda: api.post(
            "/v1/ingest", params={"key": unseen}, json={"events": [{"message": "x"}]})))


def storage_probe(cluster: Cluster, out: Outcome) -> None:
    with cluster[CUT].client(timeout=60) as api:
        out.probes.append(timed("search", lambda: api.get(
            f"/v1/projects/{out.project}/logs", params={"since": "1h"})))


def ready(cluster: Cluster, pids: list[int]) -> None:
    """No node was restarted, and each is ready again (within 10 s of the end)."""
    assert [node.proc.pid for node in cluster.nodes if node.proc] == pids
    for node in cluster.nodes:
        assert node.proc is not None and node.proc.poll() is None
        deadline = time.monotonic() + 10
        while (r := httpx.get(f"{node.url}/readyz", timeout=5)).status_code != 200:
            assert time.monotonic() < deadline, r.text
            time.sleep(0.2)


def common(out: Outcome) -> None:
    for refused in out.refusals():
        assert refused.status == 503 and refused.retry_after, refused
    assert out.fresh_after_s is not None, "freshness not back within 15 s of the heal"
    for node, stored in enumerate(out.stored):
        assert stored["stored"] >= stored["acked"], (node, stored)


def report(out: Outcome, extra: str = "") -> None:
    before = out.latencies(CUT, out.cut_at - 1.5, out.cut_at)
    during = out.latencies(CUT, out.cut_at, out.healed_at)
    codes: dict[str, int] = {}
    for refused in out.refusals():
        codes[refused.code] = codes.get(refused.code, 0) + 1
    print(f"\n{out.engine} {out.mode}: acked {len(out.ledger.acked)}, refused {codes}; "
          f"cut node p99 {p99(before) * 1000:.1f} ms before, "
          f"{p99(during) * 1000 if during else float('nan'):.1f} ms during "
          f"(max {max(during, default=0) * 1000:.0f} ms); fresh {out.fresh_after_s:.2f} s "
          f"after the heal; probes "
          + ", ".join(f"{p.what} {p.status} {p.code} in {p.seconds:.2f} s" for p in out.probes)
          + extra)
    slow = sorted((r for r in out.requests if r.node == CUT), key=lambda r: -r.seconds)[:5]
    print("  slowest on the cut node (s after the cut: took):",
          ", ".join(f"{r.at - out.cut_at:+.2f}: {r.seconds:.2f}" for r in slow))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", MODES)
def test_a_node_s_catalog_link_fails(cluster: Cluster, mode: str) -> None:
    pids = [node.proc.pid for node in cluster.nodes if node.proc]
    out = run_scenario(cluster, "pg", mode, CUT_S["pg"], catalog_probe, PROBE_AFTER_S,
                       cut_senders=CATALOG_SENDERS)
    report(out)
    common(out)
    before = out.latencies(CUT, out.cut_at - 1.5, out.cut_at)
    window = out.latencies(CUT, out.cut_at, out.healed_at)  # the probes' time included
    # Enough requests in the cut that its p99 is not its slowest one (see the module
    # docstring). Before the cut (1.5 s, the senders' first requests included) there are
    # 45-90: fewer only raise p99(before), and with it the bound, never lower it.
    assert len(window) >= 100 and len(before) >= 20, (len(window), len(before))
    bound = max(3 * p99(before), p99(before) + 0.05)
    assert p99(window) <= bound, (p99(window), p99(before))
    for probe in out.probes:
        assert probe.seconds <= CATALOG_ANSWER_S, probe
        # A call that waits in a thread (a connect, up to CONNECT_TIMEOUT_S) may go through
        # once the link is healed; one that ended in the cut is a 503.
        if mode in ("reset", "blackhole") and probe.at + probe.seconds < out.healed_at:
            assert probe.status == 503 and probe.retry_after, probe
        else:  # a flap's heal half, or a delay under the deadline, may answer
            assert probe.status in (200, 201, 401, 503), probe
    ready(cluster, pids)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", MODES)
def test_a_node_s_bus_link_fails(cluster: Cluster, mode: str) -> None:
    pids = [node.proc.pid for node in cluster.nodes if node.proc]
    out = run_scenario(cluster, "redis", mode, CUT_S["redis"])
    report(out)
    common(out)
    assert not out.refusals(), "ingest refused while only the bus was cut"
    ready(cluster, pids)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", MODES)
def test_a_node_s_storage_link_fails(cluster: Cluster, mode: str) -> None:
    from core.storage.s3 import CONNECT_TIMEOUT_S, MAX_ATTEMPTS, READ_TIMEOUT_S

    pids = [node.proc.pid for node in cluster.nodes if node.proc]
    out = run_scenario(cluster, "s3", mode, CUT_S["s3"], storage_probe, 0.5, S3_CUT_BATCH)
    report(out)
    common(out)
    if mode in ("reset", "blackhole"):
        assert any(r.code == "overloaded" for r in out.refusals()), "the buffer never filled"
    # A read of the cut node's files answers within the storage calls' bound, or after
    # the heal if that comes first: it never hangs.
    bound = MAX_ATTEMPTS * (CONNECT_TIMEOUT_S + READ_TIMEOUT_S) + 2
    for probe in out.probes:
        assert probe.seconds <= bound, probe
        assert probe.status in (200, 503), probe
    ready(cluster, pids)
    assert Postgres.LOOP_DEADLINE_S < CATALOG_ANSWER_S
