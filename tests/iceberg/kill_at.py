"""``boxtrail serve`` that SIGKILLs itself at one point of its first change to a table:

- ``staged``: the table's new metadata written beside the data, the transaction that would
  move the table's pointer and make the files live in boxtrail's catalog not committed;
- ``committed``: right after that transaction committed, before the flush drops its rows
  from the buffer or retires the WAL.

Run as ``python tests/iceberg/kill_at.py`` with ``KILL_AT`` set (tests/iceberg/test_repair.py).
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from boxtrail.cli import main
from iceberg import tables
from metadata import catalog


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def install(at: str) -> None:
    if at == "staged":
        swap = tables.Tables.swap

        def swap_then_die(self: tables.Tables, moves: Any) -> None:
            if moves:
                _die()
            swap(self, moves)

        tables.Tables.swap = swap_then_die  # type: ignore[method-assign]
    elif at == "committed":
        publish = catalog.Catalog._publish

        def publish_then_die(self: catalog.Catalog, keys: list[str], *args: Any) -> None:
            publish(self, keys, *args)
            if keys and self.mirror is not None:
                _die()

        catalog.Catalog._publish = publish_then_die  # type: ignore[method-assign]
    else:
        raise SystemExit(f"KILL_AT={at!r}: staged or committed")


if __name__ == "__main__":
    install(os.environ.pop("KILL_AT"))
    sys.argv = ["boxtrail", "serve"]
    main()
