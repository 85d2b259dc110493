"""One partial failure of a proxied cluster (tests/support/cluster.py, ``proxied=True``), run under
paced ingest with a ledger: :func:`run_scenario` cuts one node's link to one engine in one
mode (tests/support/faultproxy.py), heals it, and returns what happened — the ledger, every
ingest request's latency and status, probes of what needs the catalog, freshness after
the heal, and what each node stores — for a test to assert on. Shared so that other
tests (live tails across a cut, say) can run the same scenarios with checks of their own.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from tests.support import crashload
from tests.support.cluster import Cluster
from tests.support.server import create_project, search_all

WARM_WAIT_S = 30.0  # a backlog left by the scenario before is written by then

# Paced ingest: each node gets a batch of BATCH events every PACE_S (200 events/s a node).
BATCH = 10
PACE_S = 0.05
BEFORE_S = 1.5  # ingest before the cut, for the baseline latency
FLAP_PERIOD_S = 1.0
DELAY_S = 0.2  # each chunk, each way
RECOVER_S = 15.0  # how long freshness may take to come back after the heal
FRESH_S = 1.0  # a row sent to one node is read on the others within this
CUT = 0  # the node whose link is cut


@dataclass
class Request:
    at: float  # monotonic, when it was sent
    node: int
    seconds: float
    status: int
    code: str = ""  # the error code of a refusal
    retry_after: str | None = None


@dataclass
class Probe:
    """A request that needs the engine that is cut, made on the cut node during the cut."""

    what: str
    at: float
    seconds: float
    status: int
    code: str
    retry_after: str | None


@dataclass
class Outcome:
    engine: str
    mode: str
    project: str
    cut_at: float = 0.0
    healed_at: float = 0.0
    ledger: crashload.Ledger = field(default_factory=crashload.Ledger)
    requests: list[Request] = field(default_factory=list)
    probes: list[Probe] = field(default_factory=list)
    fresh_after_s: float | None = None  # from the heal until freshness was back under 1 s
    stored: list[dict[str, int]] = field(default_factory=list)  # crashload.check per node
    lock: threading.Lock = field(default_factory=threading.Lock)

    def latencies(self, node: int, start: float, end: float) -> list[float]:
        """Seconds of the node's acked requests sent within [start, end)."""
        return sorted(r.seconds for r in self.requests
                      if r.node == node and r.status == 202 and start <= r.at < end)

    def refusals(self) -> list[Request]:
        return [r for r in self.requests if r.status != 202]


def p99(values: list[float]) -> float:
    assert values, "no requests in the window"
    return values[min(len(values) - 1, int(len(values) * 0.99))]


def _error(response: httpx.Response) -> str:
    try:
        return str(response.json()["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return ""


def _send(cluster: Cluster, node: int, key: str, out: Outcome, stop: threading.Event,
          batch: int) -> None:
    ledger = out.ledger
    with httpx.Client(timeout=30) as client:
        while not stop.is_set():
            with ledger.lock:
                numbers = [next(ledger.numbers) for _ in range(batch)]
            started = time.monotonic()
            try:
                r = client.post(f"{cluster[node].url}/v1/ingest", params={"key": key},
                                json={"events": [{"message": f"n={n}", "attrs": {"n": n}}
                                                 for n in numbers]})
            except httpx.HTTPError:
                with ledger.lock:
                    ledger.unacked.update(numbers)
                continue
            took = time.monotonic() - started
            with ledger.lock:
                (ledger.acked if r.status_code == 202 else ledger.unacked).update(numbers)
            with out.lock:
                out.requests.append(Request(started, node, took, r.status_code,
                                            "" if r.status_code == 202 else _error(r),
                                            r.headers.get("retry-after")))
            stop.wait(max(0.0, PACE_S - took))


def cut(cluster: Cluster, engine: str, mode: str) -> None:
    proxy = cluster.proxies[CUT][engine]
    if mode == "flap":
        proxy.flap(FLAP_PERIOD_S)
    elif mode == "delay":
        proxy.delay(DELAY_S)
    else:
        getattr(proxy, mode)()


def timed(what: str, call: Callable[[], httpx.Response]) -> Probe:
    started = time.monotonic()
    r = call()
    return Probe(what, started, time.monotonic() - started, r.status_code, _error(r),
                 r.headers.get("retry-after"))


def run_scenario(cluster: Cluster, engine: str, mode: str, cut_s: float,
                 probe: Callable[[Cluster, Outcome], None] | None = None,
                 probe_after_s: float | None = None, cut_batch: int = BATCH,
                 cut_senders: int = 1) -> Outcome:
    """Ingest into every node, cut node ``CUT``'s link to ``engine`` ("pg", "redis", "s3")
    in ``mode`` for ``cut_s``, heal, wait for freshness, stop ingest, and read every
    node's rows back. ``probe(cluster, outcome)`` runs ``probe_after_s`` into the cut.
    The cut node gets ``cut_batch`` events a request (to fill its buffer sooner), from
    ``cut_senders`` senders at once (more requests: enough for a p99 that is not a max)."""
    out = Outcome(engine, mode, f"{engine}-{mode}")
    with cluster[1].client() as api:
        key = str(create_project(api, out.project)["ingestKey"])
    # Every node has seen the key before the cut: it is a known key everywhere. A node
    # the scenario before left with a backlog (its cut node's buffer past the limit)
    # answers 503 until it has written it; a client retries after Retry-After, as here.
    for node in range(len(cluster)):
        deadline = time.monotonic() + WARM_WAIT_S
        while True:
            r = httpx.post(f"{cluster[node].url}/v1/ingest", params={"key": key},
                           json={"context": {"boxId": "warm"},
                                 "events": [{"message": "warm"}]})
            if r.status_code != 503 or time.monotonic() > deadline:
                break
            time.sleep(float(r.headers.get("retry-after", "1")))
        assert r.status_code == 202, r.text
    stop = threading.Event()
    senders = [threading.Thread(target=_send, args=(cluster, node, key, out, stop,
                                                    cut_batch if node == CUT else BATCH))
               for node in range(len(cluster))
               for _ in range(cut_senders if node == CUT else 1)]
    for sender in senders:
        sender.start()
    try:
        time.sleep(BEFORE_S)
        out.cut_at = time.monotonic()
        cut(cluster, engine, mode)
        probing: threading.Thread | None = None
        if probe is not None:
            time.sleep(probe_after_s if probe_after_s is not None else cut_s / 2)
            # Beside the cut, not in it: a probe that waits long must not lengthen it.
            probing = threading.Thread(target=probe, args=(cluster, out))
            probing.start()
        time.sleep(max(0.0, out.cut_at + cut_s - time.monotonic()))
        cluster.proxies[CUT][engine].heal()
        out.healed_at = time.monotonic()
        out.fresh_after_s = _freshness(cluster, key, out)
        if probing is not None:
            probing.join(60)
    finally:
        stop.set()
        for sender in senders:
            sender.join(30)
    out.stored = [_stored(cluster, node, out) for node in range(len(cluster))]
    return out


def _freshness(cluster: Cluster, key: str, out: Outcome) -> float | None:
    """Seconds from the heal until a row sent to the cut node is read on every other node
    within FRESH_S, and one sent to another node on the cut node (None: not within
    RECOVER_S)."""
    clients = [node.client(timeout=5) for node in cluster.nodes]
    try:
        turn = 0
        while time.monotonic() - out.healed_at < RECOVER_S:
            turn += 1
            box = f"fresh-{turn}"
            pairs = [(CUT, [n for n in range(len(cluster)) if n != CUT]), (1, [CUT])]
            fresh = True
            for source, readers in pairs:
                r = httpx.post(f"{cluster[source].url}/v1/ingest", params={"key": key},
                               json={"context": {"boxId": f"{box}-{source}"},
                                     "events": [{"message": box}]}, timeout=5)
                if r.status_code != 202:  # the cut node still writing its backlog: later
                    fresh = False
                    break
                sent = time.monotonic()
                for reader in readers:
                    if not _seen(clients[reader], out.project, f"{box}-{source}",
                                 sent + FRESH_S):
                        fresh = False
            if fresh:
                return time.monotonic() - out.healed_at
            time.sleep(0.2)
        return None
    finally:
        for client in clients:
            client.close()


def _seen(client: httpx.Client, project: str, box: str, until: float) -> bool:
    while True:
        try:
            r = client.get(f"/v1/projects/{project}/logs", params={"since": "1h", "boxId": box})
            if r.status_code == 200 and r.json()["rows"]:
                return True
        except httpx.HTTPError:
            pass
        if time.monotonic() >= until:
            return False
        time.sleep(0.05)


def _stored(cluster: Cluster, node: int, out: Outcome) -> dict[str, int]:
    """What ``node`` reads of the scenario's numbered events, checked against the ledger
    (every acked one once, nothing twice), waiting for the stragglers up to 30 s."""
    deadline = time.monotonic() + 30
    with cluster[node].client(timeout=30) as api:
        while True:
            try:
                rows = [row for row in search_all(api, out.project, since="1h")
                        if isinstance(row.get("attrs"), dict) and "n" in row["attrs"]]  # type: ignore[operator]
            except AssertionError:  # a 503 while the node catches up
                rows = []
            numbers = {int(row["attrs"]["n"]) for row in rows}  # type: ignore[index]
            if out.ledger.acked <= numbers or time.monotonic() > deadline:
                return crashload.check(out.ledger, rows)
            time.sleep(0.5)
