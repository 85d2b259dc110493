"""Artifacts on both storage backends (local files and a real S3 server): upload, the lookups
built in the background at upload, a stack rewritten from stored bytes, delete."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.metrics import Registry
from core.storage import Storage
from metadata.db import Database
from metadata.sqlite import open_db
from symbolicate import lookup as symbolicate_lookup
from symbolicate.artifacts import ArtifactRow, ArtifactStore, blob_key
from symbolicate.built import Built
from symbolicate.lookup import StackInput, Symbolicated, Symbolicator
from symbolicate.sourcemaps import UploadedFile, plan_upload
from tests.fixtures.sourcemaps import handmade
from tests.fixtures.sourcemaps.bundles import build_esbuild, position
from tests.support.s3server import storage_for

URL = "https://b1.box.parallelsandbox.com/assets/main.js"


def wired(db: Database, storage: Storage, metrics: Registry | None = None
          ) -> tuple[ArtifactStore, Symbolicator]:
    """A store whose uploads wait for their lookups to be built by the symbolicator, as the
    server's do (in a worker there: ``boxtrail.app``)."""
    symbolicator: Symbolicator | None = None

    def uploaded(project_id: str, rows: list[ArtifactRow]) -> asyncio.Task[None] | None:
        assert symbolicator is not None
        return symbolicator.prebuild(project_id, rows)

    store = ArtifactStore(db, storage, uploaded)
    symbolicator = Symbolicator(store, metrics or Registry())
    return store, symbolicator


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Storage]:
    backend = storage_for(request, tmp_path, "boxtrail/")
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> list[UploadedFile]:
    assets = build_esbuild(tmp_path_factory.mktemp("store")) / "assets"
    return [UploadedFile(f"assets/{p.name}", p.read_bytes())
            for p in (assets / "main.js", assets / "main.js.map")]


def _stack(bundle: list[UploadedFile]) -> StackInput:
    js = bundle[0].data.decode().split("\n")[1]
    column = js.index("t.owner.name") + len("t.owner.") + 1  # where V8 points
    return StackInput(release="1.0", debug_ids={}, header=None,
                      stack=f"TypeError: x\n    at r ({URL}:2:{column})")


def test_upload_lookup_delete(storage: Storage, bundle: list[UploadedFile],
                              tmp_path: Path) -> None:
    async def main() -> tuple[Symbolicated, tuple[float, ...], list[str], Symbolicated]:
        metrics = Registry()
        store, symbolicator = wired(open_db(tmp_path / "meta.sqlite"), storage, metrics)
        [row] = await store.upload("prj_1", "1.0", plan_upload(bundle, "~/"))
        assert row.js_sha256 is not None
        # The JS, the map, and the functions of the map's sources, parsed by the upload.
        assert sorted(k.key for k in storage.list("sourcemaps/prj_1/")) == sorted(
            [blob_key("prj_1", sha) for sha in (row.js_sha256, row.map_sha256)]
            + [blob_key("prj_1", row.map_sha256) + ".scopes"])
        # No waiting here: the upload answered once it had built the lookups.
        cache = symbolicator.m_cache
        built_at_upload = cache.get("artifact", "miss")
        [found] = await symbolicator.symbolicate("prj_1", [_stack(bundle)])
        counts = (built_at_upload, cache.get("artifact", "miss"), cache.get("artifact", "hit"))
        assert await store.delete("prj_1", "1.0") == 1
        left = [k.key for k in storage.list("sourcemaps/prj_1/")]
        [gone] = await symbolicator.symbolicate("prj_1", [_stack(bundle)])
        return found, counts, left, gone

    found, counts, left, gone = asyncio.run(main())
    [frame] = found.frames
    assert (frame.file, (frame.line, frame.column), frame.function, frame.problem) == (
        "src/render.js", position("render.js", "cart.owner.name", "name"), "renderCart", None)
    assert frame.context_line == "${total.toFixed(2)} for ${cart.owner.name}`;"
    assert counts == (1, 1, 1)  # built once, by the upload; the read found it built
    assert left == []
    assert gone.frames[0].problem == "missing_sourcemap"


def test_a_blob_missing_for_a_moment_is_not_remembered(storage: Storage,
                                                       bundle: list[UploadedFile],
                                                       tmp_path: Path) -> None:
    async def main() -> tuple[str | None, str | None]:
        store = ArtifactStore(open_db(tmp_path / "meta.sqlite"), storage)
        [row] = await store.upload("prj_1", "1.0", plan_upload(bundle, "~/"))
        symbolicator = Symbolicator(store, Registry())  # after the upload: nothing built
        key = blob_key("prj_1", row.map_sha256)
        data = storage.get(key)
        storage.delete(key)  # as if a delete of the release raced this read
        [missing] = await symbolicator.symbolicate("prj_1", [_stack(bundle)])
        storage.put(key, data)
        again = _stack(bundle)._replace(header="TypeError: again")
        [found] = await symbolicator.symbolicate("prj_1", [again])
        return missing.frames[0].problem, found.frames[0].function

    assert asyncio.run(main()) == ("missing_sourcemap", "renderCart")


# --- Hostile stacks: no frame fails more than itself ---------------------------------------------

APP = "https://b1.box.parallelsandbox.com/assets/app.js"


def _handmade() -> list[UploadedFile]:
    """``handmade.JS`` with a map: column 0 maps to src/app.js 1:1, column 9 has no
    original source (one-field segment), column 18 maps to line 3, column 4 of an unnamed
    (null) source."""
    return [UploadedFile("assets/app.js", handmade.JS.encode()),
            UploadedFile("assets/app.js.map", handmade.dumps(handmade.source_map(
                handmade.mappings([[(0, 0, 0, 0), (9,), (9, 1, 2, 3)]]),
                sources=["src/app.js", None], contents=["one\n", None])))]


def _stacks(*frames: str) -> StackInput:
    return StackInput(release="1.0", debug_ids={}, header="Error: x",
                      stack="Error: x\n" + "\n".join(f"    at {f}" for f in frames))


def _symbolicate(storage: Storage, tmp_path: Path, stacks: list[StackInput]
                 ) -> list[Symbolicated]:
    async def main() -> list[Symbolicated]:
        store, symbolicator = wired(open_db(tmp_path / "meta.sqlite"), storage)
        await store.upload("prj_1", "1.0", plan_upload(_handmade(), "~/"))
        return await symbolicator.symbolicate("prj_1", stacks)

    return asyncio.run(main())


def test_positions_no_map_holds_are_a_problem_not_a_failure(storage: Storage,
                                                            tmp_path: Path) -> None:
    [found] = _symbolicate(storage, tmp_path, [_stacks(
        f"f ({APP}:0:5)", f"g ({APP}:1:0)", f"h ({APP}:0:0)", f"i ({APP}:999999999:1)",
        f"j ({APP}:1:1)")])
    assert [f.problem for f in found.frames] == [
        "invalid_location", "invalid_location", "invalid_location", "no_mapping", None]
    assert [f.symbolicated for f in found.frames] == [False] * 4 + [True]
    assert found.frames[0].raw == f"at f ({APP}:0:5)" and found.frames[0].line == 0


def test_null_sources_and_generated_code(storage: Storage, tmp_path: Path) -> None:
    [found] = _symbolicate(storage, tmp_path, [_stacks(f"f ({APP}:1:19)", f"g ({APP}:1:10)")])
    unnamed, generated = found.frames
    assert (unnamed.file, unnamed.line, unnamed.column, unnamed.symbolicated,
            unnamed.problem) == (None, 3, 4, True, "missing_source_name")
    assert (generated.file, generated.line, generated.column, generated.symbolicated,
            generated.problem) == (APP, 1, 10, False, "no_original_source")
    assert found.stack.splitlines()[1:] == ["    at <unknown>:3:4", f"    at g ({APP}:1:10)"]


def test_urls_that_do_not_parse_are_matched_as_text(storage: Storage, tmp_path: Path) -> None:
    """``urlsplit`` raises on ``https://[b1/...`` (an unclosed IPv6 host)."""
    bad = "https://[b1/assets/app.js"
    [found, fine] = _symbolicate(storage, tmp_path, [
        _stacks(f"f ({bad}:1:1)", f"g ({APP}:1:1)"), _stacks(f"h ({APP}:1:1)")])
    assert [f.problem for f in found.frames] == ["url_mismatch", None]  # app.js is at ~/assets
    assert fine.frames[0].symbolicated


@pytest.mark.parametrize("storage", ["local"], indirect=True)
def test_an_internal_failure_fails_its_frame_only_and_is_not_remembered(
        storage: Storage, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    real = symbolicate_lookup.lookup

    def failing(built: Built, line: int, column: int) -> object:
        if column == 2:
            raise RuntimeError("injected")
        return real(built, line, column)

    async def main() -> tuple[list[Symbolicated], Symbolicated]:
        store, symbolicator = wired(open_db(tmp_path / "meta.sqlite"), storage)
        await store.upload("prj_1", "1.0", plan_upload(_handmade(), "~/"))
        monkeypatch.setattr(symbolicate_lookup, "lookup", failing)
        first = await symbolicator.symbolicate("prj_1", [
            _stacks(f"f ({APP}:1:2)", f"g ({APP}:1:1)"), _stacks(f"h ({APP}:1:1)")])
        monkeypatch.setattr(symbolicate_lookup, "lookup", real)
        [again] = await symbolicator.symbolicate("prj_1", [_stacks(f"f ({APP}:1:2)",
                                                                   f"g ({APP}:1:1)")])
        return first, again

    with caplog.at_level(logging.ERROR, "boxtrail.symbolicate"):
        (failed, other), again = asyncio.run(main())
    assert [(f.problem, f.symbolicated) for f in failed.frames] == [
        ("internal_error", False), (None, True)]
    assert other.frames[0].symbolicated
    assert [f.symbolicated for f in again.frames] == [True, True]  # not cached
    assert [r.exc_info[1] for r in caplog.records if r.exc_info] != []


@pytest.mark.parametrize("storage", ["local"], indirect=True)
def test_a_failing_parse_fails_its_stack_only(storage: Storage, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    real = symbolicate_lookup.parse_stack

    def failing(text: str) -> object:
        if "poison" in text:
            raise RuntimeError("injected")
        return real(text)

    monkeypatch.setattr(symbolicate_lookup, "parse_stack", failing)
    poison, fine = _symbolicate(storage, tmp_path, [
        _stacks(f"poison ({APP}:1:1)"), _stacks(f"h ({APP}:1:1)")])
    assert poison.frames == [] and poison.stack == _stacks(f"poison ({APP}:1:1)").stack
    assert fine.frames[0].symbolicated


@pytest.mark.parametrize("storage", ["local"], indirect=True)
def test_storage_failing_on_read_is_a_problem_and_not_remembered(
        storage: Storage, tmp_path: Path) -> None:
    async def main() -> tuple[Symbolicated, Symbolicated]:
        store = ArtifactStore(open_db(tmp_path / "meta.sqlite"), storage)
        [row] = await store.upload("prj_1", "1.0", plan_upload(_handmade(), "~/"))
        symbolicator = Symbolicator(store, Registry())  # after the upload: nothing built
        blob = tmp_path / "objects" / blob_key("prj_1", row.map_sha256)
        data = blob.read_bytes()
        blob.unlink()
        blob.symlink_to(blob)  # reading it fails (ELOOP): the backend's StorageError
        [failed] = await symbolicator.symbolicate("prj_1", [_stacks(f"f ({APP}:1:1)")])
        blob.unlink()
        blob.write_bytes(data)
        [found] = await symbolicator.symbolicate("prj_1", [_stacks(f"f ({APP}:1:1)")])
        return failed, found

    failed, found = asyncio.run(main())
    assert [(f.problem, f.symbolicated) for f in failed.frames] == [
        ("sourcemap_unavailable", False)]
    assert found.frames[0].symbolicated
