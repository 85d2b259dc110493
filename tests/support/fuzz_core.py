"""`make fuzz`: the compiled core built with AddressSanitizer and UBSan, fed hostile bodies.

    python tests/support/fuzz_core.py MODULE.so [--seconds 30] [--seed N]

``MODULE.so`` is ``ingest/_core.c`` built with sanitizers (the Makefile's ``fuzz`` target
builds it and runs this with the sanitizer runtimes preloaded). It stands in for
``ingest._core`` in this process, then:

1. the differential tests (tests/ingest/test_core.py, test_core_logs.py) run against it: the
   hostile, SDK-shaped, damaged and arbitrary bodies and Sentry log items, each compared
   with the Python path;
2. a random fuzz for ``--seconds``: bodies from a seed corpus (the benchmark's, hostile
   ones, and the pathological shapes: deep nesting, a 10^6-digit number, 1 MiB strings,
   100k keys) mutated at random (bytes set, inserted, cut, spliced, repeated, truncated)
   and decoded under the default and tight limits; and the same for Sentry log items
   (``_core.logs``). Whatever the core returns for one must be None or columns of one
   length per event.

A sanitizer report aborts the process (``halt_on_error``), so any report fails the run.
Exits 0 with a JSON summary on stdout.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import json
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

LIMITS = ((8192, 65536, 64, 1024), (24, 40, 2, 12))
MIN_TS = 946_684_800_000
LOG_LIMITS = ((8192, 64, 1024, 64, MIN_TS), (24, 2, 12, 64, MIN_TS))
TOKENS = [b"{", b"}", b"[", b"]", b'"', b",", b":", b"\\", b"\\u", b"\\ud83d", b"\\ude00",
          b"null", b"true", b"1e999", b"-0.0", b"1" * 40, b'"ts":', b'"attrs":{',
          b'"message":"', b'"error":{', b"\x00", b"\xff", b"\xed\xa0\x80", b"\xf0\x9f\x98",
          b" ", b"\n", b"e+", b".", b"E"]


def load(path: str) -> None:
    """The sanitized build as ``ingest._core``, before anything imports the real one."""
    loader = importlib.machinery.ExtensionFileLoader("ingest._core", path)
    spec = importlib.util.spec_from_file_location("ingest._core", path, loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    sys.modules["ingest._core"] = module
    import ingest

    ingest._core = module  # type: ignore[attr-defined]


def seeds() -> list[bytes]:
    from benchmarks.datagen import make_bodies

    event = b'{"ts":1767225566871,"level":"warn","message":"m","url":"u","attrs":{"a":1}}'
    return [
        *make_bodies(3, 8, 20),
        b'{"context":{"url":"x","sdk":{"name":"n","version":"v"},"debugIds":{"a":"b"}},'
        b'"events":[' + event + b"]}",
        b'{"events":[{"ts":1767225566871,"message":"\\ud83d\\ude00\\n","error":{"type":"E",'
        b'"message":"m","stack":"at f (a.js:1:2)"}}]}',
        b'{"context":' + b'{"a":' * 5000 + b"1" + b"}" * 5000 + b',"events":[]}',  # deep
        b'{"events":[{"ts":1767225566871,"message":"a","attrs":{"n":1' + b"0" * 1_000_000
        + b"}}]}",  # a 10^6-digit number
        b'{"events":[{"ts":1767225566871,"message":"' + b"\xc3\xa9" * 524_288 + b'"}]}',
        b'{"events":[{"ts":1767225566871,"message":"a","attrs":{'
        + b",".join(b'"k%d":%d' % (i, i) for i in range(100_000)) + b"}}]}",  # 100k keys
        b'{"events":[' + b",".join([event] * 2000) + b"]}",
    ]


def log_seeds() -> list[bytes]:
    from benchmarks.datagen import make_bodies, to_envelope
    from ingest.envelope import split

    item = (b'{"timestamp":1767225566.871,"level":"warning","body":"m","trace_id":"t",'
            b'"attributes":{"a":{"value":1,"type":"integer"},"sentry.release":{"value":"r"}}}')
    return [
        *(i.payload for b in make_bodies(3, 8, 20) for i in split(to_envelope(b))[1]
          if i.type == "log"),
        b'{"version":2,"items":[' + item + b"]}",
        b'{"items":[{"timestamp":1767225566,"x":' + b"[" * 5000 + b"]" * 5000 + b"}]}",
        b'{"items":[{"timestamp":1767225566,"attributes":{"n":{"value":1' + b"0" * 1_000_000
        + b"}}}]}",
        b'{"items":[{"timestamp":1767225566,"body":"' + b"\u00e9" * 200_000 + b'"}]}',
        b'{"items":[{"timestamp":1767225566,"attributes":{' + b",".join(
            b'"k%d":{"value":%d}' % (i, i) for i in range(100_000)) + b"}}]}",
        b'{"items":[' + b",".join([item] * 2000) + b"]}",
    ]


def generated_log(rng: random.Random, now: int) -> bytes:
    """A log container as Sentry.logger sends it, mostly one the core takes."""
    items = []
    for _ in range(rng.randint(0, 8)):
        entry: dict[str, object] = {
            "timestamp": now / 1000 - rng.random() * 1000,
            "level": rng.choice(["trace", "debug", "info", "warning", "error", "fatal", ""]),
            "body": text(rng)}
        if rng.random() < 0.7:
            entry["attributes"] = {text(rng)[:20]: {"value": scalar(rng), "type": "string"}
                                   for _ in range(rng.randint(0, 5))}
        items.append(entry)
    body = {"version": 2, "items": items}
    return json.dumps(body, ensure_ascii=rng.random() < 0.5).encode("utf-8", "surrogatepass")


def text(rng: random.Random) -> str:
    alphabet = rng.choice(["abc xyz/:.-_", "\"\\\n\t\x00\x1f\u2028é€😀", "0123456789eE.+-",
                           "abc", "abc", "abc\ud800" if rng.random() < 0.05 else "{["])
    return "".join(rng.choice(alphabet) for _ in range(rng.choice([0, 1, 5, 40, 300])))


def scalar(rng: random.Random) -> object:
    return rng.choice([text(rng), rng.randint(-(2**70), 2**70), rng.random() * 10 ** rng.randint(
        -30, 30), True, None, rng.randint(0, 9), 1e300])


def generated(rng: random.Random, now: int) -> bytes:
    """An SDK-shaped body, valid JSON, mostly one the core takes: its column-building paths
    run under the sanitizers too, not only its refusals."""
    events = []
    for _ in range(rng.randint(0, 8)):
        event: dict[str, object] = {"ts": now - rng.randint(0, 10**6),
                                    "level": rng.choice(["debug", "info", "warn", "error"]),
                                    "message": text(rng)}
        if rng.random() < 0.5:
            event["url"] = rng.choice([text(rng), None, ""])
        if rng.random() < 0.7:
            event["attrs"] = {text(rng)[:20]: scalar(rng) for _ in range(rng.randint(0, 5))}
        if rng.random() < 0.3:
            event["error"] = rng.choice([None, {"type": text(rng), "message": None,
                                                "stack": text(rng)}])
        events.append(event)
    body = {"context": {"url": text(rng), "sdk": {"name": "n", "version": "1"}},
            "events": events}
    return json.dumps(body, ensure_ascii=rng.random() < 0.5).encode("utf-8", "surrogatepass")


def mutate(rng: random.Random, raw: bytes, corpus: list[bytes]) -> bytes:
    data = bytearray(raw)
    for _ in range(rng.randint(1, 6)):
        at = rng.randint(0, len(data))
        kind = rng.randrange(7)
        if kind == 0 and data:
            data[min(at, len(data) - 1)] = rng.randrange(256)
        elif kind == 1:
            data[at:at] = rng.choice(TOKENS)
        elif kind == 2:
            del data[at:at + rng.randint(1, 8)]
        elif kind == 3:
            other = rng.choice(corpus)
            start = rng.randint(0, len(other))
            data[at:at] = other[start:start + rng.randint(1, 64)]
        elif kind == 4:
            data[at:at] = rng.choice(TOKENS) * rng.randint(2, 300)
        elif kind == 5:
            del data[at:]
        else:
            end = min(len(data), at + rng.randint(1, 16))
            data[at:end] = data[at:end] * rng.randint(2, 50)
    return bytes(data)


def valid(columns: tuple[object, ...], events: int) -> None:
    """String columns Arrow validates in full (offsets in order and within the data,
    UTF-8), one value per event."""
    import pyarrow as pa

    from core.schema import Strings

    for column in columns:
        array = Strings(*column).array(events)  # type: ignore[misc]
        array.validate(full=True)
        assert len(array) == events and isinstance(array, pa.StringArray)


def check(decode: object, raw: bytes) -> bool:
    """Whatever the core returns for ``raw`` is None, or its columns, valid."""
    for limits in LIMITS:
        found = decode(raw, *limits)  # type: ignore[operator]
        if found is None:
            continue
        events = found[0]
        assert len(found[2]) == 8 * events, raw[:200]
        assert found[5] is not None and found[9] is not None  # only errors are optional
        valid(tuple(c for c in (*found[5:8], *found[9:]) if c is not None), events)
        return True
    return False


def check_logs(logs: object, raw: bytes) -> bool:
    """As ``check``, for ``_core.logs``'s tuple (events, release, ts, ts_min, ts_max,
    level, message, attrs)."""
    for limits in LOG_LIMITS:
        found = logs(raw, *limits)  # type: ignore[operator]
        if found is None:
            continue
        events = found[0]
        assert len(found[2]) == 8 * events, raw[:200]
        assert found[1] is None or isinstance(found[1], str)
        valid(found[5:8], events)
        return True
    return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("module")
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    args = parser.parse_args()
    load(args.module)

    import pytest

    from ingest import _core

    # -s: a sanitizer's report goes to the terminal, not to a capture that dies with it.
    status = pytest.main(["-q", "-s", "-p", "no:cacheprovider", "-o", "addopts=",
                          str(REPO / "tests/ingest/test_core.py"),
                          str(REPO / "tests/ingest/test_core_logs.py")])
    if status != 0:
        raise SystemExit(f"the differential tests failed against the sanitized build: {status}")

    rng = random.Random(args.seed)
    now = int(time.time() * 1000)
    kinds = [(_core.decode, seeds(), generated), (_core.logs, log_seeds(), generated_log)]
    runs = taken = 0
    deadline = time.monotonic() + args.seconds
    small_of = []
    for read, corpus, _ in kinds:
        for raw in corpus:
            taken += (check if read is _core.decode else check_logs)(read, raw)
            runs += 1
        small_of.append([c for c in corpus if len(c) < 100_000])
    while time.monotonic() < deadline:
        which = runs % 2
        read, _, make = kinds[which]
        small = small_of[which]
        raw = make(rng, now) if runs % 8 < 2 else mutate(rng, rng.choice(small), small)
        taken += (check if read is _core.decode else check_logs)(read, raw)
        runs += 1
        if runs % 50 < 2 and len(raw) < 20_000:
            small.append(raw)  # mutations of mutations, within reach of the cut
            if len(small) > 500:
                del small[rng.randrange(len(small))]
    print(json.dumps({"seed": args.seed, "bodies": runs, "taken_by_core": taken,
                      "seconds": args.seconds}))


if __name__ == "__main__":
    main()
