"""``boxtrail search`` and ``boxtrail tail``: the engineer's view, over the HTTP API.

Reads ``BOXTRAIL_URL`` (default http://127.0.0.1:8780) and ``BOXTRAIL_API_KEY``.
Levels are coloured when stdout is a terminal (``NO_COLOR`` turns that off).
``tail`` follows until Ctrl-C and reconnects with ``Last-Event-ID`` after a drop,
so nothing is missed or shown twice across reconnects.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Iterator, Mapping
from typing import TextIO

import httpx

DEFAULT_URL = "http://127.0.0.1:8780"
COLORS = {"debug": "\x1b[2m", "info": "\x1b[36m", "warn": "\x1b[33m", "error": "\x1b[31;1m"}
RESET = "\x1b[0m"
MAX_BACKOFF_S = 10.0


class CliError(Exception):
    """Something the user can fix; printed without a traceback."""


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    search = commands.add_parser("search", help="search a project's logs")
    search.add_argument("query", nargs="?", default="", help="search language (docs/search.md)")
    search.add_argument("--project", "-p", required=True)
    search.add_argument("--since", default="1h")
    search.add_argument("--box")
    search.add_argument("--limit", type=int, default=100)
    search.add_argument("--json", action="store_true", help="one JSON row per line")
    tail = commands.add_parser("tail", help="follow a project's logs live")
    tail.add_argument("query", nargs="?", default="")
    tail.add_argument("--project", "-p", required=True)
    tail.add_argument("--box")
    tail.add_argument("--json", action="store_true")


def client(environ: Mapping[str, str]) -> httpx.Client:
    key = environ.get("BOXTRAIL_API_KEY")
    if not key:
        raise CliError("set BOXTRAIL_API_KEY to an API key (see `boxtrail keys create`)")
    url = environ.get("BOXTRAIL_URL", DEFAULT_URL).rstrip("/")
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"},
                        timeout=httpx.Timeout(30, read=None))


def format_row(row: Mapping[str, object], color: bool) -> str:
    level = str(row.get("level", ""))
    shown = f"{level.upper():5}"
    if color:
        shown = COLORS.get(level, "") + shown + RESET
    box = f" [{printable(str(row['boxId']))}]" if row.get("boxId") else ""
    # The level is one of four names (the server's); everything else is the page's.
    text = f"{row.get('ts')} {shown}{box} {printable(str(row.get('message')))}"
    error = row.get("error")
    if isinstance(error, Mapping) and error.get("stack"):
        text += "\n" + "\n".join("    " + printable(line)
                                  for line in str(error["stack"]).split("\n"))
    return text


# Everything a page sent reaches the terminal through here: control characters (escape
# sequences, carriage returns, a newline forging a log line) and bidirectional overrides
# are shown as escapes, never interpreted.
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e"
                          "\u2066-\u2069]")


def printable(text: str) -> str:
    return _UNPRINTABLE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _fail(response: httpx.Response) -> CliError:
    try:
        message = response.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = response.text[:200]
    return CliError(f"{response.status_code}: {message}")


def search(args: argparse.Namespace, http: httpx.Client, out: TextIO) -> None:
    params: dict[str, str | int] = {"since": args.since, "limit": args.limit}
    if args.query:
        params["query"] = args.query
    if args.box:
        params["boxId"] = args.box
    response = http.get(f"/v1/projects/{args.project}/logs", params=params)
    if response.status_code != 200:
        raise _fail(response)
    color = out.isatty() and "NO_COLOR" not in os.environ
    # Newest first from the API; oldest first on a terminal, like `tail`.
    for row in reversed(response.json()["rows"]):
        print(json.dumps(row) if args.json else format_row(row, color), file=out)


def sse(response: httpx.Response) -> Iterator[tuple[str | None, str | None, str]]:
    event: str | None = None
    event_id: str | None = None
    data: list[str] = []
    for line in response.iter_lines():
        if not line:
            if data:
                yield event, event_id, "\n".join(data)
            event, event_id, data = None, None, []
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            event = value
        elif name == "id":
            event_id = value
        elif name == "data":
            data.append(value)


def tail(args: argparse.Namespace, http: httpx.Client, out: TextIO,
         max_reconnects: int | None = None) -> None:
    params = {k: v for k, v in (("query", args.query), ("boxId", args.box)) if v}
    color = out.isatty() and "NO_COLOR" not in os.environ
    last_id: str | None = None
    backoff = 0.5
    reconnects = 0
    while True:
        headers = {"Last-Event-ID": last_id} if last_id else {}
        try:
            with http.stream("GET", f"/v1/projects/{args.project}/tail", params=params,
                             headers=headers) as response:
                if response.status_code != 200:
                    response.read()
                    raise _fail(response)
                backoff = 0.5
                for event, event_id, data in sse(response):
                    last_id = event_id or last_id
                    if event == "log":
                        row = json.loads(data)
                        print(json.dumps(row) if args.json else format_row(row, color),
                              file=out, flush=True)
                    elif event == "dropped":
                        count = json.loads(data)["count"]
                        print(f"... {count} rows skipped: this terminal fell behind",
                              file=sys.stderr, flush=True)
        except httpx.TransportError as exc:
            print(f"boxtrail: connection lost ({exc}); reconnecting", file=sys.stderr)
        reconnects += 1
        if max_reconnects is not None and reconnects > max_reconnects:
            return
        time.sleep(backoff)
        backoff = min(backoff * 2, MAX_BACKOFF_S)


def run(args: argparse.Namespace, environ: Mapping[str, str], out: TextIO = sys.stdout) -> int:
    try:
        with client(environ) as http:
            if args.command == "search":
                search(args, http, out)
            else:
                tail(args, http, out)
    except CliError as exc:
        print(f"boxtrail: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    return 0
