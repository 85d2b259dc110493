"""The OpenAPI schema (``/schema/openapi.json``) says what the real server answers.

schemathesis (its CLI, as a CI job would run it) generates requests from the schema,
valid and invalid, sends them to the real server with the dev key and a project that
holds logs, errors and a source map, and checks every answer: no 5xx, a status the
operation documents, in its documented media type and schema. The refusals it does not
reach (no key, another tenant's project, a taken name, ingest's own refusals) are sent
one by one below and checked against the same schema.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import schemathesis
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.server import Server, create_project

SEED = 20261201
EXAMPLES = 50  # per operation in the fuzzing phase; about a minute on two cores
CHECKS = [not_a_server_error, response_schema_conformance, status_code_conformance,
          content_type_conformance]

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


def test_schemathesis_finds_no_5xx_and_no_answer_off_the_schema(live: Live,
                                                               tmp_path: Path) -> None:
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

[parameters]
"path.project" = "{live.project['name']}"
"query.key" = "{live.project['ingestKey']}"
"query.sentry_key" = "{live.project['sentryKey']}"

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
         "--checks", ",".join(check.__name__ for check in CHECKS),
         "--phases", "examples,coverage,fuzzing", "--output-truncate", "false"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600)
    elapsed = time.monotonic() - started
    report = run.stdout[-20000:] + run.stderr[-5000:]
    assert run.returncode == 0, report
    assert " passed" in run.stdout and "failed" not in run.stdout, report
    print(f"schemathesis: {elapsed:.0f} s\n{run.stdout[-1500:]}")


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
