"""One contract for every storage backend: local files and a real S3-compatible server."""

from __future__ import annotations

import os
import random
import socket
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from core.config import Config
from core.storage import (
    LocalStorage,
    NotFound,
    ObjectInfo,
    S3Storage,
    Storage,
    StorageError,
    open_storage,
)
from tests.support.s3server import S3Server, storage_for

PARQUET_KEY = "logs/project=p1/box=_/date=2026-11-29/0001.parquet"


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Storage]:
    backend = storage_for(request, tmp_path, "/tenant/a/")
    backend.recover()
    yield backend
    backend.close()


def keys(storage: Storage, prefix: str = "") -> list[str]:
    return [info.key for info in storage.list(prefix)]


@pytest.mark.parametrize("size", [0, 1, 5 << 20])
def test_put_get_roundtrip(storage: Storage, size: int) -> None:
    data = random.Random(size).randbytes(size)
    storage.put(PARQUET_KEY, data)
    assert storage.get(PARQUET_KEY) == data
    assert storage.head(PARQUET_KEY) == ObjectInfo(key=PARQUET_KEY, size=size)


def test_put_overwrites(storage: Storage) -> None:
    storage.put("a/x", b"first version")
    storage.put("a/x", b"second")
    assert storage.get("a/x") == b"second"
    assert storage.head("a/x") == ObjectInfo(key="a/x", size=6)
    assert keys(storage) == ["a/x"]


def test_concurrent_puts_of_one_key_leave_one_whole_object(storage: Storage) -> None:
    versions = [bytes([i]) * 100_000 for i in range(16)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda data: storage.put("same", data), versions))
    assert storage.get("same") in versions
    assert keys(storage) == ["same"]


def test_get_missing_raises_not_found(storage: Storage) -> None:
    storage.put("dir/present", b"x")
    for key in ("missing", "dir/missing", "dir", "dir/present/below"):
        with pytest.raises(NotFound):
            storage.get(key)


def test_head(storage: Storage) -> None:
    storage.put("dir/present", b"abc")
    assert storage.head("dir/present") == ObjectInfo(key="dir/present", size=3)
    assert storage.head("dir/missing") is None
    assert storage.head("dir") is None


def test_list_filters_by_prefix_and_sorts_bytewise(storage: Storage) -> None:
    # '-' sorts before '/' before '0': a depth-first listing would get this wrong.
    names = ["ab/x", "a/b", "a-c", "b/c/d", "a/a", "a0", "a/b-d", "é/1", "z"]
    for name in names:
        storage.put(name, name.encode())
    assert keys(storage) == sorted(names)
    assert keys(storage, "a") == ["a-c", "a/a", "a/b", "a/b-d", "a0", "ab/x"]
    assert keys(storage, "a/") == ["a/a", "a/b", "a/b-d"]
    assert keys(storage, "a/b") == ["a/b", "a/b-d"]
    assert keys(storage, "b/c/") == ["b/c/d"]
    assert keys(storage, "nothing/") == []
    assert keys(storage, "é") == ["é/1"]
    assert list(storage.list("a/b-")) == [ObjectInfo(key="a/b-d", size=5)]


def test_list_more_than_one_page(storage: Storage) -> None:
    # S3 answers at most 1000 keys per ListObjectsV2 page.
    names = [f"many/{i:05d}" for i in range(1100)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda name: storage.put(name, b"."), [*names, "many-not/x"]))
    assert keys(storage, "many/") == names
    assert len(keys(storage)) == 1101


def test_delete_is_idempotent(storage: Storage) -> None:
    storage.put("d/x", b"x")
    storage.delete("d/x")
    storage.delete("d/x")
    storage.delete("never/was")
    assert storage.head("d/x") is None
    assert keys(storage) == []


BAD_KEYS = ["", "/abs", "a/../b", "..", "./a", "a//b", "a/", "a\\b", "a\0b", "x.part"]
BAD_PREFIXES = ["/abs", "../up", "a/../b", "a\\b", "a\0"]
KEYED_CALLS: dict[str, Callable[[Storage, str], object]] = {
    "put": lambda storage, key: storage.put(key, b"x"),
    "put_file": lambda storage, key: storage.put_file(key, __file__),
    "get": lambda storage, key: storage.get(key),
    "head": lambda storage, key: storage.head(key),
    "delete": lambda storage, key: storage.delete(key),
    "arrow_path": lambda storage, key: storage.arrow_path(key),
    "local_path": lambda storage, key: storage.local_path(key),
}


def raises_value_error(call: Callable[[Storage, str], object], storage: Storage, key: str) -> bool:
    try:
        call(storage, key)
    except ValueError:
        return True
    return False


def test_bad_keys_raise_value_error(storage: Storage) -> None:
    # One test per backend, not per key: each S3 case would cost a client and a bucket.
    accepted = [
        (name, key)
        for key in BAD_KEYS
        for name, call in KEYED_CALLS.items()
        if not raises_value_error(call, storage, key)
    ]
    accepted += [
        ("list", prefix)
        for prefix in BAD_PREFIXES
        if not raises_value_error(lambda storage, prefix: storage.list(prefix), storage, prefix)
    ]
    assert accepted == []
    assert keys(storage) == []


def test_put_file(storage: Storage, tmp_path: Path) -> None:
    # 9 MiB is over boto3's multipart threshold (8 MiB), so S3 uploads it in parts.
    data = random.Random(9).randbytes(9 << 20)
    source = tmp_path / "upload.bin"
    source.write_bytes(data)
    storage.put_file("files/upload.bin", str(source))
    assert storage.get("files/upload.bin") == data
    assert source.read_bytes() == data


def test_put_file_missing_source_raises_storage_error(storage: Storage, tmp_path: Path) -> None:
    with pytest.raises(StorageError):
        storage.put_file("files/x", str(tmp_path / "missing.bin"))
    assert keys(storage) == []


def test_check_ok(storage: Storage) -> None:
    storage.check()


def test_parquet_readable_through_arrow(storage: Storage) -> None:
    table = pa.table({"ts": pa.array([1, 2, 3], pa.int64()), "msg": ["a", "b", "c"]})
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd")
    storage.put(PARQUET_KEY, sink.getvalue().to_pybytes())
    filesystem = storage.arrow_filesystem()
    path = storage.arrow_path(PARQUET_KEY)
    assert pq.read_table(path, filesystem=filesystem).equals(table)
    dataset = ds.dataset([path], filesystem=filesystem, format="parquet")
    assert dataset.to_table(filter=ds.field("ts") > 1).column("msg").to_pylist() == ["b", "c"]


def test_local_path(storage: Storage) -> None:
    storage.put("p/x", b"bytes")
    path = storage.local_path("p/x")
    if isinstance(storage, LocalStorage):
        assert path is not None and os.path.isabs(path)
        assert Path(path).read_bytes() == b"bytes"
    else:
        assert path is None


# --- Backend-specific behaviour ---------------------------------------------------------


def test_local_part_leftovers_are_hidden_and_recovered(tmp_path: Path) -> None:
    storage = LocalStorage(str(tmp_path / "objects"))
    storage.put("logs/a.parquet", b"whole")
    leftover = tmp_path / "objects" / "logs" / "b.parquet.0123abcd.part"
    leftover.write_bytes(b"torn")
    assert keys(storage) == ["logs/a.parquet"]
    assert storage.head("logs/b.parquet") is None
    storage.recover()
    assert not leftover.exists()
    assert storage.get("logs/a.parquet") == b"whole"


def test_local_deletes_leave_no_empty_directories(tmp_path: Path) -> None:
    """A directory's name is data (logs/project=<id>/box=<box>/...): once its last object
    is deleted, it goes too, up to the root, while puts into it race with the deletes."""
    root = tmp_path / "objects"
    storage = LocalStorage(str(root))
    storage.put("logs/project=p1/box=b1/date=2026-12-07/a.parquet", b"a")
    storage.put("logs/project=p1/box=b2/date=2026-12-07/b.parquet", b"b")
    storage.delete("logs/project=p1/box=b1/date=2026-12-07/a.parquet")
    assert sorted(p.name for p in (root / "logs" / "project=p1").iterdir()) == ["box=b2"]
    storage.delete("logs/project=p1/box=b2/date=2026-12-07/b.parquet")
    assert list(root.iterdir()) == []
    storage.delete("logs/project=p1/box=b2/date=2026-12-07/b.parquet")  # again: no error
    assert root.is_dir()

    def churn(n: int) -> None:
        for i in range(200):
            key = f"logs/project=p2/box=b/date=2026-12-07/{n}-{i}.parquet"
            storage.put(key, b"x")
            assert storage.get(key) == b"x"
            storage.delete(key)

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(churn, range(4)))
    assert list(root.iterdir()) == []


def test_local_check_fails_when_root_is_not_a_directory(tmp_path: Path) -> None:
    root = tmp_path / "objects"
    storage = LocalStorage(str(root))
    root.rmdir()
    root.write_bytes(b"")
    with pytest.raises(StorageError):
        storage.check()
    with pytest.raises(StorageError):
        storage.put("x", b"x")
    with pytest.raises(StorageError):
        storage.list("")
    with pytest.raises(StorageError):
        LocalStorage(str(root))


@pytest.mark.s3
def test_s3_check_fails_for_missing_bucket_until_ensured(s3_server: S3Server) -> None:
    storage = S3Storage(s3_server.endpoint, "bt-never-created-" + os.urandom(4).hex(), "", "")
    try:
        with pytest.raises(StorageError, match="does not exist"):
            storage.check()
        storage.ensure_bucket()
        storage.ensure_bucket()
        storage.check()
    finally:
        storage.close()


@pytest.mark.s3
def test_s3_check_fails_when_unreachable() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens once closed
    storage = S3Storage(f"http://127.0.0.1:{port}", "bucket", "", "us-east-1")
    try:
        with pytest.raises(StorageError, match="cannot reach"):
            storage.check()
    finally:
        storage.close()


@pytest.mark.s3
def test_s3_prefixes_isolate_tenants(s3_server: S3Server, s3_bucket: str) -> None:
    # "t/a" is a string prefix of "t/ab": the storage prefix must end at a '/'.
    first = S3Storage(s3_server.endpoint, s3_bucket, "t/a", s3_server.region)
    second = S3Storage(s3_server.endpoint, s3_bucket, "t/ab", s3_server.region)
    try:
        first.put("k", b"1")
        second.put("k", b"2")
        assert [info.key for info in first.list("")] == ["k"]
        assert first.get("k") == b"1"
        assert second.arrow_path("k") == f"{s3_bucket}/t/ab/k"
    finally:
        first.close()
        second.close()


def test_s3_endpoint_must_be_a_url() -> None:
    with pytest.raises(ValueError):
        S3Storage("127.0.0.1:9000", "bucket", "", "us-east-1")


def test_open_storage_follows_config(tmp_path: Path) -> None:
    local = open_storage(Config(data_dir=str(tmp_path)))
    assert isinstance(local, LocalStorage)
    assert local.root == str(tmp_path / "objects")
    remote = open_storage(
        Config(storage="s3", s3_endpoint="http://127.0.0.1:1", s3_bucket="b", s3_prefix="p")
    )
    assert isinstance(remote, S3Storage)
    assert remote.arrow_path("k") == "b/p/k"
    remote.close()
