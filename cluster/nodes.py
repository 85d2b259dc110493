"""This node's identity in a cluster: its id, its number, and proof that it is live.

A node's id names what in the shared catalog is its own (its WAL position, the files it is
writing). It comes from ``BOXTRAIL_NODE_ID``, else from ``<data>/node-id`` (written at the
first start), else from the host name. The data directory keeps the id it was first used
with: its WAL belongs to that id, so a node (or a replacement given its volume) started on
it with another id is refused instead of replaying its WAL under a name the catalog does
not know.

On PostgreSQL a live node holds a session-level advisory lock named after its id, on a
connection of its own. A second process with the same id is refused at start; a node that
dies (however: SIGKILL included) loses its connection and so its lock at once, and can be
restarted at once. There is no heartbeat and no membership protocol: PostgreSQL's lock
table is the registry. On SQLite, the data directory's lock (``ingest.wal``) does the same.
"""

from __future__ import annotations

import logging
import os
import re
import socket
from datetime import UTC, datetime
from pathlib import Path

from metadata.db import Database, LifeLock, LockTaken

log = logging.getLogger("boxtrail.node")

NODE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
ID_FILE = "node-id"
MAX_NODES = 1023  # node numbers 1..1023


class NodeError(Exception):
    """This node cannot start as configured (one line for the operator)."""


def resolve_node_id(configured: str, data_dir: Path) -> str:
    """This node's id (see the module docstring), written to ``<data>/node-id`` if new."""
    path = data_dir / ID_FILE
    try:
        stored = path.read_text().strip()
    except FileNotFoundError:
        stored = ""
    if configured and stored and configured != stored:
        raise NodeError(
            f"the data directory {data_dir} belongs to node {stored!r} (its WAL is that "
            f"node's), not to BOXTRAIL_NODE_ID={configured!r}; start it as {stored!r} or "
            "give this node an empty data directory")
    node_id = configured or stored or socket.gethostname().split(".")[0]
    if not NODE_ID.fullmatch(node_id):
        if configured or stored:
            raise NodeError(f"node id {node_id!r} must be 1-64 letters, digits, '.', '_' or "
                            "'-', starting with a letter or digit")
        node_id = re.sub(r"[^A-Za-z0-9._-]", "-", node_id).strip(".-_")[:64] or "node"
    if not stored:
        data_dir.mkdir(parents=True, exist_ok=True)
        temp = path.with_suffix(".tmp")
        with temp.open("w") as f:
            f.write(node_id + "\n")
            f.flush()
            os.fsync(f.fileno())
        temp.replace(path)
    return node_id


class Membership:
    """This node's place in the catalog: its number, and (PostgreSQL) its liveness lock."""

    def __init__(self, db: Database, node_id: str) -> None:
        self.db = db
        self.node_id = node_id
        self.index = 0
        self._live: LifeLock | None = None

    def join(self) -> int:
        """Take this node's id (or raise :class:`NodeError` if a live node has it) and its
        number; return the number."""
        try:
            self._live = self.db.lock_for_life("node:" + self.node_id)
        except LockTaken:
            raise NodeError(
                f"node id {self.node_id!r} is in use by a live node of this catalog; "
                "give each node its own BOXTRAIL_NODE_ID") from None
        with self.db.transaction():
            self.db.serialize("nodes")
            row = self.db.execute("SELECT idx FROM nodes WHERE node_id = ?",
                                  (self.node_id,)).fetchone()
            started = datetime.now(UTC).isoformat(timespec="seconds")
            if row is None:
                index = int(self.db.execute(
                    "SELECT coalesce(max(idx), 0) + 1 FROM nodes").fetchone()[0])
                if index > MAX_NODES:
                    raise NodeError(f"this catalog has {MAX_NODES} node ids already")
                self.db.execute("INSERT INTO nodes (node_id, idx, host, pid, started_at) "
                                "VALUES (?, ?, ?, ?, ?)",
                                (self.node_id, index, socket.gethostname(), os.getpid(),
                                 started))
            else:
                index = int(row[0])
                self.db.execute("UPDATE nodes SET host = ?, pid = ?, started_at = ? "
                                "WHERE node_id = ?",
                                (socket.gethostname(), os.getpid(), started, self.node_id))
        self.index = index
        return index

    def check(self) -> bool:
        """Whether this node still holds its id; after the catalog came back from an outage
        (the lock went with the old connection), take it again. False if another process
        took it meanwhile (logged: two processes then act as one node)."""
        if self._live is None:
            return True
        held = self._live.check()
        if not held:
            log.error("node id %r was taken by another process while the catalog was out of "
                      "reach; stop one of them", self.node_id)
        return held

    def leave(self) -> None:
        if self._live is not None:
            self._live.release()
            self._live = None
