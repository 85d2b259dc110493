"""Numbered events sent while the server is SIGKILLed at random moments.

After the last restart every acknowledged number must be stored exactly once;
numbers whose request got no 202 may be stored (the WAL had them) but never twice.
Shared by the crash test and the longer soak script in ``tests/soak/``.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.support.server import Server, create_project, search_all

BATCH = 25
SENDERS = 3


@dataclass
class Ledger:
    acked: set[int] = field(default_factory=set)
    unacked: set[int] = field(default_factory=set)
    numbers: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    lock: threading.Lock = field(default_factory=threading.Lock)


def run(data_dir: Path, env: dict[str, str], kills: int, seed: int,
        max_uptime_s: float = 1.5) -> tuple[Ledger, list[dict[str, object]]]:
    rng = random.Random(seed)
    env = {"BOXTRAIL_COMPACT_INTERVAL_S": "1", "BOXTRAIL_COMPACT_MIN_FILES": "3", **env}
    ledger = Ledger()
    server = Server(data_dir, env).start()
    with server.client() as api:
        key = str(create_project(api, "crash")["ingestKey"])
    for _ in range(kills):
        stop = threading.Event()
        senders = [threading.Thread(target=_send_spread, args=([server], key, ledger, stop, 0))
                   for _ in range(SENDERS)]
        for sender in senders:
            sender.start()
        time.sleep(rng.uniform(0.05, max_uptime_s))
        server.kill()
        stop.set()
        for sender in senders:
            sender.join(10)
        server.start()
    try:
        with server.client() as api:
            rows = search_all(api, "crash", since="1d")
    finally:
        server.stop()
    return ledger, rows


def check(ledger: Ledger, rows: list[dict[str, object]]) -> dict[str, int]:
    seen: dict[int, int] = {}
    for row in rows:
        n = int(row["attrs"]["n"])  # type: ignore[index]
        seen[n] = seen.get(n, 0) + 1
    lost = sorted(ledger.acked - seen.keys())
    duplicated = sorted(n for n, count in seen.items() if count > 1)
    unknown = sorted(seen.keys() - ledger.acked - ledger.unacked)
    assert not lost, f"{len(lost)} acknowledged events lost, e.g. {lost[:10]}"
    assert not duplicated, f"{len(duplicated)} events stored twice, e.g. {duplicated[:10]}"
    assert not unknown, f"rows that were never sent: {unknown[:10]}"
    return {"acked": len(ledger.acked), "unacked": len(ledger.unacked), "stored": len(seen),
            "unacked_but_stored": len(seen.keys() & ledger.unacked)}


def run_cluster(nodes: list[Server], kills: int, seed: int, max_uptime_s: float = 1.5,
                pause_s: float = 0.0) -> tuple[Ledger, list[list[dict[str, object]]]]:
    """Senders spread over every node of a cluster while one node at a time is SIGKILLed
    and restarted on its data directory; returns what each node reads at the end. Each
    sender waits ``pause_s`` after each request (a long soak keeps its rows countable)."""
    rng = random.Random(seed)
    ledger = Ledger()
    restarts: list[float] = []
    with nodes[0].client() as api:
        key = str(create_project(api, "crash")["ingestKey"])
    stop = threading.Event()
    senders = [threading.Thread(target=_send_spread,
                                args=(nodes, key, ledger, stop, i, pause_s))
               for i in range(SENDERS)]
    for sender in senders:
        sender.start()
    try:
        for _ in range(kills):
            time.sleep(rng.uniform(0.05, max_uptime_s))
            victim = rng.choice(nodes)
            victim.kill()
            time.sleep(rng.uniform(0, 0.3))
            started = time.monotonic()
            victim.start()
            restarts.append(time.monotonic() - started)
    finally:
        stop.set()
        for sender in senders:
            sender.join(10)
    rows = []
    for node in nodes:
        with node.client() as api:
            rows.append(search_all(api, "crash", since="1d"))
    print(f"restarts took {min(restarts):.1f}-{max(restarts):.1f} s")

    return ledger, rows


def _send_spread(nodes: list[Server], key: str, ledger: Ledger, stop: threading.Event,
                 offset: int, pause_s: float = 0.0) -> None:
    """Numbered batches until ``stop``, each request to the next node (its URL read at send
    time: a restarted node listens on a new port), each number booked acked or not."""
    turn = offset
    with httpx.Client(timeout=5) as client:
        while not stop.is_set():
            node = nodes[turn % len(nodes)]
            turn += 1
            with ledger.lock:
                numbers = [next(ledger.numbers) for _ in range(BATCH)]
            events = [{"message": f"n={n}", "attrs": {"n": n}} for n in numbers]
            try:
                r = client.post(f"{node.url}/v1/ingest", params={"key": key},
                                json={"context": {"boxId": f"box{numbers[0] % 3}"},
                                      "events": events})
                ok = r.status_code == 202 and r.json()["accepted"] == BATCH
            except httpx.HTTPError:
                ok = False
            with ledger.lock:
                (ledger.acked if ok else ledger.unacked).update(numbers)
            if not ok:
                time.sleep(0.05)
            elif pause_s:
                time.sleep(pause_s)
