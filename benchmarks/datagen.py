"""Deterministic SDK ingest bodies: the one data generator shared by benchmarks and tests.

Everything is drawn from a seeded ``random.Random``, so a seed (and a base timestamp)
always yields the same bytes. Events average ~300 bytes of JSON: a mix of levels,
~5% errors carrying a short V8-style stack, and a few scalar attrs, as the browser SDK
sends them (``{"context": {...}, "events": [...]}``, see DESIGN.md "Ingest").
"""

from __future__ import annotations

import random
from typing import Any

import msgspec

# 2026-01-01T00:00:00Z: a fixed default so output depends on the seed alone.
BASE_TS_MS = 1_767_225_600_000
BOX_DOMAIN = "box.parallelsandbox.com"
SDK = {"name": "boxtrail-js", "version": "0.1.0"}

LEVELS = ("debug", "info", "warn", "error")
LEVEL_WEIGHTS = (20, 60, 15, 5)

PAGES = ("", "cart", "checkout", "settings/profile", "products/42", "search", "orders", "login")
RESOURCES = ("items", "orders", "users/me", "cart", "search", "products", "session", "flags")
COMPONENTS = ("App", "CartView", "ProductCard", "SearchBox", "OrderList", "NavBar", "Modal")
BUTTONS = ("button#save", "a.nav-link", "button.add-to-cart", "input#search", "button#pay")
PROPS = ("id", "length", "map", "name", "price", "items", "then", "user")
RELEASES = ("web@1.4.0", "web@1.4.1", "web@1.5.0")
USER_AGENTS = (
    "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) "
    "Chrome/131.0.0.0 Safari/537.36",
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/537.36 (KHTML, like Gecko) "
    "Chrome/130.0.0.0 Safari/537.36",
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) "
    "Chrome/131.0.0.0 Safari/537.36 Edg/131.0.0.0",
)
ASSETS = ("index-3f9a2c1b.js", "vendor-8a1d77e0.js", "chunk-cart-51be.js")
FUNCTIONS = ("render", "onClick", "Ve", "n", "fetchJson", "Array.map", "dispatch", "commit")
ERRORS = (
    ("TypeError", "Cannot read properties of undefined (reading '{prop}')"),
    ("TypeError", "{prop} is not a function"),
    ("ReferenceError", "{prop} is not defined"),
    ("Error", "Request failed with status 500: /api/{resource}"),
    ("RangeError", "Maximum call stack size exceeded"),
)


def box_url(box_id: str, page: str) -> str:
    return f"https://{box_id}.{BOX_DOMAIN}/{page}"


def make_box_id(rng: random.Random) -> str:
    # A DNS label, so it fits the default box host pattern.
    return "b" + "".join(rng.choice("0123456789abcdef") for _ in range(9))


def _message(rng: random.Random, level: str) -> str:
    resource = rng.choice(RESOURCES)
    ms = rng.randint(3, 2400)
    if level == "debug":
        return rng.choice((
            f"render <{rng.choice(COMPONENTS)}> took {ms % 40}ms (changed: {rng.choice(PROPS)})",
            f"prefetch /api/{resource} ({rng.randint(1, 64)} KB)",
            f"state update {rng.choice(COMPONENTS)}.{rng.choice(PROPS)} -> {rng.randint(0, 999)}",
        ))
    if level == "info":
        return rng.choice((
            f"GET /api/{resource}?page={rng.randint(1, 20)}&limit=50 200 in {ms}ms",
            f"route changed from /{rng.choice(PAGES)} to /{rng.choice(PAGES)}",
            f"user clicked {rng.choice(BUTTONS)} on /{rng.choice(PAGES)}",
            f"loaded {rng.randint(1, 500)} {resource} from cache (stale after {ms}ms)",
        ))
    return rng.choice((
        f"slow response from /api/{resource}: {ms}ms",
        f"retrying POST /api/{resource} (attempt {rng.randint(2, 5)})",
        f"deprecated prop {rng.choice(PROPS)} passed to {rng.choice(COMPONENTS)}",
    ))


def _attrs(rng: random.Random) -> dict[str, str | int | float | bool]:
    pool: dict[str, str | int | float | bool] = {
        "route": "/" + rng.choice(PAGES),
        "durationMs": rng.randint(1, 3000),
        "status": rng.choice((200, 200, 200, 201, 304, 404, 500)),
        "cached": rng.random() < 0.3,
        "component": rng.choice(COMPONENTS),
        "ratio": round(rng.random(), 3),
        "traceId": f"{rng.getrandbits(128):032x}",
        "userId": f"u_{rng.randint(1000, 99_999)}",
        "viewport": rng.choice(("1440x900", "1920x1080", "390x844", "1280x720")),
    }
    keys = rng.sample(sorted(pool), rng.randint(4, 7))
    return {key: pool[key] for key in keys}


def _stack(rng: random.Random, box_id: str, head: str) -> str:
    frames = []
    for depth in range(rng.randint(3, 5)):
        location = f"https://{box_id}.{BOX_DOMAIN}/assets/{rng.choice(ASSETS)}"
        location += f":{rng.randint(1, 3)}:{rng.randint(10, 90_000)}"
        prefix = "async " if depth == 2 and rng.random() < 0.3 else ""
        frames.append(f"    at {prefix}{rng.choice(FUNCTIONS)} ({location})")
    return "\n".join([head, *frames])


def _error(rng: random.Random, box_id: str) -> dict[str, str]:
    type_, template = rng.choice(ERRORS)
    message = template.format(prop=rng.choice(PROPS), resource=rng.choice(RESOURCES))
    return {"type": type_, "message": message, "stack": _stack(rng, box_id, f"{type_}: {message}")}


def make_event(rng: random.Random, ts_ms: int, box_id: str = "b0000000000") -> dict[str, Any]:
    """One SDK event at ``ts_ms``; errors carry an ``error`` with a V8-style stack."""
    level = rng.choices(LEVELS, LEVEL_WEIGHTS)[0]
    event: dict[str, Any] = {"ts": ts_ms, "level": level, "url": box_url(box_id, rng.choice(PAGES))}
    if level == "error":
        error = _error(rng, box_id)
        event["message"] = f"{error['type']}: {error['message']}"
        event["error"] = error
    else:
        event["message"] = _message(rng, level)
    event["attrs"] = _attrs(rng)
    return event


def make_batch(rng: random.Random, n: int, ts_ms: int, box_id: str) -> dict[str, Any]:
    """One request body: a page session's context and ``n`` events ending at ``ts_ms``."""
    session_id = "".join(rng.choice("0123456789abcdef") for _ in range(16))
    context = {
        "sessionId": session_id,
        "release": rng.choice(RELEASES),
        "url": box_url(box_id, rng.choice(PAGES)),
        "userAgent": rng.choice(USER_AGENTS),
        "boxId": box_id,
        "sdk": dict(SDK),
    }
    # A batch spans a few seconds, oldest first, the way the SDK buffers them.
    start = ts_ms - n * 20
    events = [make_event(rng, start + i * 20 + rng.randint(0, 19), box_id) for i in range(n)]
    return {"context": context, "events": events}


def make_bodies(
    seed: int, count: int, n: int, *, ts_ms: int = BASE_TS_MS, boxes: int = 8
) -> list[bytes]:
    """``count`` encoded bodies of ``n`` events each, spread over ``boxes`` box ids.

    Pass ``ts_ms`` near now when the receiver must find the events in a recent window.
    """
    rng = random.Random(seed)
    box_ids = [make_box_id(rng) for _ in range(boxes)]
    encoder = msgspec.json.Encoder()
    return [
        encoder.encode(make_batch(rng, n, ts_ms - rng.randint(0, 60_000), box_ids[i % boxes]))
        for i in range(count)
    ]


_ATTR_TYPES = {bool: "boolean", int: "integer", float: "double", str: "string"}


def to_envelope(body: bytes) -> bytes:
    """The same events as a Sentry envelope with one ``log`` item, as ``Sentry.logger``
    sends them (seconds, ``body``, typed ``attributes``; an error's stack is not a log's)."""
    batch = msgspec.json.decode(body)
    items = [{"timestamp": e["ts"] / 1000, "level": e["level"], "body": e["message"],
              "attributes": {k: {"value": v, "type": _ATTR_TYPES.get(type(v), "string")}
                             for k, v in (e.get("attrs") or {}).items()}}
             for e in batch["events"]]
    payload = msgspec.json.encode({"version": 2, "items": items})
    header = msgspec.json.encode({"type": "log", "item_count": len(items),
                                  "content_type": "application/vnd.sentry.items.log+json"})
    sdk = msgspec.json.encode({"sdk": {"name": "sentry.javascript.browser",
                                       "version": "11.12.0"}})
    return b"\n".join([sdk, header, payload])
