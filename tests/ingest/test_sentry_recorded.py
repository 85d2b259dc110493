"""Envelopes recorded from @sentry/browser 11.12.0 in Chromium (tests/fixtures/sentry), sent
to the real server as the SDK sent them: every one is answered 200, the error, the rejection,
the message and the log lines come back as rows, and the error's frames are symbolicated
through the debug ids ``sentry-cli sourcemaps inject`` put in the bundle."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode

import httpx
import pytest

from tests.support.server import Server, create_project

RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "sentry" / "recorded"


def replay(server: Server, project: dict[str, Any], run: str) -> list[str]:
    """Post every envelope of ``run`` with its recorded query, headers and body; the DSN's
    key and id swapped for ``project``'s. Returns the recorded files' names."""
    sent = []
    for body_path in sorted((RECORDED / run).glob("*.envelope")):
        meta = json.loads(body_path.with_suffix(".json").read_text())
        query = dict(parse_qsl(meta["query"]))
        query["sentry_key"] = project["sentryKey"]
        headers = {name: value for name, value in meta["headers"]
                   if name.lower() in ("content-type", "user-agent", "origin")}
        r = httpx.post(f"{server.url}/api/{project['sentryId']}/envelope/?{urlencode(query)}",
                       content=body_path.read_bytes(), headers=headers)
        assert r.status_code == 200, (body_path.name, r.text)
        sent.append(body_path.name)
    return sent


@pytest.mark.parametrize("run", ["plain", "debug-ids"])
def test_recorded_envelopes_become_rows(server: Server, api: httpx.Client, run: str) -> None:
    project = create_project(api, "recorded")
    if run == "debug-ids":  # as `sentry-cli sourcemaps inject` left them
        bundle = RECORDED / run / "bundle"
        r = api.post("/v1/projects/recorded/sourcemaps", files=[
            ("file", ("main.js", (bundle / "main.js").read_bytes())),
            ("file", ("main.js.map", (bundle / "main.js.map").read_bytes()))])
        assert r.status_code == 201, r.text
        assert r.json()["files"][0]["debugId"]
    replay(server, project, run)
    rows = api.get("/v1/projects/recorded/logs", params={"since": "5000w"}).json()["rows"]
    by_message = {row["message"]: row for row in rows}
    assert set(by_message) == {"TypeError: no price for mug", "Error: out of stock: mug",
                               "cart viewed", "cart loaded", "slow price lookup",
                               "checkout failed"}
    # captureMessage: a log line (its synthetic stack dropped), not an error.
    assert by_message["cart viewed"]["level"] == "info"
    assert by_message["cart viewed"]["error"] is None
    assert by_message["slow price lookup"]["level"] == "warn"
    assert {k: v for k, v in by_message["cart loaded"]["attrs"].items()
            if not k.startswith("sentry.")} == {"cartId": "c-17", "items": 2, "total": 6.5,
                                               "guest": True}
    assert all(row["release"] == "boxtrail-fixtures@1.0.0" for row in rows)
    thrown = by_message["TypeError: no price for mug"]
    assert thrown["attrs"]["environment"] == "fixtures"
    assert thrown["error"]["type"] == "TypeError"

    errors = api.get("/v1/projects/recorded/errors", params={"since": "5000w"}).json()["rows"]
    [checkout] = [e for e in errors if e["error"]["message"] == "no price for mug"]
    frames = [f for f in checkout["error"]["frames"] if f["line"] is not None]
    if run == "plain":  # no map uploaded: as the SDK reported them
        assert all(not f["symbolicated"] for f in frames)
        return
    # Innermost first: priceOf's throw, the reduce callback, Cart.total, checkout, and the
    # SDK's timer wrapper that called it.
    assert [(f["file"], f["line"]) for f in frames] == [
        ("app/src/cart.js", 5), ("app/src/cart.js", 16), ("app/src/cart.js", 16),
        ("app/src/main.js", 15), ("node_modules/@sentry/browser/src/helpers.ts", 157)], frames
    assert all(f["symbolicated"] for f in frames)
    [rejected] = [e for e in errors if e["error"]["message"] == "out of stock: mug"]
    assert [(f["file"], f["line"]) for f in rejected["error"]["frames"]] == [
        ("app/src/stock.js", 10)]
