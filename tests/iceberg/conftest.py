from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from core.storage import LocalStorage
from iceberg.tables import Tables
from metadata.catalog import Catalog
from tests.iceberg.parts import opened


@pytest.fixture
def parts(tmp_path: Path) -> Iterator[tuple[Catalog, Tables, LocalStorage]]:
    """See ``tests.iceberg.parts``."""
    with opened(tmp_path) as parts:
        yield parts
