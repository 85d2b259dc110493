"""The client's commands: ``boxtrail search|tail|sourcemaps|keys|usage|deletions``, over the
HTTP API. They read ``BOXTRAIL_URL`` (default http://127.0.0.1:8780) and
``BOXTRAIL_API_KEY``. Levels are coloured when stdout is a terminal (``NO_COLOR`` turns
that off); ``tail`` follows until Ctrl-C and resumes with ``Last-Event-ID`` after a drop.
Every failure is one line on stderr and exit code 1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TextIO

import msgspec

from boxtrail_client.api import Client
from boxtrail_client.errors import ApiError, ClientError
from boxtrail_client.rows import Row
from boxtrail_client.upload import upload

COLORS = {"debug": "\x1b[2m", "info": "\x1b[36m", "warn": "\x1b[33m", "error": "\x1b[31;1m"}
RESET = "\x1b[0m"
SCOPES = ("read", "sourcemaps:write", "admin", "usage:read")
COMMANDS = ("search", "tail", "sourcemaps", "keys", "usage", "deletions")

# Everything a page sent reaches the terminal through here: control characters (escape
# sequences, carriage returns, a newline forging a log line) and bidirectional overrides
# are shown as escapes, never interpreted.
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e"
                          "\u2066-\u2069]")


def printable(text: str) -> str:
    return _UNPRINTABLE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


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


def _shown(row: Row, as_json: bool, color: bool) -> str:
    data = msgspec.to_builtins(row)
    return json.dumps(data) if as_json else format_row(data, color)


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser],
                 remote_keys: bool = True) -> None:
    """The client's commands; ``remote_keys``: ``keys`` too (the server's CLI adds its own,
    which work on the catalog with ``--tenant`` and hand the rest here)."""
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
    sourcemaps = commands.add_parser("sourcemaps", help="upload, list and delete source maps")
    actions = sourcemaps.add_subparsers(dest="sourcemaps_command", required=True)
    up = actions.add_parser("upload", help="upload a build directory's .js files and maps")
    up.add_argument("dir", type=Path, help="the build output directory")
    up.add_argument("--project", "-p", required=True)
    up.add_argument("--release", help="the release the pages send (context.release)")
    up.add_argument("--url-prefix", default="~/",
                    help="where DIR is served: ~/assets (any host) or https://cdn.example/x")
    for name in ("list", "delete"):
        action = actions.add_parser(name, help=f"{name} a project's source maps")
        action.add_argument("--project", "-p", required=True)
        action.add_argument("--release", required=name == "delete")
    if remote_keys:
        keys = commands.add_parser("keys", help="the tenant's API keys")
        add_key_commands(keys.add_subparsers(dest="keys_command", required=True))
    usage = commands.add_parser("usage", help="the tenant's usage")
    usage.add_argument("--since", default="24h")
    usage.add_argument("--interval", default="hour", choices=("minute", "hour", "day"))
    usage.add_argument("--kind", action="append", help="repeat for several (default: all)")
    usage.add_argument("--project", "-p")
    usage.add_argument("--group-by", default="project",
                       help="comma-separated: project, box, source, reason")
    deletions = commands.add_parser("deletions", help="a project's deletion jobs")
    deletions.add_argument("--project", "-p")


def add_key_commands(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    actions.add_parser("list", help="the tenant's API keys")
    create = actions.add_parser("create", help="a new API key of the caller's tenant")
    create.add_argument("--name", default="")
    create.add_argument("--scope", action="append", choices=SCOPES,
                        help="repeat for several")
    create.add_argument("--expires-in", type=int, metavar="SECONDS")
    revoke = actions.add_parser("revoke", help="revoke an API key, on every node")
    revoke.add_argument("id", help="the key's id (key_...)")


def run(args: argparse.Namespace, environ: Mapping[str, str], out: TextIO = sys.stdout,
        err: TextIO = sys.stderr) -> int:
    try:
        with Client(environ=environ) as client:
            _run(client, args, out, err)
    except ApiError as exc:
        print(f"boxtrail: {exc.status}: {exc.message}", file=err)
        return 1
    except ClientError as exc:
        print(f"boxtrail: {exc}", file=err)
        return 1
    except KeyboardInterrupt:
        return 0
    return 0


def _run(client: Client, args: argparse.Namespace, out: TextIO, err: TextIO) -> None:
    color = out.isatty() and "NO_COLOR" not in os.environ
    if args.command == "search":
        rows = list(client.search(args.project, args.query, since=args.since, box=args.box,
                                  limit=args.limit, page_size=min(args.limit, 1000)))
        for row in reversed(rows):  # oldest first on a terminal, like `tail`
            print(_shown(row, args.json, color), file=out)
    elif args.command == "tail":
        asyncio.run(_tail(client, args, out, err, color))
    elif args.command == "sourcemaps":
        _sourcemaps(client, args, out, err)
    elif args.command == "keys":
        _keys(client, args, out, err)
    elif args.command == "usage":
        for u in client.usage(since=args.since, interval=args.interval, kinds=args.kind,
                              project=args.project,
                              group_by=[g for g in args.group_by.split(",") if g]):
            dims = " ".join(printable(str(v)) for v in (u.project, u.box, u.source, u.reason)
                            if v)
            print(f"{u.at}  {u.kind:<24} {u.quantity:>14,} {u.unit:<10} "
                  f"${u.cost_usd:.6f}  {dims}", file=out)
    elif args.command == "deletions":
        for job in client.deletions(args.project):
            print(json.dumps(job), file=out)


async def _tail(client: Client, args: argparse.Namespace, out: TextIO, err: TextIO,
                color: bool) -> None:
    def dropped(count: int) -> None:
        print(f"... {count} rows skipped: this terminal fell behind", file=err, flush=True)

    async for row in client.tail(args.project, args.query, box=args.box, dropped=dropped):
        print(_shown(row, args.json, color), file=out, flush=True)


def _sourcemaps(client: Client, args: argparse.Namespace, out: TextIO, err: TextIO) -> None:
    if args.sourcemaps_command == "list":
        for item in client.sourcemaps(args.project, args.release):
            print(json.dumps(item), file=out)
        return
    if args.sourcemaps_command == "delete":
        count = client.delete_sourcemaps(args.project, args.release)
        print(f"deleted {count} files of release {args.release!r} of {args.project}", file=err)
        return
    try:
        answer, count, size, seconds = upload(args.dir, url=client.url,
                                              api_key=client.api_key, project=args.project,
                                              release=args.release,
                                              url_prefix=args.url_prefix, progress=err)
    except ApiError as exc:  # nothing was stored: which file, and why
        raise ClientError(f"upload refused ({exc.status} {exc.code}): {exc.message}") from None
    release_text = f"release {answer.release}" if answer.release else "no release"
    out.write(f"stored {len(answer.files)} source maps ({count} files, {size / 1e6:.1f} MB "
              f"in {seconds:.1f} s) for {release_text} at {answer.url_prefix}\n")
    for file in answer.files:
        js = file.name if file.has_js else "(no JS)"
        extra = f"  debug id {file.debug_id}" if file.debug_id else ""
        out.write(f"  {file.url}  <- {js} + {file.map_name}{extra}\n")
    for warning in answer.warnings:
        out.write(f"warning: {warning.message}\n")


def _keys(client: Client, args: argparse.Namespace, out: TextIO, err: TextIO) -> None:
    if args.keys_command == "list":
        for key in client.api_keys():
            print(f"{key['id']}  {key['prefix']}...  {','.join(key['scopes']):<30}  "
                  f"{key.get('name') or '-'}  expires {key.get('expiresAt') or 'never'}  "
                  f"last used {key.get('lastUsedAt') or 'never'}", file=out)
    elif args.keys_command == "create":
        made = client.create_key(args.name, args.scope or ["read"], args.expires_in)
        print(made["key"], file=out)
        print("It is shown only once.", file=err)
    else:
        client.revoke_key(args.id)
        print(f"revoked {args.id}", file=err)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="boxtrail", description="boxtrail's client")
    add_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    sys.exit(run(args, os.environ))
