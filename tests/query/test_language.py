"""The search language: parser, errors, SQL shape, and real DuckDB execution."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import duckdb
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.errors import ApiError
from query.language import (
    FIELDS,
    LEVEL_ORDER,
    TEXT_COLUMNS,
    And,
    Attr,
    Field,
    Level,
    Node,
    Not,
    Or,
    QuerySyntaxError,
    Regex,
    Text,
    compile_query,
    parse,
)

COLUMNS = ("message", "level", "url", "release", "session_id", "box", "error_type",
           "error_message", "error_stack", "attrs")


def row(message: str, level: str = "info", **values: str | None) -> dict[str, str | None]:
    return {"message": message, "level": level} | {c: values.get(c) for c in COLUMNS[2:]}


# Hand-written rows: each query below names exactly the rows it must return.
ROWS = [
    row("checkout failed", "error", url="https://shop.test/cart?step=2", release="1.0",
        session_id="s-1", box="b1", error_type="TypeError", error_message="cart is undefined",
        error_stack="at pay (shop.js:1:2)",
        attrs='{"cart": 3, "user-id": "U-7", "a.b": "dotted", "ok": true}'),
    row("checkout ok", url="https://shop.test/cart", release="1.1", session_id="s-1", box="b1",
        attrs='{"cart": 0}'),
    row("50% off_today", "warn", box="b2"),
    row("50x offXtoday", "debug", box="b2", release="1.0"),
    row("path C:\\temp\\new", box="b2", release="2.0-beta"),
    row('he said "hi"', url="https://x.test/*", release="1_0"),
    row("Timeout after 30s\nretrying", "warn", attrs='{"ключ": "Значение", "n": null}'),
    row("ÉCOLE fermée", url="https://x.test/a"),
    row("render", "error", error_type="NetworkError", error_message="fetch timeout",
        session_id="s-2"),
    row("OR and AND words"),
    row("GET /api/cart 200", "debug", url="https://shop.test/api"),
]
ALL = frozenset(r["message"] for r in ROWS)
assert len(ALL) == len(ROWS)

# Rows over a small alphabet for the model-based property: dense in %, _, \, * and case.
DENSE_VALUES = ["ab", "a%b", "A_B", "a\\b", "é*", "AB.ab", "ba", "a*b", "É%", "b", None]


def dense_rows() -> list[dict[str, str | None]]:
    rows = []
    for i, message in enumerate(v for v in DENSE_VALUES if v is not None):
        def pick(k: int, i: int = i) -> str | None:
            return DENSE_VALUES[(i * k + k) % len(DENSE_VALUES)]
        attrs = {"cart": pick(3), "user-id": pick(5), "a.b": pick(7), "ключ": pick(2)}
        rows.append(row(message, LEVEL_ORDER[i % 4], url=pick(1), release=pick(2),
                        session_id=pick(3), box=pick(4), error_type=pick(5),
                        error_message=pick(6),
                        attrs=None if i == 3 else json.dumps({k: v for k, v in attrs.items()
                                                              if v is not None} | {"n": i})))
    return rows


DENSE = dense_rows()


def make_table(con: duckdb.DuckDBPyConnection, name: str,
               rows: list[dict[str, str | None]]) -> None:
    con.execute(f"CREATE TABLE {name} ({', '.join(f'{c} VARCHAR' for c in COLUMNS)})")
    con.executemany(f"INSERT INTO {name} VALUES ({', '.join('?' * len(COLUMNS))})",
                    [[r[c] for c in COLUMNS] for r in rows])


@pytest.fixture(scope="module")
def db() -> Iterator[duckdb.DuckDBPyConnection]:
    con = duckdb.connect()
    make_table(con, "logs", ROWS)
    make_table(con, "dense", DENSE)
    yield con
    con.close()


def run(db: duckdb.DuckDBPyConnection, query: str, table: str = "logs") -> set[str]:
    sql, params = compile_query(query)
    assert_only_fixed_sql(sql, params)
    return {m for (m,) in db.execute(f"SELECT message FROM {table} WHERE {sql}",
                                     params).fetchall()}


# The compiled SQL may hold nothing but these: user text can only be a parameter.
SQL_TOKEN = re.compile(r"\s+|\?|\(|\)|,|=|'\\'|[A-Za-z_]+")
SQL_WORDS = frozenset({
    *COLUMNS, "AND", "OR", "NOT", "ILIKE", "ESCAPE", "IN", "TRUE", "FALSE",
    "lower", "coalesce", "regexp_matches", "json_extract_string"})


def assert_only_fixed_sql(sql: str, params: list[object]) -> None:
    pos = 0
    while pos < len(sql):
        match = SQL_TOKEN.match(sql, pos)
        assert match, f"unexpected SQL at {pos}: {sql[pos:pos + 20]!r}"
        word = match.group()
        assert not word[0].isalpha() or word in SQL_WORDS, word
        pos = match.end()
    assert sql.count("?") == len(params)
    assert all(isinstance(p, str) for p in params)


# --- Parsing: every construct, precedence ----------------------------------------------


def t(value: str, wildcard: bool = False) -> Text:
    return Text(value, wildcard)


@pytest.mark.parametrize(("query", "ast"), [
    ("", None),
    ("  \t\n ", None),
    ("checkout", t("checkout")),
    ("time*out", t("time*out", True)),
    ('"checkout failed"', t("checkout failed")),
    ('"say \\"hi\\" \\\\ C:\\temp"', t('say "hi" \\ C:\\temp')),
    ('"a*b"', t("a*b")),  # a star inside quotes is literal
    ("a-b", t("a-b")),
    ("12:30:01", t("12:30:01")),
    ("-a", Not(t("a"))),
    ("--a", t("a")),
    ("---a", Not(t("a"))),
    ("NOT a", Not(t("a"))),
    ("NOT -a", t("a")),
    ("a b", And((t("a"), t("b")))),
    ("a AND b", And((t("a"), t("b")))),
    ("a OR b", Or((t("a"), t("b")))),
    ("a or b", And((t("a"), t("or"), t("b")))),  # keywords are uppercase only
    ('"OR"', t("OR")),
    ("a b OR c", Or((And((t("a"), t("b"))), t("c")))),
    ("a OR b c", Or((t("a"), And((t("b"), t("c")))))),
    ("a OR b OR c", Or((t("a"), t("b"), t("c")))),
    ("a (b OR c)", And((t("a"), Or((t("b"), t("c")))))),
    ("(a b) c", And((And((t("a"), t("b"))), t("c")))),
    ("-(a OR b) c", And((Not(Or((t("a"), t("b")))), t("c")))),
    ("-a OR b", Or((Not(t("a")), t("b")))),
    ("foo(bar)", And((t("foo"), t("bar")))),
    ('foo"bar"', And((t("foo"), t("bar")))),
    ("((((a))))", t("a")),
    ("level:error", Level(("error",))),
    ("LEVEL:Warning", Level(("warn",))),
    ("level:fatal", Level(("error",))),
    ("level:w*", Level(("warn",))),
    ("level:*", Level(LEVEL_ORDER)),
    ("level:*r*", Level(("warn", "error"))),  # aliases ("trace") do not take part in globs
    ('level:"info"', Level(("info",))),
    ("url:https://x.test/a?b=1", Field("url", "https://x.test/a?b=1", False)),
    ("url:*cart*", Field("url", "*cart*", True)),
    ('url:"*"', Field("url", "*", False)),
    ('url:""', Field("url", "", False)),
    ('release:"1.0 beta"', Field("release", "1.0 beta", False)),
    ("session:s-1", Field("session_id", "s-1", False)),
    ("sessionId:s-1", Field("session_id", "s-1", False)),
    ("box:b1", Field("box", "b1", False)),
    ("boxId:b1", Field("box", "b1", False)),
    ("type:TypeError", Field("error_type", "TypeError", False)),
    ("-release:1.0", Not(Field("release", "1.0", False))),
    ("attr.user-id:U-7", Attr("user-id", "U-7", False)),
    ("attr.a.b:x*", Attr("a.b", "x*", True)),
    ("ATTR.Cart:3", Attr("Cart", "3", False)),
    ("attr.ключ:значение", Attr("ключ", "значение", False)),
    ("/a+b/", Regex("a+b")),
    ("/\\/api\\/\\d+/", Regex("/api/\\d+")),
    ("(/x/)", Regex("x")),
    ("-/x/", Not(Regex("x"))),
    ("level:error OR -(type:*Error url:x) /y/",
     Or((Level(("error",)), And((Not(And((Field("error_type", "*Error", True),
                                          Field("url", "x", False)))), Regex("y")))))),
])
def test_parse(query: str, ast: Node | None) -> None:
    assert parse(query) == ast


def test_empty_query_matches_everything() -> None:
    assert compile_query("") == ("TRUE", [])
    assert compile_query("   ") == ("TRUE", [])


def test_negation_parity_keeps_sql_shallow() -> None:
    sql, _ = compile_query("-" * 1999 + "a")
    assert sql.count("NOT") == 1
    assert compile_query("-" * 1998 + "a")[0].count("NOT") == 0


# --- Errors: each one a 400 pointing at its position -----------------------------------

DEEP = "(" * 33 + "a" + ")" * 33


@pytest.mark.parametrize(("query", "position", "reason"), [
    ("a )", 2, "unexpected ')'"),
    (")", 0, "unexpected ')'"),
    ("(a", 0, "unclosed '('"),
    ("(a (b)", 0, "unclosed '('"),
    ("a ( ", 2, "unclosed '('"),
    ("a ()", 2, "empty parentheses"),
    ("OR a", 0, "unexpected 'OR'"),
    ("a (AND b)", 3, "unexpected 'AND'"),
    ("a OR", 4, "expected a term after 'OR', found the end of the query"),
    ("a OR OR b", 5, "expected a term after 'OR', found 'OR'"),
    ("(a OR) b", 5, "expected a term after 'OR', found ')'"),
    ("a AND", 5, "expected a term after 'AND', found the end of the query"),
    ("NOT", 3, "expected a term after 'NOT', found the end of the query"),
    ("a NOT )", 6, "expected a term after 'NOT', found ')'"),
    ("-OR a", 1, "expected a term after '-', found 'OR'"),
    ("-", 0, "'-' with nothing to negate"),
    ("a - b", 2, "'-' with nothing to negate"),
    ("(a -)", 3, "'-' with nothing to negate"),
    ('say "hi', 4, "unterminated phrase"),
    ('"a\\"', 0, "unterminated phrase"),
    ('url:"x', 4, "unterminated phrase"),
    ("/ab", 0, "unterminated regex"),
    ("x /a\\/", 2, "unterminated regex"),
    ("//", 0, "empty regex"),
    ("/(/", 0, "invalid regex"),
    ("x /a(?<n>b)/", 2, "invalid regex"),  # RE2 has no named groups of this form
    ("/(?=a)/", 0, "invalid regex"),  # nor lookahead
    ("/a{1000}{1000}/", 0, "invalid regex"),
    ("/api/cart", 5, "unexpected text right after a regex"),
    ("/a/i", 3, "unexpected text right after a regex"),
    ("levl:error", 0, "unknown field 'levl'"),
    ("a TypeError: x", 2, "unknown field 'TypeError'"),
    ("http://x.test", 0, "unknown field 'http'"),
    ("attr:x", 0, "unknown field 'attr'"),
    ("url:", 4, "missing value after 'url:'"),
    ("a level: b", 8, "missing value after 'level:'"),
    ("level:(error)", 6, "missing value after 'level:'"),
    ("level:loud", 6, "unknown level 'loud'"),
    ('level:"err*"', 6, "unknown level 'err*'"),
    ("level:x*", 6, "unknown level 'x*'"),
    ('level:""', 6, "unknown level ''"),
    ("attr.:x", 5, "missing attribute name"),
    ("a" * 2001, 2000, "query longer than 2000 characters"),
    ("a \ud800", 2, "invalid character U+D800"),
    (DEEP, 32, "parentheses nested deeper than 32"),
    ("(" * 2000, 32, "parentheses nested deeper than 32"),
    (" ".join(["a"] * 101), 200, "more than 100 terms"),
    ("(" * 5 + ")" + "a", 4, "empty parentheses"),  # the leftmost problem is reported
    (') "open', 0, "unexpected ')'"),
])
def test_syntax_errors(query: str, position: int, reason: str) -> None:
    with pytest.raises(QuerySyntaxError) as info:
        compile_query(query)
    err = info.value
    assert err.position == position
    first, _, caret = err.message.split("\n")
    assert first.startswith(f"{reason} at position {position}")
    assert caret.endswith("^")
    assert err.detail == {"position": position,
                          "query": query[:2000].replace("\ud800", "?")}
    msgspec.json.encode(err.envelope())


def test_limits_are_inclusive() -> None:
    assert compile_query("a" * 2000)
    assert compile_query("(" * 32 + "a" + ")" * 32)
    assert compile_query(" ".join(["a"] * 100))


def test_error_is_the_api_error_shape() -> None:
    with pytest.raises(QuerySyntaxError) as info:
        compile_query("checkout )")
    err = info.value
    assert isinstance(err, ApiError)
    assert (err.status_code, err.code) == (400, "invalid_query")
    body = msgspec.json.decode(msgspec.json.encode(err.envelope()))
    assert body["error"]["code"] == "invalid_query"
    assert body["error"]["message"].startswith("unexpected ')' at position 9")
    assert body["error"]["detail"] == {"position": 9, "query": "checkout )"}


def test_error_message_points_at_the_position() -> None:
    with pytest.raises(QuerySyntaxError) as info:
        compile_query("level:error url:x )")
    assert info.value.message.split("\n")[1:] == ["  level:error url:x )",
                                                  "                    ^"]
    with pytest.raises(QuerySyntaxError) as info:
        compile_query("x" * 100 + " )")
    _, snippet, caret = info.value.message.split("\n")
    assert snippet.startswith("  ...") and len(snippet) < 70
    assert snippet[caret.index("^")] == ")"


def test_unknown_field_hint_says_how_to_search_the_text() -> None:
    with pytest.raises(QuerySyntaxError, match='quote it: "TypeError:x"'):
        compile_query("TypeError:x")


# --- SQL shape: escaping, parameters ---------------------------------------------------


def test_like_escapes_only_when_needed() -> None:
    sql, params = compile_query("abc")
    assert sql == "(message ILIKE ? OR error_type ILIKE ? OR error_message ILIKE ?)"
    assert params == ["%abc%"] * 3
    sql, params = compile_query("50%_off\\x*")
    assert sql.count("ESCAPE '\\'") == 3
    assert params == ["%50\\%\\_off\\\\x%%"] * 3
    # Without ESCAPE a backslash is an ordinary character in DuckDB's LIKE.
    assert compile_query("C\\temp") == (
        "(message ILIKE ? OR error_type ILIKE ? OR error_message ILIKE ?)", ["%C\\temp%"] * 3)


def test_fields_compile_to_fixed_sql() -> None:
    assert compile_query("release:1.0") == ("lower(release) = lower(?)", ["1.0"])
    assert compile_query("url:*cart*") == ("url ILIKE ?", ["%cart%"])
    assert compile_query("box:b_*") == ("box ILIKE ? ESCAPE '\\'", ["b\\_%"])
    assert compile_query("level:error") == ("level = ?", ["error"])
    assert compile_query("level:*") == ("level IN (?, ?, ?, ?)", list(LEVEL_ORDER))
    assert compile_query("attr.a.b:X") == (
        "lower(json_extract_string(attrs, ?)) = lower(?)", ['$."a.b"', "X"])
    assert compile_query("/a'b/") == ("regexp_matches(message, ?)", ["a'b"])
    assert compile_query("-url:x") == ("NOT coalesce(lower(url) = lower(?), FALSE)", ["x"])


def test_injection_attempts_stay_parameters(db: duckdb.DuckDBPyConnection) -> None:
    for query in ["'; DROP TABLE logs; --x", "url:'OR'1'='1", '"\\" OR 1=1 --"',
                  'attr.x:"\') OR TRUE --"', "/' OR TRUE --/"]:
        sql, params = compile_query(query)
        assert_only_fixed_sql(sql, params)
        assert run(db, query) == set()
    assert len(db.execute("SELECT * FROM logs").fetchall()) == len(ROWS)


# --- Execution against DuckDB: exact rows ----------------------------------------------

FAILED, OK, PCT, PCTX, PATH, SAID, TIMEOUT, ECOLE, RENDER, WORDS, GET = (
    r["message"] for r in ROWS)


@pytest.mark.parametrize(("query", "expected"), [
    ("", ALL),
    ("*", ALL),
    ("checkout", {FAILED, OK}),
    ("CHECKOUT Failed", {FAILED}),
    ('"checkout failed"', {FAILED}),
    ('"failed checkout"', set()),
    ("undefined", {FAILED}),  # error_message
    ("typeerror", {FAILED}),  # error_type
    ("pay", set()),  # the stack is not searched
    ("timeout", {TIMEOUT, RENDER}),
    ("-timeout", ALL - {TIMEOUT, RENDER}),  # null error columns do not drop rows
    ("checkout -failed", {OK}),
    ("checkout OR render", {FAILED, OK, RENDER}),
    ("checkout ok OR render", {OK, RENDER}),
    ("checkout (ok OR render)", {OK}),
    ("-(checkout OR render)", ALL - {FAILED, OK, RENDER}),
    ("NOT checkout", ALL - {FAILED, OK}),
    ("checkout AND ok", {OK}),
    ('"OR"', {WORDS, FAILED, RENDER}),  # TypeError, NetworkError contain "or"
    ("50%", {PCT}),
    ("off_today", {PCT}),
    ("50*today", {PCT, PCTX}),
    ("%", {PCT}),
    ("_", {PCT}),
    ('"C:\\temp"', {PATH}),
    ("\\temp\\new", {PATH}),
    ("\\", {PATH}),
    ('"he said \\"hi\\""', {SAID}),
    ('said "\\"hi\\""', {SAID}),
    ("after*retrying", {TIMEOUT}),  # * crosses a newline
    ('"30s\nretrying"', {TIMEOUT}),
    ("école", {ECOLE}),
    ("FERMÉE", {ECOLE}),
    ('"/api/cart"', {GET}),
    ("/^Timeout/", {TIMEOUT}),
    ("/timeout/", set()),  # regexes are case-sensitive and on the message only
    ("/(?i)timeout/", {TIMEOUT}),
    ("/after.*retrying/", set()),  # RE2: . does not match a newline...
    ("/(?s)after.*retrying/", {TIMEOUT}),  # ...unless (?s)
    ("/\\/api\\/cart \\d+/", {GET}),
    ("/^[0-9]+[%x]/", {PCT, PCTX}),
    ("-/e/", {PCT, PCTX, WORDS, GET}),
    ("level:error", {FAILED, RENDER}),
    ("level:ERROR", {FAILED, RENDER}),
    ("level:warning", {PCT, TIMEOUT}),
    ("level:w*", {PCT, TIMEOUT}),
    ("level:*", ALL),
    ("-level:info", {FAILED, PCT, PCTX, TIMEOUT, RENDER, GET}),
    ("level:error OR level:debug", {FAILED, RENDER, PCTX, GET}),
    ("url:https://shop.test/cart", {OK}),
    ("url:HTTPS://SHOP.TEST/CART", {OK}),
    ("url:https://shop.test/cart*", {FAILED, OK}),
    ("url:*SHOP*", {FAILED, OK, GET}),
    ("url:*", {FAILED, OK, SAID, ECOLE, GET}),
    ("-url:*", {PCT, PCTX, PATH, TIMEOUT, RENDER, WORDS}),
    ('url:"https://x.test/*"', {SAID}),  # quoted: the star is literal
    ("url:https://x.test/*", {SAID, ECOLE}),
    ("release:1.0", {FAILED, PCTX}),
    ("-release:1.0", ALL - {FAILED, PCTX}),  # rows without a release are kept
    ("release:1.*", {FAILED, OK, PCTX}),
    ("release:1_0", {SAID}),  # _ is not a LIKE wildcard...
    ("release:1_*", {SAID}),  # ...not even in a wildcard match
    ("release:1%", set()),
    ("release:2.0-BETA", {PATH}),
    ('release:""', set()),
    ("session:s-1", {FAILED, OK}),
    ("sessionId:S-1", {FAILED, OK}),
    ("box:b2", {PCT, PCTX, PATH}),
    ("boxId:B*", {FAILED, OK, PCT, PCTX, PATH}),
    ("type:typeerror", {FAILED}),
    ("type:*Error", {FAILED, RENDER}),
    ("-type:*", ALL - {FAILED, RENDER}),
    ("attr.cart:3", {FAILED}),
    ("attr.cart:0", {OK}),
    ("attr.cart:*", {FAILED, OK}),
    ("-attr.cart:*", ALL - {FAILED, OK}),
    ("attr.user-id:u-7", {FAILED}),
    ("attr.a.b:dotted", {FAILED}),
    ("attr.ok:TRUE", {FAILED}),
    ("attr.ключ:значение", {TIMEOUT}),  # case-insensitive beyond ASCII
    ("attr.n:*", set()),  # a JSON null is no value
    ("attr.CART:3", set()),  # attribute names are case-sensitive
    ("box:b2 -release:* OR level:error /fail/", {PCT, FAILED}),
    ("(box:b1 OR box:b2) level:info", {OK, PATH}),
    ("-(-checkout)", {FAILED, OK}),
])
def test_execution(db: duckdb.DuckDBPyConnection, query: str, expected: set[str]) -> None:
    assert run(db, query) == set(expected)


# --- Properties --------------------------------------------------------------------------

FRAGMENTS = ['"', "\\", "/", "(", ")", ":", "-", "*", " ", "OR", "AND", "NOT", "level:",
             "url:", "attr.x:", "type:", "release:", "%", "_", "'", "é", "\x00", "\n",
             "\ud800", "(?", "{9}", "[", "\\/", '\\"']
noise = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=3)),
                 max_size=30).map("".join)


@settings(max_examples=500, deadline=None)
@given(noise)
def test_random_text_raises_only_query_syntax_error(text: str) -> None:
    try:
        compile_query(text)
    except QuerySyntaxError as err:
        assert 0 <= err.position <= len(text)
        body = msgspec.json.decode(msgspec.json.encode(err.envelope()))  # renders as JSON
        assert len(body["error"]["detail"]["query"]) == len(text)


@settings(max_examples=300, deadline=None)
@given(noise)
def test_whatever_compiles_runs_and_holds_no_user_text(
        db: duckdb.DuckDBPyConnection, text: str) -> None:
    try:
        sql, params = compile_query(text)
    except QuerySyntaxError:
        return
    assert_only_fixed_sql(sql, params)
    db.execute(f"SELECT count(*) FROM logs WHERE {sql}", params).fetchall()


# A model of the language: random ASTs, rendered to text, must parse back to themselves
# and select in DuckDB exactly the rows a plain-Python evaluation selects.

ALPHABET = "abAB%_\\*.é"
REGEXES = ["a", "^a", "b$", "a.b", "[ab]+", "(?i)é", "a|B", "%", "\\\\", "\\*", "a/b"]
bare = st.text(ALPHABET, min_size=1, max_size=4)
quotable = st.text(ALPHABET + ' "-/():', max_size=5)


def quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


Case = tuple[Node, str]
leaves: st.SearchStrategy[Case] = st.one_of(
    bare.map(lambda v: (Text(v, "*" in v), v)),
    quotable.map(lambda v: (Text(v, False), quote(v))),
    st.tuples(st.sampled_from(["url", "release", "session", "box", "type"]), bare).map(
        lambda f: (Field(FIELDS[f[0]], f[1], "*" in f[1]), f"{f[0]}:{f[1]}")),
    st.tuples(st.sampled_from(["url", "release", "box"]), quotable).map(
        lambda f: (Field(FIELDS[f[0]], f[1], False), f"{f[0]}:{quote(f[1])}")),
    st.tuples(st.sampled_from(["cart", "user-id", "a.b", "ключ", "n"]), bare).map(
        lambda a: (Attr(a[0], a[1], "*" in a[1]), f"attr.{a[0]}:{a[1]}")),
    st.sampled_from(LEVEL_ORDER).map(lambda level: (Level((level,)), f"level:{level}")),
    st.sampled_from(REGEXES).map(lambda r: (Regex(r), "/" + r.replace("/", "\\/") + "/")),
)


def grouped(case: Case) -> str:
    return f"({case[1]})" if isinstance(case[0], And | Or) else case[1]


def compound(children: st.SearchStrategy[Case]) -> st.SearchStrategy[Case]:
    several = st.lists(children, min_size=2, max_size=4)
    return st.one_of(
        children.filter(lambda c: not isinstance(c[0], Not)).map(
            lambda c: (Not(c[0]), "-" + grouped(c))),
        several.map(lambda cs: (And(tuple(c[0] for c in cs)), " ".join(map(grouped, cs)))),
        several.map(lambda cs: (Or(tuple(c[0] for c in cs)), " OR ".join(map(grouped, cs)))),
    )


cases = st.recursive(leaves, compound, max_leaves=12)


def matches(value: str | None, pattern: str, wildcard: bool, substring: bool) -> bool:
    if value is None:
        return False
    parts = pattern.lower().split("*") if wildcard else [pattern.lower()]
    regex = re.compile(".*".join(map(re.escape, parts)), re.S)
    found = regex.search(value.lower()) if substring else regex.fullmatch(value.lower())
    return found is not None


def attr_value(attrs: str | None, name: str) -> str | None:
    value = json.loads(attrs).get(name) if attrs else None
    return None if value is None else str(value)


def evaluate(node: Node, r: dict[str, str | None]) -> bool:
    match node:
        case Text(value, wildcard):
            return any(matches(r[c], value, wildcard, True) for c in TEXT_COLUMNS)
        case Field(column, value, wildcard):
            return matches(r[column], value, wildcard, False)
        case Attr(name, value, wildcard):
            return matches(attr_value(r["attrs"], name), value, wildcard, False)
        case Level(levels):
            return r["level"] in levels
        case Regex(pattern):
            return re.search(pattern, r["message"] or "") is not None
        case Not(term):
            return not evaluate(term, r)
        case And(terms):
            return all(evaluate(term, r) for term in terms)
        case Or(terms):
            return any(evaluate(term, r) for term in terms)


@settings(max_examples=400, deadline=None)
@given(cases)
def test_model(db: duckdb.DuckDBPyConnection, case: Case) -> None:
    node, text = case
    assert parse(text) == node
    expected = {r["message"] for r in DENSE if evaluate(node, r)}
    assert run(db, text, "dense") == expected


def test_the_documented_examples_compile() -> None:
    section = (Path(__file__).resolve().parents[2] / "docs" / "search.md").read_text()
    examples = [query for line in section.splitlines() if line.startswith("| `")
                for query in re.findall(r"`([^`]+)`", line.split(" | ")[0])]
    assert len(examples) >= 12
    for query in examples:
        assert_only_fixed_sql(*compile_query(query))
    payment_not_retry = And((t("payment"), Not(t("retry"))))
    assert parse("checkout OR payment -retry") == Or((t("checkout"), payment_not_retry))
