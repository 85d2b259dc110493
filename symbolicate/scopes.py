"""Function names from the original source: which function encloses a position, named the
way V8 names it.

A source map says where a minified position came from (file, line, column); the name of the
function a frame was in is a property of the *original* source at that position, not of the
minified code (where the minifier may have inlined the function, or renamed it). So each
original source the map carries (``sourcesContent``) is parsed once with tree-sitter
(``tree-sitter-javascript``; ``tree-sitter-typescript`` for ``.ts``/``.tsx`` sources) and
its functions kept as a table of nested ranges with their names (:class:`SourceScopes`);
a lookup finds the innermost function holding the position.

Names follow V8's rules (what Chromium and Node print for the unbundled code), as far as
the source decides them - V8 prints the *receiver's* type, which only the running code
knows, so the defining class stands for it:

- ``function f() {}``, ``function* f() {}``, a named function expression: ``f``;
- a class's method, static method, or arrow/function held by a field: ``Class.m``
  (V8 prints the receiver's class: a subclass instance calling an inherited method prints
  ``Sub.m``); the constructor: ``Class`` (printed ``new Class``); a getter or setter:
  ``get m`` / ``set m``; a private method: ``#m``; a class expression takes the name of the
  variable or property it is assigned to;
- a method, arrow or function expression that is an object literal's property:
  ``Object.k`` (V8's type name for plain objects), or ``k`` alone when the key is not an
  identifier (``"str key"``, ``42``), as V8 prints it;
- an anonymous arrow or function expression assigned to a variable, a parameter default or
  an identifier: that name; assigned to a member expression: the dotted path V8 infers
  (``app.ui.onClick``, ``handlers.on-pack``); ``this.x = ...`` inside a class or a
  constructor function: ``Class.x``; ``export default function () {}``: ``default``;
- anything else - a callback passed to a call, a returned or immediately invoked function,
  an array element - is anonymous: no name (``None``), printed as a bare location, as V8
  prints it;
- code outside any function (module or script top level): no name.

Columns are UTF-16 code units, as in source maps: sources are parsed as UTF-16, so a
position after an emoji or a CJK character lands where the map says.

Tables are plain data (:meth:`SourceScopes.pack`), built once per artifact and stored beside
it (``symbolicate.lookup``), so a restart does not parse again. A source that cannot be
parsed still gets a table (tree-sitter recovers from syntax errors and keeps the functions it
can see); a source larger than :data:`MAX_SOURCE_CHARS`, or whose parse takes longer than
:data:`PARSE_SECONDS` plus :data:`PARSE_SECONDS_PER_MB` a megabyte, gets none, and its frames
are named from the minified code, marked so.

The position is not always enough: a map's segment covers code from its original position
on, and where it also covers functions starting later on its line (webpack's own maps start
one at a line's first column: 84% of the frames over such a map were named right by the
position alone, in the names matrix), the frame's printed name picks among them
(:meth:`SourceScopes.name_for`, :func:`printed`): a property key it printed, or what
printing no name, ``async`` or a name at top level says. The tables keep what that needs:
where the map's last segment before each function's body and end is (``leads``, ``tails``),
its key, whether it is async.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Iterable, Mapping
from importlib.metadata import version

import msgspec
import numpy as np
import numpy.typing as npt
import tree_sitter_javascript
import tree_sitter_typescript
from tree_sitter import Language, Node, Parser, Tree

from symbolicate.printed import Printed
from symbolicate.v8names import Namer, modifiers

MAX_SOURCE_CHARS = 16 << 20  # larger original sources are not parsed
# A parse that takes longer than this is given up: tree-sitter parses real code at 1.5-6 M
# characters a second here, but its error recovery on crafted text (random punctuation) at
# 0.07 M: the source gets no table.
PARSE_SECONDS = 1.0
PARSE_SECONDS_PER_MB = 2.0
_CHUNK = 1 << 20
# Part of the stored tables' key: tables built by another parser or rules are built again.
FORMAT = (f"2-ts{version('tree-sitter')}-js{version('tree-sitter-javascript')}"
          f"-ts{version('tree-sitter-typescript')}")

# Original positions a map gives segments in one source: packed as SourceScopes.starts,
# sorted, unique.
Marks = npt.NDArray[np.int64]
_NO_MARKS: Marks = np.zeros(0, np.int64)

_FUNCTION_TYPES = ("function_declaration", "generator_function_declaration",
                   "function_expression", "generator_function", "arrow_function",
                   "method_definition")
_LANGUAGES = {
    "javascript": Language(tree_sitter_javascript.language()),
    "typescript": Language(tree_sitter_typescript.language_typescript()),
    "tsx": Language(tree_sitter_typescript.language_tsx()),
}
_FUNCTION_SET = frozenset(_FUNCTION_TYPES)


def language_of(source_name: str) -> str:
    """The grammar for a source, by its name's extension (JSX parses as JavaScript)."""
    path = source_name.split("?", 1)[0].lower()
    if path.endswith(".tsx"):
        return "tsx"
    if path.endswith((".ts", ".mts", ".cts")):
        return "typescript"
    return "javascript"


class SourceScopes(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """One source's functions, ordered by start: ``starts``/``ends`` are positions packed as
    ``line << 32 | column`` (0-based; UTF-16 columns), ``parents`` the index of the
    enclosing function (-1 at top level), ``names`` their names (None: anonymous).

    What a frame's printed name can be checked against (:meth:`name_for`): ``keys``, the
    property each function is named by, which minifiers keep (``k`` of ``{k: () => 1}``, a
    method's name, the last part of ``a.b.k = function () {}``), else None; ``asyncs``,
    which are async functions; ``bodies``, where the code of each function's body starts
    (its expression, or its block's first statement; packed), the first place a frame in it
    can be; ``leads``, for each, the greatest original column at or before that on its line
    where the map has a segment (-1: none), and ``tails`` the same for each function's end;
    both empty when the map's segments are unknown (an index map, a ``sourceRoot``:
    ``symbolicate.built.recorded``), and then names are as the position alone gives them."""

    starts: list[int]
    ends: list[int]
    parents: list[int]
    names: list[str | None]
    keys: list[str | None] = []
    asyncs: list[bool] = []
    bodies: list[int] = []
    leads: list[int] = []
    tails: list[int] = []

    def name_at(self, line: int, column: int) -> tuple[bool, str | None]:
        """The function holding the 1-based ``line``:``column`` as (inside one, its name):
        (False, None) at top level, (True, None) in an anonymous function."""
        index = self._holding((line - 1) << 32 | (column - 1))
        if index < 0:
            return False, None
        return True, self.names[index]

    def _holding(self, at: int) -> int:
        index = bisect.bisect_right(self.starts, at) - 1
        # Ranges nest: a function holding the position holds the last one starting before it.
        while index >= 0 and self.ends[index] <= at:
            index = self.parents[index]
        return index

    def name_for(self, line: int, column: int, printed: Printed | None) -> tuple[str | None, str]:
        """The function of a frame whose map segment gives the 1-based ``line``:``column``,
        and the rule that chose it (``FrameOut.function_source``): ``source``, the function
        holding the position, unless the segment is coarse - the map gives no segment
        between the position and the body of functions starting later on that line, or the
        end of the one holding it (webpack's own maps cover a line from its first column) -
        and the printed frame says which function it is in:

        - ``printed_key``: it printed the property key of one of them (V8's
          ``Object.onSave``, SpiderMonkey's ``onSave``: minifiers keep property names);
        - ``span``: a name was printed, the holder is anonymous and the segment covers its
          end (an IIFE's closing line): the named function holding it; or V8 printed
          ``async`` and only one of them is an async function; or the
          frame and its callees at this position were all printed without a name (one a
          function, innermost first); or the position is top-level code (which runs once,
          at load: the frame is in one of them, a named one if a name was printed); or no
          name was printed while the holder has one (an anonymous one of them, else the only
          one: JavaScriptCore prints some keys' arrows without a name).

        The holder stays wherever the print agrees with it (its key, or a name printed for a
        named holder). ``printed`` None, or a table without ``leads``: ``source`` alone."""
        at = (line - 1) << 32 | (column - 1)
        index = self._holding(at)
        held = (self.names[index] if index >= 0 else None), "source"
        if printed is None or not self._marked():
            return held
        parent = self.parents[index] if index >= 0 else -1
        if parent >= 0 and self.names[index] is None and self.names[parent] is not None and (
                printed.kind == "named" and self._closes(index, at)):
            # The segment covers the end of the anonymous function holding it (maps put the
            # call of "(() => {...})()" after its closing brace): a name was printed, so
            # the frame is in the named function that holds it.
            return self.names[parent], "span"
        spanned = self._spanned(at)
        if not spanned or (index >= 0 and self._key(index) in printed.keys):
            return held
        if printed.awaiting and len(self.asyncs) == len(self.starts):
            # V8's "at async f": a frame of an async function, resumed after an await.
            awaiting = [c for c in spanned + ([index] if index >= 0 else [])
                        if self.asyncs[c]]
            if len(awaiting) == 1:
                return self.names[awaiting[0]], ("source" if awaiting[0] == index else "span")
        if len(self.keys) == len(self.starts):
            for candidate in spanned:
                if self.keys[candidate] in printed.keys:
                    return self.names[candidate], "printed_key"
        if printed.depth and printed.kind in ("anonymous", "unnamed"):
            # A caller of a frame at this position, both printed without a name: the
            # functions the segment covers, innermost first, one a frame.
            chain = sorted(spanned + ([index] if index >= 0 else []),
                           key=lambda c: (self._depth(c), self.starts[c]), reverse=True)
            return self.names[chain[min(printed.depth, len(chain) - 1)]], "span"
        if index < 0 and printed.kind != "top":
            # Top-level code runs once, at load: a frame there is far more likely in a
            # function the segment covers; one with a name if one was printed, else one
            # without (a minifier may have inlined a named one into an anonymous one).
            named = printed.kind == "named"
            fitting = [c for c in spanned if (self.names[c] is not None) == named]
            return self.names[(fitting or spanned)[0]], "span"
        if printed.kind in ("anonymous", "unnamed") and index >= 0 and (
                self.names[index] is not None):
            # No name printed where the holder would print one: a function the segment
            # covers that has none, or (JavaScriptCore prints some keys' arrows without a
            # name) the one function it covers.
            if any(self.names[c] is None for c in spanned):
                return None, "span"
            if printed.kind == "anonymous" and len(spanned) == 1:
                return self.names[spanned[0]], "span"
        return held

    def coarse(self) -> frozenset[int]:
        """The positions (packed) of the map's segments that cover a function starting
        later on their line: only a frame there may be named otherwise than by the position
        (:meth:`name_for`). A segment at ``c`` covers ``f`` when it is the last one before
        ``f``'s body and ``f`` starts after it: ``c`` is ``f``'s lead."""
        if not self._marked():
            return frozenset()
        covering = {(start >> 32) << 32 | lead
                    for start, body, lead in zip(self.starts, self.bodies, self.leads,
                                                 strict=True)
                    if 0 <= lead < start & 0xFFFFFFFF and body >> 32 == start >> 32}
        covering.update((end >> 32) << 32 | tail
                        for end, tail in zip(self.ends, self.tails, strict=True)
                        if 0 <= tail < end & 0xFFFFFFFF)
        return frozenset(covering)

    def _marked(self) -> bool:
        n = len(self.starts)
        return len(self.leads) == len(self.bodies) == len(self.tails) == n

    def _closes(self, index: int, at: int) -> bool:
        """Whether the segment at ``at`` is the last one before ``index``'s end, on its line."""
        end = self.ends[index]
        return end >> 32 == at >> 32 and self.tails[index] == at & 0xFFFFFFFF

    def _depth(self, index: int) -> int:
        depth = 0
        while index >= 0:
            index, depth = self.parents[index], depth + 1
        return depth

    def _key(self, index: int) -> str | None:
        return self.keys[index] if len(self.keys) == len(self.starts) else None

    def _spanned(self, at: int) -> list[int]:
        """The functions starting after ``at`` on its line whose body starts on that line
        with no segment of the map between ``at`` and it: the segment at ``at`` covers
        their code as well as what holds them."""
        found = []
        line, column = at >> 32, at & 0xFFFFFFFF
        index = bisect.bisect_right(self.starts, at)
        end = min(len(self.starts), index + _MAX_SPANNED)
        while index < end and self.starts[index] >> 32 == line:
            if self.bodies[index] >> 32 == line and self.leads[index] <= column:
                found.append(index)
            index += 1
        return found


_MAX_SPANNED = 64  # functions starting on one line considered for a coarse segment


def build_scopes(text: str, source_name: str, marks: Marks | None = None
                 ) -> SourceScopes | None:
    """The functions of one original source, or None when it is too large or too slow to
    parse. ``marks``: the original positions (packed, sorted) the map gives any segment in
    this source, for ``leads``; None: unknown."""
    if len(text) > MAX_SOURCE_CHARS:
        return None
    data = text.encode("utf-16-le", "surrogatepass")
    deadline = time.monotonic() + PARSE_SECONDS + PARSE_SECONDS_PER_MB * len(text) / 1e6
    stopped = False

    def stop(_offset: int, _has_error: bool) -> bool:
        nonlocal stopped
        stopped = stopped or time.monotonic() > deadline
        return stopped

    try:
        # Read in chunks (the callback form is the one that takes a progress callback).
        tree = Parser(_LANGUAGES[language_of(source_name)]).parse(
            lambda offset, _point: data[offset:offset + _CHUNK], encoding="utf16",
            progress_callback=stop)
    except ValueError:  # "Parsing failed": stopped
        return None
    if stopped or tree is None:
        return None
    walked = _functions(tree, deadline)
    if walked is None:
        return None
    nodes, node_parents = walked
    starts: list[int] = []
    ends: list[int] = []
    parents: list[int] = []
    names: list[str | None] = []
    keys: list[str | None] = []
    asyncs: list[bool] = []
    bodies: list[int] = []
    open_: list[int] = []  # indices of the functions holding the current one
    source = Namer(data, node_parents)
    for node in nodes:
        while open_ and nodes[open_[-1]].end_byte <= node.start_byte:
            open_.pop()
        parents.append(open_[-1] if open_ else -1)
        starts.append(_packed(node.start_point))
        # An immediately invoked function's closing brace is its caller's: maps put the call
        # of ``(() => {...})()`` there (a declaration's is its own: an inlined body's end).
        ends.append(_packed(node.end_point) - source.invoked(node))
        names.append(_storable(source.name_of(node)))
        keys.append(_storable(source.key_of(node)))
        asyncs.append("async" in modifiers(node))
        bodies.append(_packed(_body_start(node)))
        open_.append(len(starts) - 1)
    return SourceScopes(starts, ends, parents, names, keys, asyncs, bodies,
                        [] if marks is None else _leads(bodies, marks),
                        [] if marks is None else _leads(ends, marks))


def _storable(name: str | None) -> str | None:
    """``name``, or None where it holds a lone surrogate (a string key such as
    ``"\\ud800"``): tables are stored as msgpack, whose strings are UTF-8, and one such
    name must not cost a map all of its tables."""
    if name is None or name.isascii():
        return name
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return None
    return name


def _body_start(node: Node) -> tuple[int, int]:
    """Where a function's code starts: its expression body, its block's first statement,
    or (an empty block) the block's end."""
    body = node.child_by_field_name("body")
    if body is None:
        return node.end_point
    if body.type != "statement_block":
        return body.start_point
    for child in body.named_children:
        if child.type != "comment":
            return child.start_point
    return body.end_point


def _leads(positions: list[int], marks: Marks) -> list[int]:
    """For each position, the greatest of ``marks`` at or before it on its line (its
    column), else -1."""
    if not positions:
        return []
    packed = np.array(positions, np.int64)
    if not len(marks):
        return [-1] * len(positions)
    index = np.searchsorted(marks, packed, side="right") - 1
    found = marks[np.maximum(index, 0)]
    same_line = (index >= 0) & ((found >> 32) == (packed >> 32))
    return np.where(same_line, found & 0xFFFFFFFF, -1).tolist()  # type: ignore[no-any-return]


def _functions(tree: Tree, deadline: float) -> tuple[list[Node], dict[int, Node]] | None:
    """The tree's function nodes in document order (outer before inner) and every node's
    parent by node id, or None past the deadline. A walk, linear in the tree: a tree-sitter
    query is quadratic in the nesting depth (40,000 unclosed braces took 3 s), and so is
    ``Node.parent`` (tree-sitter finds a parent by descending from the root)."""
    found: list[Node] = []
    parents: dict[int, Node] = {}
    path: list[Node] = []  # the ancestors of the cursor's node
    cursor = tree.walk()
    steps = 0
    while True:
        steps += 1
        if not steps & 0xFFFF and time.monotonic() > deadline:
            return None
        node = cursor.node
        if node is None:
            return found, parents
        if path:
            parents[node.id] = path[-1]
        if node.type in _FUNCTION_SET:
            found.append(node)
        if cursor.goto_first_child():
            path.append(node)
            continue
        while not cursor.goto_next_sibling():
            if not cursor.goto_parent():
                return found, parents
            path.pop()


def _packed(point: tuple[int, int]) -> int:
    row, column = point
    return row << 32 | (column // 2)  # UTF-16: two bytes a code unit


# --- storage: one artifact's tables, by source name --------------------------------------

_encode = msgspec.msgpack.Encoder().encode
_tables = msgspec.msgpack.Decoder(tuple[str, bool, dict[str, msgspec.Raw]])
_table = msgspec.msgpack.Decoder(SourceScopes | None)


class StaleScopes(ValueError):
    """Stored tables that cannot be used: damaged, or built by another :data:`FORMAT`."""


def pack(tables: dict[str, SourceScopes | None], complete: bool = False) -> bytes:
    """An artifact's tables as bytes (msgpack, each source decoded on first use);
    ``complete``: every source of the map has one."""
    return _encode((FORMAT, complete,
                    {name: msgspec.Raw(_encode(t)) for name, t in tables.items()}))


def pack_sources(sources: Iterable[tuple[str | None, str | None]],
                 marks: Mapping[str, Marks] | None = None) -> bytes:
    """The tables of a map's original sources, given as (name, content) in the map's order
    (the first of two sources of one name is the one a lookup by name finds). A source
    without a name has no file in a frame, and so needs no name either. ``marks``: by
    source name, the positions the map gives segments (``build_scopes``); None: unknown."""
    tables: dict[str, SourceScopes | None] = {}
    complete = True
    for name, text in sources:
        if not name or name in tables:
            continue
        known = None if marks is None else marks.get(name, _NO_MARKS)
        tables[name] = None if text is None else build_scopes(text, name, known)
        complete = complete and tables[name] is not None
    return pack(tables, complete)


class PackedScopes:
    """An artifact's stored tables, decoded source by source when a frame lands in it."""

    def __init__(self, data: bytes) -> None:
        try:
            fmt, self.complete, self._raw = _tables.decode(data)
        except msgspec.DecodeError as exc:
            raise StaleScopes(str(exc)) from None
        if fmt != FORMAT:
            raise StaleScopes(f"built by {fmt!r}")
        self._decoded: dict[str, SourceScopes | None] = {}
        self._coarse: dict[str, frozenset[int]] = {}
        self.raw_bytes = len(data)

    def coarse(self, source_name: str) -> frozenset[int]:
        """``SourceScopes.coarse`` of a source's table (none without one), computed once:
        a frame elsewhere costs a set lookup."""
        found = self._coarse.get(source_name)
        if found is None:
            table = self.get(source_name)
            found = self._coarse[source_name] = frozenset() if table is None else table.coarse()
        return found

    def __contains__(self, source_name: str) -> bool:
        return source_name in self._raw

    def get(self, source_name: str) -> SourceScopes | None:
        if source_name in self._decoded:
            return self._decoded[source_name]
        raw = self._raw.get(source_name)
        table = None
        if raw is not None:
            try:
                table = _table.decode(raw)
            except msgspec.DecodeError:
                table = None
            if table is not None and not _consistent(table):
                table = None
        self._decoded[source_name] = table
        return table


def _consistent(table: SourceScopes) -> bool:
    """Stored bytes are not trusted to be ours: a table whose lists disagree, or whose
    parents do not point backwards, is treated as absent (lookups could loop on it)."""
    n = len(table.starts)
    if not (len(table.ends) == len(table.parents) == len(table.names) == n):
        return False
    if any(len(column) not in (0, n)
           for column in (table.keys, table.asyncs, table.bodies, table.leads, table.tails)):
        return False
    return all(-1 <= p < i for i, p in enumerate(table.parents))
