"""``sentry-cli sourcemaps upload`` (the real 3.8.0 binary) against the real server, and the
same endpoints fed by hand with what a hostile client could send (``symbolicate.sentry_cli``,
``symbolicate.bundles``).

The server is shared by the module (each test has its own project): its uploads worker
starts once.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from symbolicate.chunks import CHUNK_BYTES, CHUNKS_PER_REQUEST
from symbolicate.sourcemaps import MAX_FILE_BYTES, MAX_FILES
from tests.ingest.test_sentry_recorded import RECORDED, replay
from tests.support.server import Server, create_project

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "sentry"
CLI = FIXTURES / "node_modules" / ".bin" / "sentry-cli"
DEBUG_ID = "42d5be88-2c34-514e-b2fe-94bc1873e3fc"  # what inject gives the fixture app
RELEASE = "boxtrail-fixtures@1.0.0"  # the recorded events' release

JS = b"function a(){throw new Error('x')}\n"
MAP = json.dumps({"version": 3, "sources": ["src/a.js"], "names": [], "mappings": "AAAA",
                  "sourcesContent": ["function a() {}\n"]}).encode()
HAND_ID = "2460ccbf-8527-4c41-a5e3-52209e0c36d6"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    if not CLI.exists():
        pytest.fail("no sentry-cli: run `make sentry-fixtures` first")
    srv = Server(tmp_path_factory.mktemp("sentry-cli") / "data").start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def api(server: Server) -> Iterator[httpx.Client]:
    with server.client(timeout=30) as client:
        yield client


def sentry_cli(server: Server, home: Path, *args: str, key: str | None = None
               ) -> subprocess.CompletedProcess[str]:
    """The binary with nothing of this machine's config: its own HOME, no update check."""
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "SENTRY_DISABLE_UPDATE_CHECK": "1"}
    return subprocess.run(
        [str(CLI), "--log-level=debug", "--url", server.url,
         "--auth-token", key or server.api_key, *args],
        env=env, capture_output=True, text=True, timeout=60)


def calls(log: str) -> list[str]:
    """The requests of a sentry-cli debug log: ``GET /api/0/...``."""
    return [line.split("> ", 1)[1].removesuffix(" HTTP/1.1") for line in log.splitlines()
            if "> GET " in line or "> POST " in line]


def listed(api: httpx.Client, project: str) -> list[dict[str, Any]]:
    r = api.get(f"/v1/projects/{project}/sourcemaps")
    assert r.status_code == 200, r.text
    return r.json()["files"]  # type: ignore[no-any-return]


def thrown(api: httpx.Client, project: str) -> list[dict[str, Any]]:
    """The recorded throwError() event, as /errors gives it."""
    rows = api.get(f"/v1/projects/{project}/errors", params={"since": "5000w"}).json()["rows"]
    return [e for e in rows if e["error"]["message"] == "no price for mug"]


# --- the real sentry-cli --------------------------------------------------------------------


def test_build_inject_upload_then_recorded_event_is_symbolicated(
        server: Server, api: httpx.Client, tmp_path: Path) -> None:
    project = create_project(api, "shop")
    out = tmp_path / "out"
    subprocess.run(["node", str(FIXTURES / "build.mjs"), str(out)], check=True, timeout=60)
    inject = sentry_cli(server, tmp_path, "sourcemaps", "inject", str(out))
    assert inject.returncode == 0, inject.stderr
    # build.mjs is deterministic: the id the recorded events carry
    assert f"{DEBUG_ID} - {out}/main.js" in inject.stdout

    upload = sentry_cli(server, tmp_path, "sourcemaps", "upload", "--org", "any-org",
                        "--project", "shop", "--release", RELEASE, str(out))
    assert upload.returncode == 0, upload.stderr
    assert "File processing complete" in upload.stdout
    assert calls(upload.stderr) == [
        "GET /api/0/organizations/any-org/chunk-upload/",
        "POST /api/0/organizations/any-org/artifactbundle/assemble/",
        "POST /api/0/organizations/any-org/chunk-upload/",
        "POST /api/0/organizations/any-org/artifactbundle/assemble/"]
    [stored] = listed(api, "shop")
    assert (stored["url"], stored["mapName"], stored["release"], stored["debugId"],
            stored["hasJs"]) == ("~/main.js", "main.js.map", RELEASE, DEBUG_ID, True)

    replay(server, project, "debug-ids")
    [error] = thrown(api, "shop")
    frames = [f for f in error["error"]["frames"] if f["line"] is not None]
    assert [(f["file"], f["line"]) for f in frames] == [
        ("app/src/cart.js", 5), ("app/src/cart.js", 16), ("app/src/cart.js", 16),
        ("app/src/main.js", 15), ("node_modules/@sentry/browser/src/helpers.ts", 157)], frames
    assert all(f["symbolicated"] for f in frames)

    # The same build again: chunks are uploaded anew, the files replaced, not added.
    again = sentry_cli(server, tmp_path, "sourcemaps", "upload", "--org", "o", "--project",
                       str(project["id"]), "--release", RELEASE, str(out))
    assert again.returncode == 0, again.stderr
    assert [f["debugId"] for f in listed(api, "shop")] == [DEBUG_ID]


def test_release_and_url_match_without_debug_ids(server: Server, api: httpx.Client,
                                                 tmp_path: Path) -> None:
    """The plain recording: no debug ids anywhere, so frames match by release + ~/main.js."""
    project = create_project(api, "plain")
    bundle = shutil.copytree(RECORDED / "plain" / "bundle", tmp_path / "bundle")
    upload = sentry_cli(server, tmp_path, "sourcemaps", "upload", "--org", "o", "--project",
                        "plain", "--release", RELEASE, "--wait", str(bundle))
    assert upload.returncode == 0, upload.stderr
    [stored] = listed(api, "plain")
    assert (stored["url"], stored["release"], stored["debugId"]) == (
        "~/main.js", RELEASE, None)
    replay(server, project, "plain")
    [error] = thrown(api, "plain")
    frames = [f for f in error["error"]["frames"] if f["line"] is not None]
    assert [(f["file"], f["line"]) for f in frames][:2] == [
        ("app/src/cart.js", 5), ("app/src/cart.js", 16)], frames


def test_a_sourcemaps_key_uploads_with_sentry_cli_and_cannot_read_logs(
        server: Server, api: httpx.Client, tmp_path: Path) -> None:
    """What CI holds: a key of scope sourcemaps:write only."""
    create_project(api, "ci-only")
    made = api.post("/v1/keys", json={"name": "ci", "scopes": ["sourcemaps:write"]})
    assert made.status_code == 201, made.text
    key = made.json()["key"]
    bundle = shutil.copytree(RECORDED / "plain" / "bundle", tmp_path / "bundle")
    upload = sentry_cli(server, tmp_path, "sourcemaps", "upload", "--org", "o", "--project",
                        "ci-only", "--release", RELEASE, "--wait", str(bundle), key=key)
    assert upload.returncode == 0, upload.stderr
    assert [f["url"] for f in listed(api, "ci-only")] == ["~/main.js"]
    with httpx.Client(base_url=server.url, timeout=10,
                      headers={"Authorization": f"Bearer {key}"}) as ci:
        for path in ("/v1/projects/ci-only/logs", "/v1/projects/ci-only/errors",
                     "/v1/projects/ci-only/tail"):
            r = ci.get(path)
            assert r.status_code == 403, (path, r.text)
            assert r.json()["error"] == {
                "code": "insufficient_scope", "detail": {"scope": "read"},
                "message": r.json()["error"]["message"]}
        assert ci.get("/v1/projects/ci-only/sourcemaps").status_code == 200


def test_unknown_project_fails_the_cli_and_stores_nothing(server: Server, api: httpx.Client,
                                                          tmp_path: Path) -> None:
    create_project(api, "kept-empty")
    bundle = shutil.copytree(RECORDED / "debug-ids" / "bundle", tmp_path / "bundle")
    upload = sentry_cli(server, tmp_path, "sourcemaps", "upload", "--org", "o", "--project",
                        "no-such-project", str(bundle))
    assert upload.returncode != 0
    assert listed(api, "kept-empty") == []


def test_a_bundle_refused_fails_the_cli_with_the_file_named(server: Server, api: httpx.Client,
                                                            tmp_path: Path) -> None:
    create_project(api, "refused")
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "app.js").write_bytes(JS + f"//# debugId={HAND_ID}\n".encode())
    # sentry-cli reads the map's debugId; boxtrail also checks the mappings, which are broken
    (bundle / "app.js.map").write_text(json.dumps({
        "version": 3, "sources": ["a.js"], "names": [], "mappings": "AAAA,!!",
        "debugId": HAND_ID}))
    upload = sentry_cli(server, tmp_path, "sourcemaps", "upload", "--org", "o", "--project",
                        "refused", "--no-rewrite", str(bundle))
    assert upload.returncode == 1, upload.stdout
    assert "Failed to process uploaded files: app.js.map: invalid source map" in upload.stderr
    assert listed(api, "refused") == []


# --- by hand: what a hostile client can send ------------------------------------------------


def make_bundle(members: dict[str, bytes], manifest: dict[str, Any] | bytes | None = None,
                header: bytes = b"SYSB\x02\x00\x00\x00") -> bytes:
    """An artifact bundle as sentry-cli writes one: ``members`` as ``files/...``; without a
    ``manifest``, one listing each ``.js`` as minified source and each ``.map`` as a map."""
    if manifest is None:
        manifest = {"files": {
            name: {"type": "source_map" if name.endswith(".map") else "minified_source",
                   "url": "~/" + name.removeprefix("files/_/_/"), "headers": {}}
            for name in members}, "org": "o"}
    body = io.BytesIO()
    with zipfile.ZipFile(body, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("manifest.json", manifest if isinstance(manifest, bytes)
                         else json.dumps(manifest))
        for name, data in members.items():
            archive.writestr(name, data)
    return header + body.getvalue()


GOOD = {"files/_/_/app.js": JS + f"//# debugId={HAND_ID}\n".encode(),
        "files/_/_/app.js.map": MAP}


def sha1(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()


def post_chunks(client: httpx.Client, parts: list[tuple[str, bytes]],
                field: str = "file_gzip") -> httpx.Response:
    return client.post("/api/0/organizations/o/chunk-upload/",
                       files=[(field, (name, data, "application/octet-stream"))
                              for name, data in parts])


def upload(client: httpx.Client, bundle: bytes) -> list[str]:
    pieces = [bundle[i:i + CHUNK_BYTES] for i in range(0, len(bundle), CHUNK_BYTES)]
    r = post_chunks(client, [(sha1(p), gzip.compress(p)) for p in pieces])
    assert r.status_code == 200, r.text
    return [sha1(p) for p in pieces]


def assemble(client: httpx.Client, bundle: bytes, project: str, **body: Any) -> httpx.Response:
    pieces = [bundle[i:i + CHUNK_BYTES] for i in range(0, len(bundle), CHUNK_BYTES)]
    request = {"checksum": sha1(bundle), "chunks": [sha1(p) for p in pieces],
               "projects": [project], **body}
    return client.post("/api/0/organizations/o/artifactbundle/assemble/", json=request)


def test_missing_chunks_are_listed_then_assembled_and_polled(api: httpx.Client) -> None:
    create_project(api, "hand")
    bundle = make_bundle(GOOD)
    first = assemble(api, bundle, "hand", version="2.0")
    assert first.status_code == 200
    assert first.json() == {"state": "not_found", "missingChunks": [sha1(bundle)]}
    upload(api, bundle)
    assert assemble(api, bundle, "hand", version="2.0").json() == {
        "state": "ok", "missingChunks": []}
    # The chunks are gone once assembled; the next poll gets the same answer.
    assert assemble(api, bundle, "hand", version="2.0").json() == {
        "state": "ok", "missingChunks": []}
    [stored] = listed(api, "hand")
    assert (stored["url"], stored["release"], stored["debugId"]) == ("~/app.js", "2.0", HAND_ID)
    # Deleted since: the same bundle is not "ok" from memory, it is stored again.
    assert api.delete("/v1/projects/hand/sourcemaps", params={"release": "2.0"}).json() == {
        "deleted": 1}
    assert assemble(api, bundle, "hand", version="2.0").json()["state"] == "not_found"
    upload(api, bundle)
    assert assemble(api, bundle, "hand", version="2.0").json()["state"] == "ok"
    assert [f["debugId"] for f in listed(api, "hand")] == [HAND_ID]


def test_a_chunk_whose_sha1_is_not_its_name_is_refused(api: httpx.Client) -> None:
    create_project(api, "wrong-sha")
    bundle = make_bundle(GOOD)
    r = post_chunks(api, [("0" * 40, gzip.compress(bundle))])
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "chunk_checksum_mismatch"
    assert r.json()["error"]["detail"] == {"chunk": "0" * 40, "sha1": sha1(bundle)}
    assert assemble(api, bundle, "wrong-sha").json()["missingChunks"] == [sha1(bundle)]


BOMB = bytes(CHUNK_BYTES + (1 << 20))  # 9 MiB of zeros: 9 KB of gzip
CUT = gzip.compress(b"x" * 1000)


@pytest.mark.parametrize(("parts", "field", "status", "code"), [
    # inflated only up to the chunk size, then refused
    ([(sha1(BOMB), gzip.compress(BOMB))], "file_gzip", 413, "chunk_too_large"),
    ([(sha1(BOMB), BOMB)], "file", 413, "chunk_too_large"),
    ([(sha1(b"plain"), b"plain")], "file_gzip", 400, "invalid_chunk"),
    ([(sha1(b"x" * 1000), CUT[:-8])], "file_gzip", 400, "invalid_chunk"),
    ([(sha1(b"x" * 1000), CUT + b"more")], "file_gzip", 400, "invalid_chunk"),
    ([("../../etc/passwd", b"x")], "file", 400, "invalid_chunk"),
    ([("chunk", b"x")], "file", 400, "invalid_chunk"),
], ids=["gzip-bomb", "too-large", "not-gzip", "cut-gzip", "after-gzip", "path-name",
        "not-sha1-name"])
def test_chunks_refused(api: httpx.Client, request: pytest.FixtureRequest,
                        parts: list[tuple[str, bytes]], field: str, status: int,
                        code: str) -> None:
    r = post_chunks(api, parts, field)
    assert (r.status_code, r.json()["error"]["code"]) == (status, code), r.text
    name = parts[0][0]
    if len(name) == 40:  # nothing was stored
        project = f"refused-{request.node.callspec.id}"
        create_project(api, project)
        missing = api.post("/api/0/organizations/o/artifactbundle/assemble/", json={
            "checksum": name, "chunks": [name], "projects": [project]}).json()
        assert missing["missingChunks"] == [name]


def test_too_many_chunks_in_one_request_are_refused(api: httpx.Client) -> None:
    parts = [(sha1(str(i).encode()), str(i).encode()) for i in range(CHUNKS_PER_REQUEST + 1)]
    r = post_chunks(api, parts, "file")
    assert (r.status_code, r.json()["error"]["code"]) == (413, "chunk_too_large")


def test_a_body_that_is_not_multipart_is_refused(api: httpx.Client) -> None:
    r = api.post("/api/0/organizations/o/chunk-upload/", json={"chunks": []})
    assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_chunk")


def _refused(api: httpx.Client, project: str, bundle: bytes, code: str) -> dict[str, Any]:
    create_project(api, project)
    upload(api, bundle)
    r = assemble(api, bundle, project)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert (answer["state"], answer["missingChunks"], answer["error"]["code"]) == (
        "error", [], code), answer
    assert answer["detail"] == answer["error"]["message"]
    assert listed(api, project) == []
    return answer  # type: ignore[no-any-return]


@pytest.mark.parametrize("name", ["../evil.js", "/etc/evil.js", "files/../../evil.js",
                                  "C:/evil.js", "files\\evil.js", "./evil.js"])
def test_member_names_that_would_be_paths_are_refused(api: httpx.Client, name: str) -> None:
    bundle = make_bundle({**GOOD, name: JS})
    answer = _refused(api, f"names-{sha1(name.encode())[:8]}", bundle, "invalid_bundle")
    assert "names must be relative paths" in answer["detail"]


def test_too_many_members_are_refused(api: httpx.Client) -> None:
    members = {f"files/_/_/{i}.js": b"1" for i in range(MAX_FILES + 1)}
    answer = _refused(api, "many", make_bundle(members), "invalid_bundle")
    assert answer["error"]["detail"]["members"] == MAX_FILES + 2


def test_a_member_that_inflates_past_the_file_limit_is_refused(api: httpx.Client) -> None:
    bomb = bytes(MAX_FILE_BYTES + 1)  # 64 MiB of zeros: 64 KB deflated
    answer = _refused(api, "member-bomb", make_bundle({**GOOD, "files/_/_/big.js": bomb}),
                      "upload_too_large")
    assert answer["error"]["detail"] == {"file": "files/_/_/big.js"}


def test_a_member_whose_header_understates_its_size_is_refused(api: httpx.Client) -> None:
    bundle = bytearray(make_bundle(GOOD))
    # Shrink app.js.map's size in its central directory entry: zipfile stops there and the
    # CRC no longer matches.
    entry = bundle.rfind(b"PK\x01\x02", 0, bundle.rfind(b"files/_/_/app.js.map"))
    bundle[entry + 24:entry + 28] = (10).to_bytes(4, "little")
    answer = _refused(api, "liar", bytes(bundle), "invalid_bundle")
    assert "files/_/_/app.js.map" in answer["detail"]


@pytest.mark.parametrize(("bundle", "words"), [
    (b"SYSB\x02\x00\x00\x00" + b"not a zip" * 10, "not a ZIP"),
    (make_bundle(GOOD)[8:], "does not start with SYSB"),
    (make_bundle(GOOD, header=b"SYSB\x09\x00\x00\x00"), "version 9"),
    (make_bundle(GOOD, manifest=b"{not json"), "manifest.json is not a bundle manifest"),
    (make_bundle(GOOD, manifest={"files": {"files/_/_/gone.js": {
        "type": "minified_source", "url": "~/gone.js"}}}), "not in the bundle"),
    (make_bundle(GOOD, manifest={"files": {"files/_/_/app.js": {
        "type": "minified_source", "url": "ftp://x/app.js"}}}), "neither ~/path"),
    # urlsplit drops the newline: it was stored as https://hx/x/app.js, silently
    (make_bundle(GOOD, manifest={"files": {"files/_/_/app.js": {
        "type": "minified_source", "url": "https://h\nx/app.js"}}}), "control character"),
])
def test_bundles_that_cannot_be_read_are_refused(api: httpx.Client, bundle: bytes,
                                                 words: str) -> None:
    answer = _refused(api, f"bad-{sha1(bundle)[:8]}", bundle, "invalid_bundle")
    assert words in answer["detail"]


def test_an_invalid_map_fails_the_bundle_naming_it(api: httpx.Client) -> None:
    bundle = make_bundle({**GOOD, "files/_/_/app.js.map": b'{"version": 3, "sources": []'})
    answer = _refused(api, "bad-map", bundle, "invalid_sourcemap")
    assert answer["error"]["detail"] == {"file": "app.js.map"}


def test_a_bundle_that_is_not_its_checksum_is_refused(api: httpx.Client) -> None:
    create_project(api, "checksum")
    bundle = make_bundle(GOOD)
    upload(api, bundle)
    r = api.post("/api/0/organizations/o/artifactbundle/assemble/", json={
        "checksum": "1" * 40, "chunks": [sha1(bundle)], "projects": ["checksum"]})
    assert r.json()["error"]["code"] == "bundle_checksum_mismatch"
    assert listed(api, "checksum") == []


def test_tenants_see_neither_each_others_projects_nor_chunks(server: Server,
                                                             api: httpx.Client) -> None:
    create_project(api, "ours")
    other_key = subprocess.run(
        [sys.executable, "-m", "boxtrail", "keys", "create", "--tenant", "other"],
        env={"BOXTRAIL_DATA_DIR": str(server.data_dir), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, check=True).stdout.strip()
    bundle = make_bundle(GOOD)
    with httpx.Client(base_url=server.url, timeout=30,
                      headers={"Authorization": f"Bearer {other_key}"}) as other:
        create_project(other, "theirs")
        r = assemble(other, bundle, "ours")
        assert (r.status_code, r.json()["error"]["code"]) == (404, "not_found")
        upload(other, bundle)  # their chunks are not ours
    assert assemble(api, bundle, "ours").json()["missingChunks"] == [sha1(bundle)]
    r = assemble(api, bundle, "theirs")
    assert (r.status_code, r.json()["error"]["code"]) == (404, "not_found")
    r = assemble(api, bundle, "ours", projects=["ours", "theirs"])
    assert (r.status_code, r.json()["error"]["code"]) == (404, "not_found")
    assert listed(api, "ours") == []


@pytest.mark.parametrize(("body", "status", "code"), [
    (b"{not json", 400, "invalid_parameter"),
    (json.dumps({"checksum": "x", "chunks": ["0" * 40], "projects": ["p"]}).encode(), 400,
     "invalid_parameter"),
    (json.dumps({"checksum": "0" * 40, "chunks": [], "projects": ["p"]}).encode(), 400,
     "invalid_parameter"),
    (json.dumps({"checksum": "0" * 40, "chunks": ["0" * 40]}).encode(), 400,
     "invalid_parameter"),
    (json.dumps({"checksum": "0" * 40, "chunks": ["0" * 40], "projects": ["ghost"]}).encode(),
     404, "not_found"),
])
def test_assemble_requests_refused(api: httpx.Client, body: bytes, status: int,
                                   code: str) -> None:
    r = api.post("/api/0/organizations/o/artifactbundle/assemble/", content=body,
                 headers={"Content-Type": "application/json"})
    assert (r.status_code, r.json()["error"]["code"]) == (status, code), r.text


def test_every_endpoint_needs_the_api_key(server: Server) -> None:
    for method, path in (("GET", "chunk-upload/"), ("POST", "chunk-upload/"),
                         ("POST", "artifactbundle/assemble/")):
        r = httpx.request(method, f"{server.url}/api/0/organizations/o/{path}",
                          headers={"Authorization": "Bearer btk_wrong"})
        assert (r.status_code, r.json()["error"]["code"]) == (401, "unauthorized")
