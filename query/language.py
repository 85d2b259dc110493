"""The search language of ``query``: text -> tokens -> AST -> parameterized DuckDB SQL.

Grammar (EBNF; terms are separated by whitespace, keywords are uppercase)::

    query   = [ or ] ;
    or      = and { "OR" and } ;
    and     = unary { [ "AND" ] unary } ;          (* binds tighter than OR *)
    unary   = { "-" | "NOT" } primary ;            (* "-" touches its term *)
    primary = "(" or ")" | field | phrase | regex | word ;
    field   = NAME ":" ( bare | phrase ) ;         (* NAME: level url release session
                                                      box type attr.KEY, any case *)
    phrase  = '"' { char | '\\"' | '\\\\' } '"' ;
    regex   = "/" { char | "\\/" } "/" ;           (* RE2, on message *)
    word    = bare ;                               (* not OR, AND or NOT *)
    bare    = { char - ( space | "(" | ")" | '"' ) } ;

The SQL holds only fixed column names, operators and ``?``: all user text travels as
a parameter. A row the query does not match may evaluate to NULL rather than FALSE,
which ``WHERE`` treats alike.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from typing import Literal

import duckdb

from core.errors import ApiError

MAX_LENGTH = 2000
MAX_DEPTH = 32
MAX_TERMS = 100

LEVEL_ORDER = ("debug", "info", "warn", "error")
# The names ingest accepts for each level (ingest/events.py): a search for
# level:warning should find what was sent as "warning" and stored as "warn".
LEVELS = {"debug": "debug", "info": "info", "warn": "warn", "error": "error",
          "warning": "warn", "log": "info", "trace": "debug", "fatal": "error",
          "critical": "error"}
FIELDS = {"url": "url", "release": "release", "session": "session_id",
          "sessionid": "session_id", "box": "box", "boxid": "box", "type": "error_type"}
TEXT_COLUMNS = ("message", "error_type", "error_message")

Kind = Literal["(", ")", "-", "OR", "AND", "NOT", "word", "phrase", "regex", "field"]

_FIELD_HELP = "fields are level, url, release, session, box, type and attr.NAME"
# A bare token is a field term when it starts like a name and has a colon: so
# "12:30:01" stays a word, and a typo such as "levl:error" is an error rather
# than a silent search for that text.
_FIELD_NAME = re.compile(r"[^\W\d][\w.\-]*(?=:)")
_KEYWORDS: dict[str, Kind] = {"OR": "OR", "AND": "AND", "NOT": "NOT"}
_BARE_STOP = frozenset('()"')
_QUOTE_PATH = 'to search for a path, quote it: "/api/cart"'


class QuerySyntaxError(ApiError):
    """The ``query`` parameter does not parse; ``detail.position`` points at the problem."""

    status_code = 400
    code = "invalid_query"

    def __init__(self, reason: str, position: int, text: str, hint: str = "") -> None:
        first = f"{reason} at position {position}" + (f": {hint}" if hint else "")
        # An over-long query is not echoed whole, and a lone surrogate (one "?" in the
        # echo, so positions hold) would make the JSON encoder fail on the way out.
        echo = text[:MAX_LENGTH].encode(errors="replace").decode()
        super().__init__(f"{first}\n{_pointer(echo, position)}",
                         detail={"position": position, "query": echo})
        self.position = position


def _pointer(text: str, position: int) -> str:
    """The text around ``position`` and a caret under it, on one line each."""
    start = max(0, position - 30)
    shown = "".join(" " if c.isspace() else c for c in text[start:position + 30])
    lead = "  ..." if start else "  "
    return f"{lead}{shown}\n{' ' * (len(lead) + position - start)}^"


# --- AST ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Text:
    """A word or phrase: a case-insensitive substring of the message or error text."""

    value: str
    wildcard: bool


@dataclass(frozen=True, slots=True)
class Field:
    column: str  # a value of FIELDS, never user text
    value: str
    wildcard: bool


@dataclass(frozen=True, slots=True)
class Attr:
    name: str
    value: str
    wildcard: bool


@dataclass(frozen=True, slots=True)
class Level:
    levels: tuple[str, ...]  # canonical, in LEVEL_ORDER


@dataclass(frozen=True, slots=True)
class Regex:
    pattern: str


@dataclass(frozen=True, slots=True)
class Not:
    term: Node


@dataclass(frozen=True, slots=True)
class And:
    terms: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Or:
    terms: tuple[Node, ...]


Node = Text | Field | Attr | Level | Regex | Not | And | Or


# --- Tokens ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Token:
    kind: Kind
    pos: int
    text: str = ""  # word, phrase, regex or field value, unescaped
    name: str = ""  # field name as written
    value_pos: int = 0
    quoted: bool = False


def tokenize(text: str) -> Iterator[Token]:
    """Tokens one at a time, so the parser reports the leftmost error first."""
    i, n = 0, len(text)
    while True:
        while i < n and text[i].isspace():
            i += 1
        if i >= n:
            return
        c = text[i]
        if c == "(" or c == ")":
            yield Token("(" if c == "(" else ")", i)
            i += 1
        elif c == "-":
            if i + 1 >= n or text[i + 1].isspace() or text[i + 1] == ")":
                raise QuerySyntaxError("'-' with nothing to negate", i, text,
                                       'put it right before a term (-word, -level:debug, '
                                       '-(a OR b)), or quote it: "-"')
            yield Token("-", i)
            i += 1
        elif c == '"':
            value, end = _phrase(text, i)
            yield Token("phrase", i, value)
            i = end
        elif c == "/":
            value, end = _regex(text, i)
            yield Token("regex", i, value)
            i = end
        else:
            j = i
            while j < n and not text[j].isspace() and text[j] not in _BARE_STOP:
                j += 1
            run = text[i:j]
            if run in _KEYWORDS:
                yield Token(_KEYWORDS[run], i)
            elif match := _FIELD_NAME.match(run):
                name = match.group()
                value_pos = i + len(name) + 1
                if value_pos == j and j < n and text[j] == '"':
                    value, j = _phrase(text, j)
                    yield Token("field", i, value, name, value_pos, quoted=True)
                else:
                    yield Token("field", i, text[value_pos:j], name, value_pos)
            else:
                yield Token("word", i, run)
            i = j


def _phrase(text: str, start: int) -> tuple[str, int]:
    """The unescaped phrase opened at ``start`` and the index after its closing quote."""
    out: list[str] = []
    i, n = start + 1, len(text)
    while i < n:
        c = text[i]
        if c == "\\" and i + 1 < n and text[i + 1] in '"\\':
            out.append(text[i + 1])
            i += 2
        elif c == '"':
            return "".join(out), i + 1
        else:
            out.append(c)  # any other backslash is literal: "C:\temp" needs no doubling
            i += 1
    raise QuerySyntaxError("unterminated phrase", start, text,
                           'the \'"\' opened here is never closed (write \\" for a quote inside)')


def _regex(text: str, start: int) -> tuple[str, int]:
    out: list[str] = []
    i, n = start + 1, len(text)
    while i < n and text[i] != "/":
        if text[i] == "\\" and i + 1 < n:
            # "\/" is a slash; every other escape is RE2's and passes through whole.
            out.append("/" if text[i + 1] == "/" else text[i:i + 2])
            i += 2
        else:
            out.append(text[i])
            i += 1
    if i >= n:
        raise QuerySyntaxError("unterminated regex", start, text,
                               f"the '/' opened here is never closed; {_QUOTE_PATH}")
    end = i + 1
    # "/api/cart" would otherwise be the regex "api" and the word "cart", and "/x/i"
    # a regex and a word "i": both are more likely a path or a flag than intended.
    if end < n and not text[end].isspace() and text[end] != ")":
        raise QuerySyntaxError("unexpected text right after a regex", end, text,
                               "a regex ends with '/' and a space; for flags write (?i) "
                               f"inside it; {_QUOTE_PATH}")
    return "".join(out), end


# --- Parser ------------------------------------------------------------------------------


def parse(text: str) -> Node | None:
    """The query's AST, or None for an empty query (everything matches)."""
    if len(text) > MAX_LENGTH:
        raise QuerySyntaxError(f"query longer than {MAX_LENGTH} characters", MAX_LENGTH, text)
    try:
        text.encode()
    except UnicodeEncodeError as exc:  # lone surrogates cannot become a UTF-8 parameter
        raise QuerySyntaxError(f"invalid character U+{ord(text[exc.start]):04X}",
                               exc.start, text) from None
    return _Parser(text).parse()


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = tokenize(text)
        self.tok: Token | None = next(self.tokens, None)
        self.terms = 0
        self.depth = 0

    def advance(self) -> Token:
        tok = self.tok
        assert tok is not None
        self.tok = next(self.tokens, None)
        return tok

    def error(self, reason: str, pos: int, hint: str = "") -> QuerySyntaxError:
        return QuerySyntaxError(reason, pos, self.text, hint)

    def parse(self) -> Node | None:
        if self.tok is None:
            return None
        node = self.or_()
        if self.tok is not None:  # only a ")" stops or_ before the end
            raise self.error("unexpected ')'", self.tok.pos, "it closes no '('")
        return node

    def or_(self) -> Node:
        terms = [self.and_()]
        while self.tok is not None and self.tok.kind == "OR":
            self.expect_term_after(self.advance())
            terms.append(self.and_())
        return terms[0] if len(terms) == 1 else Or(tuple(terms))

    def and_(self) -> Node:
        terms = [self.unary()]
        while self.tok is not None and self.tok.kind not in ("OR", ")"):
            if self.tok.kind == "AND":
                self.expect_term_after(self.advance())
            terms.append(self.unary())
        return terms[0] if len(terms) == 1 else And(tuple(terms))

    def unary(self) -> Node:
        negate = False
        while self.tok is not None and self.tok.kind in ("-", "NOT"):
            # Only the parity counts, so "-----a" compiles to one NOT, not a deep tree.
            negate = not negate
            self.expect_term_after(self.advance())
        node = self.primary()
        return Not(node) if negate else node

    def expect_term_after(self, op: Token) -> None:
        tok = self.tok
        if tok is None or tok.kind in (")", "OR", "AND"):
            found = "the end of the query" if tok is None else f"'{tok.kind}'"
            raise self.error(f"expected a term after '{op.kind}', found {found}",
                             len(self.text) if tok is None else tok.pos)

    def primary(self) -> Node:
        # Each token is judged before the next one is read: the leftmost error wins.
        tok = self.tok
        assert tok is not None  # the callers have seen one
        if tok.kind == ")":
            raise self.error("unexpected ')'", tok.pos, "it closes no '('")
        if tok.kind in ("OR", "AND"):
            raise self.error(f"unexpected '{tok.kind}'", tok.pos,
                             f"{tok.kind} needs a term on each side; to search for the "
                             f'word, quote it: "{tok.kind}"')
        if tok.kind == "(":
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise self.error(f"parentheses nested deeper than {MAX_DEPTH}", tok.pos)
            self.advance()
            if self.tok is not None and self.tok.kind == ")":
                raise self.error("empty parentheses", tok.pos)
            node = self.or_() if self.tok is not None else None
            if node is None or self.tok is None:
                raise self.error("unclosed '('", tok.pos, "add the missing ')'")
            self.depth -= 1
        else:
            self.terms += 1
            if self.terms > MAX_TERMS:
                raise self.error(f"more than {MAX_TERMS} terms", tok.pos)
            node = self.leaf(tok)
        self.advance()
        return node

    def leaf(self, tok: Token) -> Node:
        if tok.kind == "word":
            return Text(tok.text, "*" in tok.text)
        if tok.kind == "phrase":
            return Text(tok.text, False)
        if tok.kind == "regex":
            return self.regex(tok)
        return self.field(tok)

    def regex(self, tok: Token) -> Regex:
        if not tok.text:
            raise self.error("empty regex", tok.pos, 'to search for "//", quote it')
        try:
            # DuckDB's own RE2 judges it, with the options the query will run with.
            with _regex_checker().cursor() as cur:
                cur.execute("SELECT regexp_matches('', ?)", [tok.text])
        except duckdb.Error as exc:
            reason = str(exc).removeprefix("Invalid Input Error: ")
            raise self.error("invalid regex", tok.pos, reason) from None
        return Regex(tok.text)

    def field(self, tok: Token) -> Level | Attr | Field:
        name = tok.name.lower()
        if name != "level" and not name.startswith("attr.") and name not in FIELDS:
            raise self.error(f"unknown field '{tok.name}'", tok.pos,
                             f'{_FIELD_HELP}; to search for the text, quote it: '
                             f'"{tok.name}:{tok.text}"')
        if not tok.text and not tok.quoted:
            raise self.error(f"missing value after '{tok.name}:'", tok.value_pos,
                             f'write {tok.name}:value or {tok.name}:"a value"; for several '
                             f"values, ({tok.name}:a OR {tok.name}:b)")
        # Quotes take a value literally, as in Datadog: url:"*" is a real star.
        wildcard = "*" in tok.text and not tok.quoted
        if name == "level":
            return Level(self.levels(tok, wildcard))
        if name.startswith("attr."):
            if name == "attr.":
                raise self.error("missing attribute name", tok.pos + 5, "write attr.NAME:value")
            return Attr(tok.name[5:], tok.text, wildcard)
        return Field(FIELDS[name], tok.text, wildcard)

    def levels(self, tok: Token, wildcard: bool) -> tuple[str, ...]:
        value = tok.text.lower()
        if wildcard:
            # Against the four stored names only: an alias would let level:*r* reach
            # debug through "trace".
            glob = re.compile(".*".join(map(re.escape, value.split("*"))))
            found = tuple(level for level in LEVEL_ORDER if glob.fullmatch(level))
        else:
            found = (LEVELS[value],) if value in LEVELS else ()
        if not found:
            raise self.error(f"unknown level '{tok.text}'", tok.value_pos,
                             "levels are debug, info, warn and error")
        return found


@cache
def _regex_checker() -> duckdb.DuckDBPyConnection:
    # One in-memory database; each check takes its own cursor, so threads may share it.
    return duckdb.connect(config={"autoinstall_known_extensions": False,
                                  "autoload_known_extensions": False})


# --- SQL ---------------------------------------------------------------------------------


def compile_query(text: str) -> tuple[str, list[object]]:
    """A DuckDB boolean expression over a log row and its parameters."""
    node = parse(text)
    if node is None:
        return "TRUE", []
    params: list[object] = []
    return to_sql(node, params), params


def to_sql(node: Node, params: list[object]) -> str:
    match node:
        case Text(value, wildcard):
            return "(" + " OR ".join(_like(column, value, wildcard, True, params)
                                     for column in TEXT_COLUMNS) + ")"
        case Field(column, value, wildcard):
            return _equals(column, value, wildcard, params)
        case Attr(name, value, wildcard):
            # NAME holds no quote or backslash (see _FIELD_NAME), so the quoted JSON
            # path cannot be broken out of; it is a parameter all the same.
            params.append(f'$."{name}"')
            return _equals("json_extract_string(attrs, ?)", value, wildcard, params)
        case Level(levels):
            params.extend(levels)
            # A bare comparison on the column keeps Parquet min/max pruning possible.
            return "level = ?" if len(levels) == 1 else f"level IN ({', '.join('?' * len(levels))})"
        case Regex(pattern):
            params.append(pattern)
            return "regexp_matches(message, ?)"
        case Not(term):
            # NOT NULL is NULL: without coalesce, -release:1.0 would drop rows with no release.
            return f"NOT coalesce({to_sql(term, params)}, FALSE)"
        case And(terms):
            return "(" + " AND ".join(to_sql(term, params) for term in terms) + ")"
        case Or(terms):
            return "(" + " OR ".join(to_sql(term, params) for term in terms) + ")"


def _equals(target: str, value: str, wildcard: bool, params: list[object]) -> str:
    if wildcard:
        return _like(target, value, True, False, params)
    params.append(value)
    return f"lower({target}) = lower(?)"  # DuckDB folds both sides: its lower, not Python's


def _like(target: str, value: str, wildcard: bool, substring: bool,
          params: list[object]) -> str:
    # ESCAPE only when the text holds % or _: DuckDB runs ILIKE without ESCAPE 2-3x
    # faster (measured on 2 M rows), and without an escape character a backslash is
    # an ordinary character.
    special = "%" in value or "_" in value
    if special:
        value = value.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    if wildcard:
        value = value.replace("*", "%")
    params.append(f"%{value}%" if substring else value)
    return f"{target} ILIKE ? ESCAPE '\\'" if special else f"{target} ILIKE ?"
