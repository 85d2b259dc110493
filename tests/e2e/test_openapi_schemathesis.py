"""The OpenAPI schema (``/schema/openapi.json``) says what the real server answers and
what it accepts.

schemathesis (its CLI, as a CI job would run it) generates requests from the schema,
valid and invalid, sends them to the real server with the dev key and a project that
holds logs, errors and a source map, and runs every check it has: no 5xx, a status the
operation documents, in its documented media type and schema, schema-valid requests
accepted and schema-invalid ones refused, ``Allow`` naming the documented methods. The
refusals it does not reach (no key, another tenant's project, a taken name, ingest's own
refusals) are sent one by one below and checked against the same schema.

A few refusals of schema-valid requests are for what no OpenAPI schema can state; they
are excused one kind at a time by :func:`unstatable`, each after the server's own check
refuses the same value again (see there). Everything else the server checks, the schema
states, from the same constant.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import jsonschema_rs
import pytest
import schemathesis
from hypothesis import given
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from core.errors import ApiError
from ingest.sentry import SentryEndpoint
from metadata.connect import open_database
from query.language import compile_query
from query.routes import EVENT_ID_PATTERN
from query.rows import decode_cursor, parse_event_id
from query.since import TIME_PATTERN, parse_time
from symbolicate.sourcemaps import check_release, normalize_prefix
from tenancy.tenants import PROJECT_NAME_PATTERN, Tenancy, validate_origins
from tests.support.server import Server, create_project

SEED = 20261201
EXAMPLES = 50  # per operation in the fuzzing phase; about 40 s on two cores, all checks
# For the refusals sent one by one: the response checks (the request ones need schemathesis's
# own generated cases).
CHECKS = [not_a_server_error, response_schema_conformance, status_code_conformance,
          content_type_conformance]
REPO = Path(__file__).resolve().parents[2]

APP_JS = b"function f(){throw new Error('x')}\nf();\n"
APP_MAP = json.dumps({"version": 3, "sources": ["src/app.js"], "names": [],
                      "mappings": "AAAA;AACA", "sourcesContent": ["boom()\nagain()\n"]}).encode()
EVENTS = [
    # attrs of every scalar kind: an integer once failed the schema of every row
    {"level": "info", "message": "cart loaded", "attrs": {"items": 3, "total": 9.5,
                                                          "member": True, "coupon": None,
                                                          "currency": "EUR"}},
    {"level": "warn", "message": "slow render", "url": "https://app.test/cart",
     "attrs": {"ms": 1234}},
    {"level": "error", "message": "render failed",
     "error": {"type": "Error", "message": "x",
               "stack": "Error: x\n    at f (https://cdn.test/app.min.js:1:16)\n"
                        "    at https://cdn.test/app.min.js:2:1"}},
]


@dataclass(frozen=True)
class Live:
    server: Server
    project: dict[str, object]
    other_key: str  # a second tenant's API key
    other_project: dict[str, object]


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    yield from _live(tmp_path_factory)


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    """A server of its own for the fuzzer: its calls rename the project, disable and delete
    its ingest keys, as a caller may; the other tests read a state it cannot touch."""
    yield from _live(tmp_path_factory)


def _live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    server = Server(tmp_path_factory.mktemp("openapi") / "data").start()
    try:
        with server.client() as api:
            project = create_project(api, "fuzzed")
            name, key = project["name"], project["ingestKey"]
            r = api.post(f"/v1/projects/{name}/sourcemaps", data={"release": "1.0"},
                         files=[("file", ("app.min.js", APP_JS)),
                                ("file", ("app.min.js.map", APP_MAP))])
            assert r.status_code == 201, r.text
            body = {"context": {"boxId": "b1", "release": "1.0", "sessionId": "s1"},
                    "events": EVENTS}
            r = httpx.post(f"{server.url}/v1/ingest", params={"key": key}, json=body)
            assert r.status_code == 202 and r.json()["rejected"] == [], r.text
        other_key = subprocess.run(
            [sys.executable, "-m", "boxtrail", "keys", "create", "--tenant", "other"],
            env={"BOXTRAIL_DATA_DIR": str(server.data_dir), "PATH": "/usr/bin:/bin"},
            capture_output=True, text=True, check=True, timeout=60).stdout.strip()
        with httpx.Client(base_url=server.url, timeout=10,
                          headers={"Authorization": f"Bearer {other_key}"}) as other:
            other_project = create_project(other, "theirs")
        yield Live(server, project, other_key, other_project)
    finally:
        server.stop()


def _refuses(check: object, *args: object) -> bool:
    try:
        check(*args)  # type: ignore[operator]
    except ApiError:
        return True
    return False


def _error(body: bytes) -> dict[str, object]:
    try:
        error = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        return {}
    return error if isinstance(error, dict) else {}


def unstatable(case: schemathesis.Case, body: bytes) -> str | None:
    """Why the server refused this schema-valid request, when the reason is one no OpenAPI
    schema can state, else None. Each kind is confirmed by the server's own check refusing
    the same value again, so a refusal the schema could state is never excused:

    - ``query``: the search language is a grammar (nesting, operators, fields, regexes
      DuckDB must compile); the schema states its length, docs/search.md its grammar.
    - ``until`` not after ``since``: a relation between two parameters (of a search) or
      two fields (of a deletion); each one's forms are stated (``TIME_PATTERN``), so a
      refused ``until`` that matches them, with a ``since`` that does too, is refused for
      the order alone.
    - ``cursor``: a token only the server makes (its previous page's ``nextCursor``).
    - ``allowedOrigins``: what an origin is (a scheme the server knows, an IDNA host, an
      IPv6 address, a port in range) is past any pattern.
    - ``release``: printable characters (Unicode's categories, not a JSON Schema regex).
    - an upload's content: a chunk named by its SHA-1 (and gzip when sent as such), a file
      that is a source map; schemathesis names a file part by its field.
    - a Sentry envelope: lines of JSON whose lengths and types depend on one another (the
      envelope's grammar), documented as the string it is.
    """
    error = _error(body)
    code, detail = error.get("code"), error.get("detail")
    detail = detail if isinstance(detail, dict) else {}
    query = case.query or {}
    form = case.body if isinstance(case.body, dict) else {}
    if code == "invalid_query" and _refuses(compile_query, query.get("query", "")):
        return "query grammar"
    if code == "invalid_parameter" and detail.get("parameter") == "until" and all(
            re.fullmatch(TIME_PATTERN, str(query.get(name, "1h"))) for name in ("since", "until")):
        return "until not after since"
    if code == "invalid_parameter" and detail.get("field") == "until" and all(
            re.fullmatch(TIME_PATTERN, str(form.get(name))) for name in ("since", "until")):
        return "until not after since"
    if detail.get("parameter") == "cursor" and _refuses(decode_cursor, query.get("cursor", "")):
        return "cursor not made by the server"
    if detail.get("field") == "allowedOrigins" and _refuses(validate_origins,
                                                            form.get("allowedOrigins", [])):
        return "not an origin"
    release = form.get("version", form.get("release"))
    if detail.get("field") == "release" and isinstance(release, str | None) and _refuses(
            check_release, release):
        return "release not printable"
    prefix = form.get("urlPrefix")
    if code == "invalid_upload" and "urlPrefix" in str(error.get("message")) and isinstance(
            prefix, str | None) and _refuses(normalize_prefix, prefix):
        return "urlPrefix"
    message = str(error.get("message"))
    if case.operation.path.endswith("/chunk-upload") and (
            code == "chunk_checksum_mismatch" or (code == "invalid_chunk" and message.startswith(
                ("a chunk's filename must be its SHA-1", "chunk ")))):  # not gzip
        return "chunk content"
    if case.operation.path.endswith("/sourcemaps") and (code == "invalid_sourcemap" or (
            code == "invalid_upload" and any(words in message for words in (
                "the upload has no .map file", "two files would be served at",
                "is in the upload twice", "must be a path relative to the build")))):
        return "upload content"
    envelope = case.body.encode(errors="surrogatepass") if isinstance(case.body, str) else None
    if case.operation.path.endswith(("/envelope", "/envelope/")) and code == "invalid_body" and (
            envelope is not None and _refuses(SentryEndpoint._convert, "envelope", envelope,
                                              1000)):
        return "envelope grammar"
    return None


if os.environ.get("SCHEMATHESIS_HOOKS") == __name__:  # in the schemathesis CLI run below
    @schemathesis.hook
    def filter_failure(context: object, failure: object, case: schemathesis.Case,
                       response: schemathesis.Response) -> bool:
        if type(failure).__name__ != "RejectedPositiveData" or response.status_code != 400:
            return True
        kind = unstatable(case, response.content)
        if kind is not None:
            with open(os.environ["EXCUSED_LOG"], "a") as log:
                log.write(f"{case.method} {case.operation.path}: {kind}\n")
        return kind is None


def test_schemathesis_with_every_check_finds_nothing(fuzzed: Live, tmp_path: Path) -> None:
    live = fuzzed
    with live.server.client() as api:
        for name in ("doomed", "erased"):
            create_project(api, name)
    config = tmp_path / "schemathesis.toml"
    config.write_text(f"""
seed = {SEED}
request-timeout = 10.0
workers = 1

[headers]
Authorization = "Bearer {live.server.api_key}"

[generation]
max-examples = {EXAMPLES}
database = "none"

[cache]
enabled = false
# schemathesis's refusal statuses, and 413: a body over a stated maxItems (ingest's events
# per request) is refused as Payload Too Large, which the check's list does not name.
[checks.negative_data_rejection]
expected-statuses = ["400", "401", "403", "404", "406", "413", "422", "428", "5XX"]

[parameters]
"path.project" = "{live.project['name']}"
"query.key" = "{live.project['ingestKey']}"
"query.sentry_key" = "{live.project['sentryKey']}"

# Deleting the project under test would leave the rest of the run to 404s, and a deletion
# job would erase its rows: these operations get a project of their own (the first
# project deletion deletes it, the later ones find it gone: 404).
[[operations]]
include-path = "/v1/projects/{{project}}"
include-method = "DELETE"
parameters = {{ "path.project" = "doomed" }}

[[operations]]
include-path = "/v1/projects/{{project}}/deletions"
parameters = {{ "path.project" = "erased" }}

# A tail never ends: read it for half a second (or five events), then close it.
[[operations]]
include-path-regex = "/tail$"
request-timeout = 0.5
max-stream-events = 5
""")
    started = time.monotonic()
    run = subprocess.run(
        [str(Path(sys.executable).parent / "schemathesis"), "--no-color",
         "--config-file", str(config), "run", f"{live.server.url}/schema/openapi.json",
         "--checks", "all", "--continue-on-failure",
         "--phases", "examples,coverage,fuzzing", "--output-truncate", "false"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
        env={**os.environ, "SCHEMATHESIS_HOOKS": __name__, "PYTHONPATH": str(REPO),
             "EXCUSED_LOG": str(tmp_path / "excused")})
    elapsed = time.monotonic() - started
    log = tmp_path / "excused"
    excused = Counter(log.read_text().splitlines() if log.exists() else [])
    print(f"schemathesis: {elapsed:.0f} s\n{run.stdout[-1500:]}\nexcused as unstatable:\n"
          + "".join(f"{count:5} {kind}\n" for kind, count in sorted(excused.items())))
    report = run.stdout[-20000:] + run.stderr[-5000:]
    assert run.returncode == 0, report
    assert " passed" in run.stdout and "failed" not in run.stdout, report


def test_options_lists_every_method_the_path_serves(live: Live) -> None:
    """``Allow`` on OPTIONS: the path's documented methods (Litestar's own answer named
    those of the path's first handler only)."""
    schema = httpx.get(f"{live.server.url}/schema/openapi.json").json()
    mine = {"Authorization": f"Bearer {live.server.api_key}"}
    for path, operations in schema["paths"].items():
        url = path.replace("{project}", str(live.project["name"])).replace("{org}", "o")
        # The intake paths answer OPTIONS as a browser's CORS preflight (keyed by the URL).
        r = httpx.options(f"{live.server.url}{url}", headers=mine,
                          params={"key": live.project["ingestKey"],
                                  "sentry_key": live.project["sentryKey"]})
        methods = r.headers.get("allow", r.headers.get("access-control-allow-methods", ""))
        assert r.status_code == 204, (path, r.text)
        allowed = {m.strip().lower() for m in methods.split(",")}
        assert allowed - {"options", "head"} == set(operations), (path, methods)


# What the schema says (as a JSON Schema validator reads it: ECMA-262 regexes) and what the
# server accepts agree on any text, hostile text included: Unicode digits and letters,
# fullwidth forms, a trailing newline (Python's `$` matches before one, ECMA's does not).
# (No lone surrogates: no URL or JSON text carries one, and the validator cannot take one.)
_CHARS = st.characters(exclude_categories=["Cs"])
_HOSTILE = (st.text(st.sampled_from("0123456789smhdwT:.-+Z_ prj\n\u0663\uff11\u00e9\u200b")
                    | _CHARS, max_size=40)
            | st.tuples(st.text(st.characters(categories=["Nd"]), min_size=1, max_size=3),
                        st.sampled_from("smhdw")).map("".join))  # "٣m": digits of any script


def _schema_admits(pattern: str, value: str) -> bool:
    return jsonschema_rs.validator_for({"type": "string", "pattern": pattern}).is_valid(value)


@given(st.from_regex(TIME_PATTERN, fullmatch=True) | _HOSTILE)
def test_the_time_pattern_is_what_since_and_until_accept(text: str) -> None:
    accepted = not _refuses(parse_time, text, 1_764_000_000_000, "since")
    assert accepted == _schema_admits(TIME_PATTERN, text), text


@given(st.from_regex(EVENT_ID_PATTERN, fullmatch=True) | _HOSTILE
       | st.integers(0, 1 << 70).map(lambda n: f"{n:x}"))
def test_the_event_id_pattern_is_what_a_tail_resumes_from(text: str) -> None:
    accepted = not _refuses(parse_event_id, text, "lastEventId")
    assert accepted == _schema_admits(EVENT_ID_PATTERN, text), text


@pytest.fixture(scope="module")
def tenancy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tenancy]:
    db = open_database("", tmp_path_factory.mktemp("names"))  # SQLite, as the server's
    try:
        yield Tenancy(db)
    finally:
        db.close()


@given(name=st.from_regex(PROJECT_NAME_PATTERN, fullmatch=True) | _HOSTILE
       | _HOSTILE.map(lambda s: "prj_" + s))
def test_the_name_pattern_is_what_creating_a_project_accepts(tenancy: Tenancy,
                                                              name: str) -> None:
    tenant = tenancy.ensure_tenant("names")
    if tenancy.get_project(tenant, name) is not None:
        return  # drawn before: taken now
    accepted = not _refuses(tenancy.create_project, tenant, name, [])
    assert accepted == _schema_admits(PROJECT_NAME_PATTERN, name), name


def _schema(live: Live) -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_url(f"{live.server.url}/schema/openapi.json")


def _answers(case: schemathesis.Case, status: int, headers: dict[str, str] | None = None,
             **kwargs: object) -> None:
    response = case.call(headers=headers, **kwargs)
    assert response.status_code == status, (case.method, case.path, response.text)
    case.validate_response(response, checks=CHECKS)


def test_refusals_are_documented_as_sent(live: Live) -> None:
    """What fuzzing with the dev key cannot reach, one request each."""
    schema = _schema(live)
    mine = {"Authorization": f"Bearer {live.server.api_key}"}
    sentry = {"/api/{project}/envelope", "/api/{project}/store"}  # keyed by the DSN's key
    public = {"/healthz", "/readyz", "/metrics", "/v1/ingest", *sentry}
    for result in schema.get_all_operations():
        operation = result.ok()
        names = {p.name for p in operation.path_parameters}
        params = {name: str(live.other_project["name"]) if name == "project" else "any-org"
                  for name in names}  # org: Sentry's, boxtrail has none (sentry-cli routes)
        if operation.path not in public:
            _answers(operation.Case(path_parameters=params), 401)
            _answers(operation.Case(path_parameters=params), 401,
                     headers={"Authorization": "Bearer btk_unknown"})
        if "project" in params and operation.path not in sentry:  # another tenant's: absent
            _answers(operation.Case(path_parameters=params, query={"release": "1"}), 404,
                     headers=mine)

    create = schema["/v1/projects"]["POST"]
    _answers(create.Case(body={"name": "fuzzed"}, media_type="application/json"), 409,
             headers=mine)

    ingest = schema["/v1/ingest"]["POST"]
    key = str(live.project["ingestKey"])
    _answers(ingest.Case(query={"key": "bti_unknown"}), 401)
    _answers(ingest.Case(query={"key": key}), 415, headers={"Content-Type": "image/png"},
             data=b"x")
    _answers(ingest.Case(query={"key": key}), 400, headers={"Content-Type": "application/json"},
             data=b"{")
    _answers(ingest.Case(query={"key": key}), 413, headers={"Content-Type": "application/json"},
             data=b" " * (2 << 20))
    _answers(ingest.Case(query={"key": key}), 202, headers={"Content-Type": "application/json"},
             data=json.dumps({"events": [{"message": "hi"}, {"level": 7}]}).encode())


def test_what_the_server_requires_the_schema_requires(live: Live) -> None:
    """A request with only the parameters the schema marks required is not refused for
    a missing one (DELETE sourcemaps without ``release`` was)."""
    schema = _schema(live)
    mine = {"Authorization": f"Bearer {live.server.api_key}"}
    for result in schema.get_all_operations():
        operation = result.ok()
        if operation.method.upper() not in ("GET", "DELETE") or operation.path.endswith("/tail"):
            continue
        query = {p.name: "1.0" for p in operation.query if p.is_required}
        path = {p.name: str(live.project["name"]) if p.name == "project" else "any-org"
                for p in operation.path_parameters}
        with live.server.client() as api:  # made for the call, which may delete them
            if (operation.method.upper(), operation.path) == ("DELETE", "/v1/projects/{project}"):
                path["project"] = str(create_project(api, "spare")["name"])
            if "deletion_id" in path:  # a deletion job of the project's
                path["deletion_id"] = api.post(
                    f"/v1/projects/{live.project['name']}/deletions",
                    json={"box": "nosuch"}).json()["id"]
            if "key_id" in path:  # an API key of the tenant's
                path["key_id"] = api.post("/v1/keys", json={"name": "spare",
                                                            "scopes": ["read"]}).json()["id"]
            if "key" in path:  # an ingest key of the project
                path["key"] = api.post(f"/v1/projects/{live.project['name']}/ingest-keys",
                                       json={"name": "spare"}).json()["key"]
        case = operation.Case(query=query, path_parameters=path)
        response = case.call(headers=mine)
        assert response.status_code < 300, (operation.method, operation.path, response.text)


def test_sentry_intake_refusals_are_documented_as_sent(live: Live) -> None:
    """The envelope and store endpoints, keyed by the DSN's key: each refusal once."""
    schema = _schema(live)
    sentry_key = str(live.project["sentryKey"])
    mine_path = {"project": str(live.project["sentryId"])}
    envelope = b'{}\n{"type":"event"}\n{"message":"hi"}'
    for path, good in (("/api/{project}/envelope", envelope), ("/api/{project}/store",
                                                                b'{"message":"hi"}')):
        operation = schema[path]["POST"]
        _answers(operation.Case(path_parameters=mine_path, query={"sentry_key": "bts_unknown"}),
                 401, data=good)
        # My key, another tenant's project: refused as a key of no project there.
        _answers(operation.Case(path_parameters={"project": str(live.other_project["name"])},
                                query={"sentry_key": sentry_key}), 401, data=good)
        mine = operation.Case(path_parameters=mine_path, query={"sentry_key": sentry_key})
        _answers(mine, 400, data=b"{")
        _answers(mine, 415, headers={"Content-Encoding": "zstd"}, data=good)
        _answers(mine, 413, data=b" " * (2 << 20))
        _answers(mine, 200, data=good)
