"""``boxtrail serve`` and ``boxtrail keys create|list|revoke --tenant`` (on the server's
catalog); every other command is the client's (``boxtrail_client.cli``), as is ``keys``
without ``--tenant`` (the caller's tenant, over the HTTP API)."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import socket
import sqlite3
import sys
import time
from pathlib import Path
from typing import NoReturn

from boxtrail_client.cli import COMMANDS as CLIENT_COMMANDS
from boxtrail_client.cli import add_commands as add_client_commands
from boxtrail_client.cli import add_key_commands
from boxtrail_client.cli import run as run_client
from cluster.nodes import NodeError, resolve_node_id
from core.config import Config, ConfigError, load
from core.errors import ApiError, InvalidParameter
from metadata.connect import open_database
from metadata.db import MetadataUnavailable
from tenancy.keys import SCOPES
from tenancy.tenants import Tenancy

DEV_TENANT = "dev"


def bootstrap_dev_key(config: Config) -> str | None:
    """On an empty catalog: tenant ``dev`` and one key, kept in the catalog (so that every
    node of a cluster finds the same one) and written to ``<data>/dev-api-key``. Returns the
    key if this call created it."""
    data_dir = Path(config.data_dir)
    db = open_database(config.catalog_url, data_dir)
    created = False
    try:
        tenancy = Tenancy(db)
        with db.transaction():
            db.serialize("dev-api-key")  # nodes starting at once: one creates it
            row = db.execute("SELECT value FROM cluster_settings WHERE name = 'dev_api_key'"
                             ).fetchone()
            if row is not None:
                key = str(row[0])
            elif tenancy.tenant_count():
                return None  # made before the catalog kept it: its file is there already
            else:
                key, _ = tenancy.keys.create(tenancy.ensure_tenant(DEV_TENANT), "dev")
                db.execute("INSERT INTO cluster_settings (name, value) VALUES ('dev_api_key', ?)",
                           (key,))
                created = True
    finally:
        db.close()
    path = data_dir / "dev-api-key"
    data_dir.mkdir(parents=True, exist_ok=True)
    if created or not path.exists() or path.read_text().strip() != key:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(key + "\n")
    return key if created else None


def exit_unusable_data_dir(config: Config, exc: OSError | sqlite3.Error) -> NoReturn:
    """One line instead of a traceback: the data directory cannot be created or written."""
    data_dir = Path(config.data_dir)
    if isinstance(exc, OSError):
        reason = f"{exc.strerror or exc}: {exc.filename}" if exc.filename else str(exc)
    else:  # sqlite3 names no file: it is meta.sqlite
        reason = f"{exc}: {data_dir / 'meta.sqlite'}"
    sys.exit(f"boxtrail: cannot use the data directory {data_dir} ({reason}); set "
             "BOXTRAIL_DATA_DIR to a directory this user can create and write")


def exit_no_catalog(exc: MetadataUnavailable) -> NoReturn:
    sys.exit(f"boxtrail: {exc.message}; check BOXTRAIL_CATALOG_URL")


def _inside(filename: object, directory: str) -> bool:
    if not isinstance(filename, str | Path):
        return False
    return Path(os.path.abspath(filename)).is_relative_to(os.path.abspath(directory))


def tune_gc() -> None:
    """Keep the cyclic GC off the ingest path's back.

    A request allocates ~1,500 short-lived objects (decoded events, attrs dicts), so the
    default gen-0 threshold of 700 runs a collection twice per request, and every tenth
    of those walks the long-lived app objects again. Freezing what exists at start and
    collecting less often leaves the same garbage collected, in fewer, larger passes.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)


# How long a thread may hold the GIL while another waits for it (CPython's default: 5 ms).
# The event loop runs Python for long stretches under a heavy read (groupBy over 10,000
# errors); the WAL and query threads then wait up to this long for each of the few GIL
# hand-overs a 202 needs. At 0.5 ms, ingest's 202 p99 beside groupBy went from 194 to
# 71-81 ms (bench_isolation.py), and in-process ingest did not get slower.
SWITCH_INTERVAL_S = 0.0005


def serve(config: Config) -> None:
    import uvicorn
    import uvloop

    from boxtrail.app import create_app
    from boxtrail.server import protocol_class
    from core.storage import StorageError
    from ingest.wal import WalError, lock_directory

    try:  # the server takes the lock itself; this only turns a traceback into one line
        os.close(lock_directory(Path(config.data_dir) / "wal"))
        resolve_node_id(config.node_id, Path(config.data_dir))
        new_key = bootstrap_dev_key(config)
    except (WalError, NodeError) as exc:
        sys.exit(f"boxtrail: {exc}")
    except MetadataUnavailable as exc:
        exit_no_catalog(exc)
    except (OSError, sqlite3.Error) as exc:
        exit_unusable_data_dir(config, exc)
    sock = socket.socket(socket.AF_INET6 if ":" in config.host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((config.host, config.port))
    except OSError as exc:
        sock.close()
        sys.exit(f"boxtrail: cannot listen on {config.host}:{config.port}: {exc.strerror}; "
                 "set BOXTRAIL_PORT (or BOXTRAIL_HOST)")
    sock.listen(2048)
    host, port = sock.getsockname()[:2]
    try:
        app = create_app(config)
    except (OSError, StorageError) as exc:  # a part of the data directory (objects/) unusable
        cause = exc.__cause__ if isinstance(exc, StorageError) else exc
        if not (isinstance(cause, OSError) and _inside(cause.filename, config.data_dir)):
            raise
        exit_unusable_data_dir(config, cause)
    except sqlite3.Error as exc:
        exit_unusable_data_dir(config, exc)
    except NodeError as exc:
        sys.exit(f"boxtrail: {exc}")
    except MetadataUnavailable as exc:
        exit_no_catalog(exc)

    class Server(uvicorn.Server):
        """uvicorn's server, which tells the app that shutdown begins before it waits for
        open responses to end (``boxtrail.app.Served.stopping``): tails end at once."""

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            app.stopping()
            await super().shutdown(sockets)

    server = Server(uvicorn.Config(
        app, loop="none", http=protocol_class(config), lifespan="on",
        access_log=False, log_level="warning", timeout_graceful_shutdown=10,
        # No X-Forwarded-* rewriting (nothing reads the client address) and no Server
        # header: both cost per request on the ingest path.
        proxy_headers=False, server_header=False))
    tune_gc()
    sys.setswitchinterval(SWITCH_INTERVAL_S)

    async def run() -> None:
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.02)
        if server.started:
            key_path = Path(config.data_dir).resolve() / "dev-api-key"
            if new_key:
                print(f"boxtrail: created tenant '{DEV_TENANT}' with API key {new_key} "
                      f"(saved in {key_path})", flush=True)
            elif key_path.exists():
                print(f"boxtrail: dev API key in {key_path}", flush=True)
            print(f"boxtrail listening on http://{host}:{port}", flush=True)
        await task

    uvloop.run(run())


def keys_command(config: Config, args: argparse.Namespace) -> None:
    """On the catalog itself, as an operator on the server's host: a running node applies
    a revocation made here within a second (tenancy.changes)."""
    try:
        db = open_database(config.catalog_url, Path(config.data_dir))
        try:
            tenancy = Tenancy(db)
            if args.keys_command == "create":
                expires = None if args.expires_in is None else time.time() + args.expires_in
                secret, _ = tenancy.keys.create(tenancy.ensure_tenant(args.tenant), args.name,
                                                args.scope or SCOPES, expires)
                print(secret)
                print(f"API key for tenant {args.tenant!r}; it is shown only once.",
                      file=sys.stderr)
                return
            row = db.execute("SELECT id FROM tenants WHERE name = ?", (args.tenant,)).fetchone()
            if row is None:
                raise InvalidParameter(f"no tenant {args.tenant!r}")
            if args.keys_command == "list":
                for key in tenancy.keys.list(str(row[0])):
                    print(f"{key.id}  {key.prefix}...  {','.join(key.scopes):<30}  "
                          f"{key.name or '-'}  expires {key.expires_at or 'never'}  "
                          f"last used {key.last_used_at or 'never'}")
            else:
                tenancy.keys.revoke(str(row[0]), args.id)
                print(f"revoked {args.id}", file=sys.stderr)
        finally:
            db.close()
    except (OSError, sqlite3.Error) as exc:
        exit_unusable_data_dir(config, exc)
    except MetadataUnavailable as exc:
        exit_no_catalog(exc)
    except (ApiError, ValueError) as exc:
        sys.exit(f"boxtrail: {getattr(exc, 'message', exc)}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="boxtrail", description="boxtrail log service")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("serve", help="run the service (settings from BOXTRAIL_* variables)")
    keys = commands.add_parser(
        "keys", help="manage API keys: with --tenant on this server's catalog (a new tenant "
                     "too), else the caller's tenant's over the HTTP API")
    keys_commands = keys.add_subparsers(dest="keys_command", required=True)
    add_key_commands(keys_commands)
    for action in keys_commands.choices.values():
        action.add_argument("--tenant", help="on this server's catalog: the tenant (made "
                                             "if new); keys made so have every scope "
                                             "unless --scope says")
    add_client_commands(commands, remote_keys=False)
    args = parser.parse_args(argv)
    if args.command in CLIENT_COMMANDS and (args.command != "keys" or args.tenant is None):
        sys.exit(run_client(args, os.environ))  # a client of a server: no server settings
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        config = load()
    except ConfigError as exc:
        parser.exit(2, f"boxtrail: {exc}\n")
    if args.command == "serve":
        serve(config)
    elif args.command == "keys":
        keys_command(config, args)
