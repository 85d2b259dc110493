"""A row's ``attrs``: a JSON object of scalars, stored as text, read one way by every reader.

Search reads the stored text with DuckDB's ``json_extract``, which takes a duplicated key's
*first* value; :func:`decode`, which every other reader (rows, tails, MCP, the errors
view) and ingest's per-event path use, does the same. Ingest's fast path stores the text
as sent (decoding it there cost ~2 us an event), so this is where duplicates are settled.
"""

from __future__ import annotations

import json
import math

import msgspec

Scalar = str | int | float | bool | None

_decoder = msgspec.json.Decoder(dict[str, Scalar])
# Whitespace between a key and its colon: the key count below does not see such a key.
_SPACED = (b'" :', b'"\t:', b'"\n:', b'"\r:')


class AttrsError(ValueError):
    """Not a JSON object of scalars with numbers in float range."""


def decode(text: str | bytes | msgspec.Raw) -> dict[str, Scalar]:
    """The attrs as a dict, a duplicated key's first value kept; raises
    :class:`msgspec.DecodeError` or :class:`AttrsError` for anything else."""
    data = text.encode() if isinstance(text, str) else bytes(text)
    decoded = _decoder.decode(data)  # keeps the last duplicate; refuses what is not scalars
    # Every key ends with '":' when no whitespace precedes its colon, and '":' inside a
    # string is escaped ('\\":'), counted too: as many as the dict has keys means none
    # was duplicated. Else (rarely) the text is read again pair by pair.
    if data.count(b'":') == len(decoded) and not any(s in data for s in _SPACED):
        return decoded
    return _first_wins(data)


def _first_wins(data: bytes) -> dict[str, Scalar]:
    def pairs(items: list[tuple[str, object]]) -> dict[str, object]:
        out: dict[str, object] = {}
        for key, value in items:
            out.setdefault(key, value)
        return out

    def constant(name: str) -> object:
        raise AttrsError(f"{name} is not JSON")

    value = json.loads(data, object_pairs_hook=pairs, parse_constant=constant)
    if not isinstance(value, dict):
        raise AttrsError("attrs must be an object")
    for key, item in value.items():
        if isinstance(item, float) and not math.isfinite(item):
            raise AttrsError(f"attrs.{key[:40]}: number out of range")
        if not isinstance(item, str | int | float | bool | None):
            raise AttrsError(f"attrs.{key[:40]}: only scalars")
    return value
