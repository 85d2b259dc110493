"""The storage protocol every backend implements, its errors, and the key rules."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

import msgspec

if TYPE_CHECKING:
    import pyarrow.fs

# In-flight local writes end with this suffix; such keys would be hidden and swept at start.
PART_SUFFIX = ".part"


class StorageError(Exception):
    """The backend failed or cannot be reached."""


class NotFound(StorageError):
    """No object has this key."""


class ObjectInfo(msgspec.Struct, frozen=True, kw_only=True):
    key: str
    size: int


class Storage(Protocol):
    def put(self, key: str, data: bytes) -> None:
        """Store ``data``; on return it is durable and readers never saw a partial object."""

    def put_file(self, key: str, path: str) -> None:
        """Like :meth:`put`, from a local file (which is left in place)."""

    def get(self, key: str) -> bytes:
        """The object's bytes; raises :class:`NotFound`."""

    def head(self, key: str) -> ObjectInfo | None: ...

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        """Every object whose key starts with ``prefix`` (not only at a ``/``), sorted by key."""

    def delete(self, key: str) -> None:
        """Remove the object; a missing one is not an error."""

    def check(self) -> None:
        """Cheap reachability check for readiness; raises :class:`StorageError`."""

    def arrow_filesystem(self) -> pyarrow.fs.FileSystem: ...

    def arrow_path(self, key: str) -> str:
        """The path of ``key`` within :meth:`arrow_filesystem`."""

    def local_path(self, key: str) -> str | None:
        """Absolute path of ``key`` on local disk; None when objects are not local files."""

    def recover(self) -> None:
        """Called once at start, before any write: clean up what a crash left behind."""

    def close(self) -> None: ...


def validate_key(key: str) -> str:
    """Return ``key`` if it is a clean relative ``/``-separated key, else raise ValueError."""
    validate_prefix(key)
    segments = key.split("/")
    if not key or "" in segments:
        raise ValueError(f"storage key has an empty segment: {key!r}")
    if key.endswith(PART_SUFFIX):
        raise ValueError(f"storage key must not end with {PART_SUFFIX!r}: {key!r}")
    return key


def validate_prefix(prefix: str) -> str:
    """Like :func:`validate_key`, but empty and trailing-``/`` prefixes are allowed."""
    if prefix.startswith("/") or "\\" in prefix or "\0" in prefix:
        raise ValueError(f"storage key must be relative, without backslash or NUL: {prefix!r}")
    if any(segment in (".", "..") for segment in prefix.split("/")):
        raise ValueError(f"storage key must not contain '.' or '..' segments: {prefix!r}")
    return prefix
