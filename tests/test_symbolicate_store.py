"""Artifacts on both storage backends (local files and a real S3 server): upload, the lookups
built in the background at upload, a stack rewritten from stored bytes, delete."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from boxtrail.db import open_db
from boxtrail.metrics import Registry
from boxtrail.storage import Storage
from symbolicate.artifacts import ArtifactStore, blob_key
from symbolicate.lookup import StackInput, Symbolicated, Symbolicator
from symbolicate.sourcemaps import UploadedFile, plan_upload
from tests.fixtures.sourcemaps.bundles import build_esbuild, position
from tests.s3server import storage_for

URL = "https://b1.box.parallelsandbox.com/assets/main.js"


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
        store = ArtifactStore(open_db(tmp_path / "meta.sqlite"), storage)
        metrics = Registry()
        symbolicator = Symbolicator(store, metrics)
        [row] = await store.upload("prj_1", "1.0", plan_upload(bundle, "~/"))
        assert row.js_sha256 is not None
        assert sorted(k.key for k in storage.list("sourcemaps/prj_1/")) == sorted(
            blob_key("prj_1", sha) for sha in (row.js_sha256, row.map_sha256))
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
