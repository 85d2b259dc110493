"""Source maps end to end on the real server.

Bundles of ``tests/fixtures/sourcemaps/app/src`` are built by npm esbuild (minified) and
rollup (with debug ids), uploaded through ``boxtrail sourcemaps upload``, their errors are
thrown in real headless Chromium at a box URL and posted to ingest, and
``GET /v1/projects/{p}/errors`` must give back, for every in-app frame, the original file,
line, column and function, with context lines. The expected positions are found in the
source text, not copied from an answer.

The tests share one server, each on projects of their own names: a server per test was
1.3 s of each. The test that counts every source map object on disk starts its own
(``own_server``), since the other tests' uploads are stored there too.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.fixtures.sourcemaps.bundles import (
    SOURCES,
    build_esbuild,
    build_rollup,
    position,
    throw_in_chromium,
)
from tests.support.server import Server, create_project

ORIGIN = "https://shop.box.parallelsandbox.com"
SCRIPT = f"{ORIGIN}/assets/main.js"

# In-app frames of each scenario, innermost first: function (named from the original source
# by V8's rules: an object literal's method is Object.m, a named function expression keeps
# its name), file, and where the engine points (the code, and the spot in it).
EXPECTED = {
    "renderWithoutOwner": [
        ("renderCart", "render.js", "cart.owner.name", "name"),
        ("checkout", "main.js", "return renderCart(cart)", "renderCart"),
        ("Object.renderWithoutOwner", "main.js", "return checkout(cart)", "checkout"),
        ("runScenario", "main.js", "scenarios[name]()", "("),
    ],
    "addBadItem": [
        # An Error's stack is taken where it is constructed.
        ("Cart.add", "cart.js", "throw new RangeError", "new"),
        ("Object.addBadItem", "main.js", ".add({ price: 2, qty: 0 })", "add"),
        ("runScenario", "main.js", "scenarios[name]()", "("),
    ],
}
# Without the original sources, names come from the minified code's scopes (``symbolic``),
# which spell a method by the variable that holds its object, and are marked so.
MINIFIED_NAMES = {"Object.renderWithoutOwner": "scenarios.renderWithoutOwner",
                  "Object.addBadItem": "scenarios.addBadItem",
                  "runScenario": "globalThis.runScenario"}
# V8 points at the "(" of the keyed call; esbuild's minified map has no segment starting
# there (its segments start at "scenarios", "name" and "]"), so the position maps to the
# start of the segment it falls in, as source maps define it.
ESBUILD_AT = {"(": "]"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(tmp_path_factory.mktemp("symbolicate-e2e") / "data").start()
    yield srv
    srv.stop()


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[Server]:
    """A fresh server: its object store holds this test's uploads alone."""
    srv = Server(tmp_path / "data").start()
    yield srv
    srv.stop()


@pytest.fixture
def own_api(own_server: Server) -> Iterator[httpx.Client]:
    with own_server.client() as client:
        yield client


@pytest.fixture(scope="module")
def esbuild(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict[str, str]]]:
    dist = build_esbuild(tmp_path_factory.mktemp("esbuild"))
    return dist, throw_in_chromium(dist, ORIGIN)


@pytest.fixture(scope="module")
def rollup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict[str, str]]]:
    dist = build_rollup(tmp_path_factory.mktemp("rollup"))
    return dist, throw_in_chromium(dist, ORIGIN)


def cli_upload(server: Server, directory: Path, *args: str, key: str | None = None
               ) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOXTRAIL_")}
    env.update(BOXTRAIL_URL=server.url, BOXTRAIL_API_KEY=key or server.api_key)
    return subprocess.run([sys.executable, "-m", "boxtrail", "sourcemaps", "upload",
                           str(directory), *args], env=env, capture_output=True, text=True,
                          timeout=60)


def ingest(server: Server, ingest_key: str, errors: list[dict[str, str]],
           **context: object) -> None:
    events = [{"level": "error", "message": e["message"], "error": e} for e in errors]
    r = httpx.post(f"{server.url}/v1/ingest", params={"key": ingest_key},
                   json={"context": context, "events": events})
    assert r.status_code == 202 and r.json()["accepted"] == len(events), r.text


def frames_of(api: httpx.Client, project: str, message: str) -> list[dict[str, object]]:
    rows = api.get(f"/v1/projects/{project}/errors", params={"since": "1h"}).json()["rows"]
    [row] = [r for r in rows if r["error"]["message"] == message]
    return row["error"]["frames"]  # type: ignore[no-any-return]


def with_url(error: dict[str, str], url: str) -> dict[str, str]:
    return {**error, "stack": error["stack"].replace(SCRIPT, url)}


def assert_original(frames: list[dict[str, object]], scenario: str, context: bool = True,
                    bundler: str = "esbuild") -> None:
    expected = EXPECTED[scenario]
    for frame, (function, file, code, at) in zip(frames, expected, strict=False):
        if bundler == "esbuild":
            at = ESBUILD_AT.get(at, at)
        line, column = position(file, code, at)
        if not context:
            function = MINIFIED_NAMES.get(function, function)
        assert (frame["function"], frame["file"], frame["line"], frame["column"]) == (
            function, f"src/{file}", line, column), frame
        assert frame["symbolicated"] is True
        assert frame["functionSource"] == ("source" if context else "minified"), frame
        lines = (SOURCES / file).read_text().split("\n")
        if context:
            assert frame["problem"] is None, frame
            assert frame["contextLine"] == lines[line - 1]
            assert frame["preContext"] == lines[max(line - 6, 0): line - 1]
            assert frame["postContext"] == lines[line: line + 5]
        else:
            assert frame["problem"] == "missing_sources_content", frame
            assert frame["contextLine"] is None and frame["preContext"] == []


def in_app(frames: list[dict[str, object]]) -> list[dict[str, object]]:
    return [f for f in frames if "/assets/" in str(f["raw"])]


def test_esbuild_bundle_uploaded_by_the_cli(server: Server, api: httpx.Client,
                                            esbuild: tuple[Path, dict[str, dict[str, str]]]
                                            ) -> None:
    dist, errors = esbuild
    key = str(create_project(api, "shop")["ingestKey"])
    result = cli_upload(server, dist, "--project", "shop", "--release", "1.0")
    assert result.returncode == 0, result.stderr
    assert "stored 1 source maps" in result.stdout and "~/assets/main.js" in result.stdout
    assert "100%" in result.stderr  # the progress bar
    ingest(server, key, list(errors.values()), release="1.0")
    for scenario, error in errors.items():
        frames = frames_of(api, "shop", error["message"])
        assert len(in_app(frames)) == len(EXPECTED[scenario])
        assert_original(frames, scenario)
    rows = api.get("/v1/projects/shop/errors").json()["rows"]
    stack = next(r for r in rows if r["error"]["type"] == "TypeError")["error"]["stack"]
    line, column = position("render.js", "cart.owner.name", "name")
    assert stack.splitlines()[:2] == [
        "TypeError: Cannot read properties of null (reading 'name')",
        f"    at renderCart (src/render.js:{line}:{column})"]
    # The same errors again: whole stacks come from the cache.
    metrics = api.get("/metrics").text
    hits = _metric(metrics, 'boxtrail_symbolication_cache_total{cache="stack",result="hit"}')
    api.get("/v1/projects/shop/errors")
    metrics = api.get("/metrics").text
    assert _metric(metrics, 'boxtrail_symbolication_cache_total{cache="stack",result="hit"}') \
        == hits + 2


def _metric(text: str, name: str) -> float:
    match = re.search(re.escape(name) + r" (\S+)", text)
    return float(match.group(1)) if match else 0.0


def test_upload_after_the_error_applies_to_it(server: Server, api: httpx.Client,
                                              esbuild: tuple[Path, dict[str, dict[str, str]]]
                                              ) -> None:
    dist, errors = esbuild
    key = str(create_project(api, "late")["ingestKey"])
    ingest(server, key, [errors["addBadItem"]], release="7")
    before = frames_of(api, "late", "bad quantity 0")
    assert {f["problem"] for f in in_app(before)} == {"missing_sourcemap"}
    assert cli_upload(server, dist, "--project", "late", "--release", "7").returncode == 0
    assert_original(frames_of(api, "late", "bad quantity 0"), "addBadItem")


def test_matching_by_url(server: Server, api: httpx.Client,
                         esbuild: tuple[Path, dict[str, dict[str, str]]]) -> None:
    dist, errors = esbuild
    key = str(create_project(api, "urls")["ingestKey"])
    # DIR is the assets folder itself: the prefix says where it is served.
    assert cli_upload(server, dist / "assets", "--project", "urls", "--release", "2.0",
                      "--url-prefix", "~/assets").returncode == 0
    error = errors["addBadItem"]
    cases = {
        "query and fragment ignored": (with_url(error, SCRIPT + "?v=3#top"), "2.0"),
        "~ is any scheme and host": (with_url(error, "http://other.box.test:8080/assets/main.js"),
                                     "2.0"),
        "another release: any release": (error, "1.0"),
        "no release: any release": (error, None),
    }
    for name, (sent, release) in cases.items():
        sent = {**sent, "message": name}
        ingest(server, key, [sent], **({"release": release} if release else {}))
        assert_original(frames_of(api, "urls", name), "addBadItem")
    # Nothing at this URL: the frame says why.
    ingest(server, key, [{**with_url(error, f"{ORIGIN}/js/main.js"), "message": "moved"},
                         {**with_url(error, f"{ORIGIN}/assets/vendor.js"), "message": "other"}])
    assert {f["problem"] for f in in_app(frames_of(api, "urls", "other"))} == \
        {"missing_sourcemap"}
    moved = [f for f in frames_of(api, "urls", "moved") if "/js/" in str(f["raw"])]
    assert {f["problem"] for f in moved} == {"url_mismatch"}  # main.js is at ~/assets/


def test_rollup_debug_id_wins_over_a_wrong_url(server: Server, api: httpx.Client,
                                              rollup: tuple[Path, dict[str, dict[str, str]]]
                                              ) -> None:
    dist, errors = rollup
    debug_id = json.loads((dist / "assets" / "main.js.map").read_text())["debugId"]
    assert f"//# debugId={debug_id}" in (dist / "assets" / "main.js").read_text()
    key = str(create_project(api, "ids")["ingestKey"])
    result = cli_upload(server, dist, "--project", "ids", "--url-prefix", "~/not/where/served")
    assert result.returncode == 0 and f"debug id {debug_id}" in result.stdout
    ingest(server, key, [errors["renderWithoutOwner"]], release="9",
           debugIds={SCRIPT: debug_id})
    assert_original(frames_of(api, "ids", errors["renderWithoutOwner"]["message"]),
                    "renderWithoutOwner", bundler="rollup")
    # Without the debug id, the URL does not match.
    ingest(server, key, [{**errors["addBadItem"], "message": "no ids"}])
    assert {f["problem"] for f in in_app(frames_of(api, "ids", "no ids"))} == {"url_mismatch"}


def test_index_map_and_map_without_sources_content(
        server: Server, api: httpx.Client, tmp_path: Path,
        esbuild: tuple[Path, dict[str, dict[str, str]]]) -> None:
    _, errors = esbuild
    key = str(create_project(api, "kinds")["ingestKey"])
    # The same bundle with its map as an index map (one section).
    indexed = build_esbuild(tmp_path / "indexed")
    map_path = indexed / "assets" / "main.js.map"
    plain = json.loads(map_path.read_text())
    map_path.write_text(json.dumps({"version": 3, "sections": [
        {"offset": {"line": 0, "column": 0}, "map": plain}]}))
    assert cli_upload(server, indexed, "--project", "kinds", "--release", "idx").returncode == 0
    ingest(server, key, [errors["addBadItem"]], release="idx")
    assert_original(frames_of(api, "kinds", "bad quantity 0"), "addBadItem")
    # Built without sourcesContent: original positions, no context lines, a warning.
    bare = build_esbuild(tmp_path / "bare", "--sources-content=false")
    result = cli_upload(server, bare, "--project", "kinds", "--release", "bare")
    assert result.returncode == 0
    assert "warning: assets/main.js.map: no sourcesContent" in result.stdout
    ingest(server, key, [{**errors["renderWithoutOwner"], "message": "bare"}], release="bare")
    assert_original(frames_of(api, "kinds", "bare"), "renderWithoutOwner", context=False)


def test_malformed_map_fails_the_whole_upload(server: Server, api: httpx.Client,
                                              tmp_path: Path,
                                              esbuild: tuple[Path, dict[str, dict[str, str]]]
                                              ) -> None:
    dist, _ = esbuild
    create_project(api, "bad")
    build = tmp_path / "build"
    (build / "assets").mkdir(parents=True)
    for name in ("main.js", "main.js.map"):
        (build / "assets" / name).write_bytes((dist / "assets" / name).read_bytes())
    (build / "broken.js").write_text("x()\n//# sourceMappingURL=broken.js.map\n")
    (build / "broken.js.map").write_text('{"version": 3, "sources": ["a"], "mappings": "A!"}')
    result = cli_upload(server, build, "--project", "bad", "--release", "1")
    assert result.returncode == 1
    assert "upload refused (400 invalid_sourcemap): broken.js.map: invalid source map" \
        in result.stderr
    # Atomic: the valid pair of the same upload was not stored either.
    assert api.get("/v1/projects/bad/sourcemaps").json() == {"files": []}
    # Over plain HTTP: the one error shape, naming the file.
    r = api.post("/v1/projects/bad/sourcemaps", data={"release": "1"}, files=[
        ("file", ("a.js", b"a()\n")), ("file", ("a.js.map", b"{nope"))])
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "invalid_sourcemap"
    assert r.json()["error"]["detail"] == {"file": "a.js.map"}
    # A name is a label, never a path.
    r = api.post("/v1/projects/bad/sourcemaps", files=[("file", ("../../etc/x.js.map", b"{}"))])
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_upload"
    assert not (server.data_dir.parent / "etc").exists()


def test_list_and_delete_by_release(own_server: Server, own_api: httpx.Client,
                                    esbuild: tuple[Path, dict[str, dict[str, str]]]) -> None:
    dist, _ = esbuild
    api = own_api
    create_project(api, "rel")
    for release in ("1.0", "2.0"):
        assert cli_upload(own_server, dist, "--project", "rel", "--release",
                          release).returncode == 0
    listed = api.get("/v1/projects/rel/sourcemaps", params={"release": "1.0"}).json()["files"]
    assert [(f["url"], f["release"], f["hasJs"], f["sourcesContent"]) for f in listed] == [
        ("~/assets/main.js", "1.0", True, True)]
    assert api.delete("/v1/projects/rel/sourcemaps").status_code == 400
    assert api.delete("/v1/projects/rel/sourcemaps", params={"release": "1.0"}).json() == {
        "deleted": 1}
    assert [f["release"] for f in api.get("/v1/projects/rel/sourcemaps").json()["files"]] == [
        "2.0"]
    # The blobs are shared by content: deleting 1.0 kept what 2.0 needs (the JS, the map, and
    # the function tables parsed from the map's sources, built when the upload answered).
    objects = own_server.data_dir / "objects" / "sourcemaps"
    assert sorted(p.suffix for p in objects.rglob("*") if p.is_file()) == ["", "", ".scopes"]
    api.delete("/v1/projects/rel/sourcemaps", params={"release": "2.0"})
    assert [p for p in objects.rglob("*") if p.is_file()] == []


def test_tenants_never_share_maps_even_with_the_same_debug_id(
        server: Server, api: httpx.Client, rollup: tuple[Path, dict[str, dict[str, str]]]
) -> None:
    dist, errors = rollup
    debug_id = json.loads((dist / "assets" / "main.js.map").read_text())["debugId"]
    create_project(api, "twin")
    assert cli_upload(server, dist, "--project", "twin").returncode == 0
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOXTRAIL_")}
    other_key = subprocess.run(
        [sys.executable, "-m", "boxtrail", "keys", "create", "--tenant", "other"],
        env={**env, "BOXTRAIL_DATA_DIR": str(server.data_dir)}, capture_output=True,
        text=True, check=True, timeout=60).stdout.strip()
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {other_key}"},
                      timeout=10) as other:
        # Same project name, same script URL, same debug id: still nothing of tenant 1.
        key = str(create_project(other, "twin")["ingestKey"])
        ingest(server, key, [errors["renderWithoutOwner"]], debugIds={SCRIPT: debug_id})
        frames = frames_of(other, "twin", errors["renderWithoutOwner"]["message"])
        assert {f["problem"] for f in in_app(frames)} == {"missing_sourcemap"}
        assert other.get("/v1/projects/twin/sourcemaps").json() == {"files": []}
        mine = api.get("/v1/projects/twin").json()["id"]
        assert other.get(f"/v1/projects/{mine}/sourcemaps").status_code == 404
        assert other.delete(f"/v1/projects/{mine}/sourcemaps",
                            params={"release": ""}).status_code == 404
        r = other.post(f"/v1/projects/{mine}/sourcemaps",
                       files=[("file", ("a.js.map", b"{}"))])
        assert r.status_code == 404
    # Tenant 1's own error with that debug id is symbolicated.
    own = str(api.get("/v1/projects/twin").json()["ingestKey"])
    ingest(server, own, [errors["renderWithoutOwner"]], debugIds={SCRIPT: debug_id})
    assert_original(frames_of(api, "twin", errors["renderWithoutOwner"]["message"]),
                    "renderWithoutOwner", bundler="rollup")
