"""Objects as files under one root directory: ``<root>/<key>``."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from typing import BinaryIO

import pyarrow.fs

from core.storage.base import (
    PART_SUFFIX,
    NotFound,
    ObjectInfo,
    StorageError,
    validate_key,
    validate_prefix,
)

# How many times a put makes its directories again after a delete pruned them meanwhile.
MAX_PRUNE_RACES = 8
# Errors that mean "no object at this key" rather than a failing disk.
_MISSING = (FileNotFoundError, NotADirectoryError, IsADirectoryError)


class LocalStorage:
    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        try:
            os.makedirs(self.root, exist_ok=True)
        except OSError as exc:
            raise StorageError(f"cannot create storage root {self.root}: {exc}") from exc
        self._arrow = pyarrow.fs.LocalFileSystem()

    def _path(self, key: str) -> str:
        return os.path.join(self.root, validate_key(key))

    def put(self, key: str, data: bytes) -> None:
        self._publish(key, lambda out: out.write(data))

    def put_file(self, key: str, path: str) -> None:
        def copy(out: BinaryIO) -> None:
            with open(path, "rb") as src:
                shutil.copyfileobj(src, out, 1 << 20)

        self._publish(key, copy)

    def _publish(self, key: str, write: Callable[[BinaryIO], object]) -> None:
        path = self._path(key)
        parent = os.path.dirname(path)
        # A unique name per writer: two concurrent puts of one key must not share a .part.
        part = f"{path}.{secrets.token_hex(6)}{PART_SUFFIX}"
        try:
            opened = self._open_new(parent, part)
            try:
                with opened as out:
                    write(out)
                    out.flush()
                    os.fsync(out.fileno())
                os.replace(part, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(part)
                raise
            _fsync_dir(parent)  # makes the rename itself survive a crash
        except OSError as exc:
            raise StorageError(f"cannot write {key!r} under {self.root}: {exc}") from exc

    def _open_new(self, parent: str, part: str) -> BinaryIO:
        """``part`` created for writing, its directories made first. A delete emptying the
        same directories prunes them (``_prune``) and may do so between the two steps: the
        put then makes them again, a few times at most."""
        for _ in range(MAX_PRUNE_RACES):
            try:
                self._make_parents(parent)
                return open(part, "xb")  # the caller closes it
            except (FileNotFoundError, FileExistsError):  # makedirs meeting a prune: too
                continue
        self._make_parents(parent)
        return open(part, "xb")

    def _make_parents(self, parent: str) -> None:
        missing: list[str] = []
        current = parent
        while current != self.root and not os.path.isdir(current):
            missing.append(current)
            current = os.path.dirname(current)
        if not missing:
            return
        os.makedirs(parent, exist_ok=True)
        # A new directory's entry lives in its parent: sync each parent, top down.
        for directory in reversed(missing):
            _fsync_dir(os.path.dirname(directory))

    def get(self, key: str) -> bytes:
        path = self._path(key)
        try:
            with open(path, "rb") as src:
                return src.read()
        except _MISSING:
            raise NotFound(key) from None
        except OSError as exc:
            raise StorageError(f"cannot read {key!r} under {self.root}: {exc}") from exc

    def head(self, key: str) -> ObjectInfo | None:
        path = self._path(key)
        try:
            st = os.stat(path)
        except _MISSING:
            return None
        except OSError as exc:
            raise StorageError(f"cannot stat {key!r} under {self.root}: {exc}") from exc
        if not stat.S_ISREG(st.st_mode):
            return None
        return ObjectInfo(key=key, size=st.st_size)

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        validate_prefix(prefix)
        # A missing subdirectory is an empty listing; a missing root is a broken disk.
        if not os.path.isdir(self.root):
            raise StorageError(f"storage root {self.root} is not a directory")
        # Walk only the deepest directory the prefix names; the rest cannot match.
        start = os.path.join(self.root, prefix.rpartition("/")[0])
        found: dict[str, int] = {}
        try:
            for dirpath, dirnames, filenames in os.walk(start, onerror=_raise_unless_missing):
                rel = os.path.relpath(dirpath, self.root)
                base = "" if rel == "." else rel + "/"
                dirnames[:] = [d for d in dirnames if (base + d + "/").startswith(prefix)]
                for name in filenames:
                    key = base + name
                    if name.endswith(PART_SUFFIX) or not key.startswith(prefix):
                        continue
                    with contextlib.suppress(FileNotFoundError):  # deleted meanwhile
                        found[key] = os.stat(os.path.join(dirpath, name)).st_size
        except OSError as exc:
            raise StorageError(f"cannot list {prefix!r} under {self.root}: {exc}") from exc
        return iter([ObjectInfo(key=key, size=found[key]) for key in sorted(found)])

    def delete(self, key: str) -> None:
        # No directory fsync: a delete lost in a crash leaves an orphan nothing refers to.
        path = self._path(key)
        try:
            os.unlink(path)
        except _MISSING:
            pass
        except OSError as exc:
            raise StorageError(f"cannot delete {key!r} under {self.root}: {exc}") from exc
        self._prune(os.path.dirname(path))

    def _prune(self, directory: str) -> None:
        """Remove the directories a delete left empty, up to the root: their names (a
        project, a box, a date) are data too, and a purged project leaves none behind. A
        put racing with this recreates its directory (``_publish``)."""
        while directory.startswith(self.root + os.sep):
            try:
                os.rmdir(directory)
            except OSError:  # not empty, or gone: the ones above are not empty either
                return
            directory = os.path.dirname(directory)

    def check(self) -> None:
        try:
            # An unnamed temporary file proves the root is a writable directory, leaving nothing.
            with tempfile.TemporaryFile(dir=self.root):
                pass
        except OSError as exc:
            raise StorageError(f"storage root {self.root} is not writable: {exc}") from exc

    def arrow_filesystem(self) -> pyarrow.fs.FileSystem:
        return self._arrow

    def arrow_path(self, key: str) -> str:
        return self._path(key)

    def local_path(self, key: str) -> str | None:
        return self._path(key)

    def recover(self) -> None:
        try:
            for dirpath, _, filenames in os.walk(self.root, onerror=_raise_unless_missing):
                for name in filenames:
                    if name.endswith(PART_SUFFIX):
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(os.path.join(dirpath, name))
        except OSError as exc:
            raise StorageError(f"cannot clean up {self.root}: {exc}") from exc

    def close(self) -> None:
        pass


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _raise_unless_missing(exc: OSError) -> None:
    if not isinstance(exc, FileNotFoundError | NotADirectoryError):
        raise exc
