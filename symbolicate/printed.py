"""What a frame's printed name tells about the function it was in, as each engine prints
names (``symbolicate.stack``): named, unnamed, anonymous or top-level code, and the property
keys it could be. Where a map's segment is coarse, it picks among the original's functions
(``symbolicate.scopes.SourceScopes.name_for``)."""

from __future__ import annotations

import functools
from typing import Literal, NamedTuple


class Printed(NamedTuple):
    """What a frame's printed name tells about its function. ``kind``: "named";
    "unnamed" (no name: V8 and SpiderMonkey print top-level code so too); "anonymous" (a
    function without a name: SpiderMonkey's ``outer/<``, or no name from JavaScriptCore,
    which labels top-level code); "top" (that label). ``keys``: the names it could be a
    property key of (the part after the last ``.``, and V8's ``[as alias]``)."""

    kind: Literal["named", "unnamed", "anonymous", "top"]
    keys: frozenset[str]
    # How many frames right above this one (its callees; built-in frames aside), printed
    # without a name too, the map puts at the same position: each is in a function nested
    # deeper in the line than its caller's.
    depth: int = 0
    awaiting: bool = False  # V8's "at async": the frame's function is an async one


_TOP_LEVEL = frozenset(("global code", "module code", "eval code"))

@functools.lru_cache(maxsize=4096)  # minified names repeat: a hit is 10x cheaper
def printed(function: str | None, alias: str | None = None, engine: str | None = None,
            is_async: bool = False) -> Printed:
    """The :class:`Printed` of a frame's printed ``function``, V8 ``alias`` and async
    mark, as ``engine`` (``symbolicate.stack``'s: "v8", "spidermonkey", "jsc") printed it
    (SpiderMonkey's ``async*`` marks a frame reached across an await, whatever its
    function: only V8's says the function is async)."""
    said = _printed(function, alias, engine)
    return said._replace(awaiting=True) if is_async and engine == "v8" else said


def _printed(function: str | None, alias: str | None, engine: str | None) -> Printed:
    if function in _TOP_LEVEL:
        return Printed("top", frozenset())
    keys = set()
    if alias:
        keys.add(alias)
    name = (function or "").strip()
    if name.endswith("<"):  # SpiderMonkey's "outer/<": an anonymous function inside "outer"
        return Printed("anonymous", frozenset(keys))
    if not name or name == "<anonymous>":
        return Printed("anonymous" if engine == "jsc" else "unnamed", frozenset(keys))
    name = name.rpartition("/")[2]  # SpiderMonkey's "outer/inner"
    for accessor in ("get ", "set "):
        name = name.removeprefix(accessor)
    key = name.rpartition(".")[2]
    if key:
        keys.add(key)
    return Printed("named", frozenset(keys))
