"""Known ingest keys are served from memory, bounded in time (``tenancy.tenants``): a key
confirmed over ``KEY_REFRESH_S`` ago is still served and read again in a thread; one not
confirmed for ``KEY_TRUST_S`` is looked up as a new key is, so it needs the catalog."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from metadata.db import MetadataUnavailable
from metadata.sqlite import open_db
from tenancy import tenants as tenancy_module
from tenancy.tenants import KEY_REFRESH_S, KEY_TRUST_S, Tenancy


def test_a_stale_key_is_served_and_confirmed_again_then_distrusted_past_its_bound(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = open_db(tmp_path / "meta.sqlite")
    tenancy = Tenancy(db)
    project = tenancy.create_project(tenancy.ensure_tenant("t"), "p", ["*"])
    key = project.ingest_key
    # Confirmed a while ago: served at once, and a thread reads it again.
    tenancy._confirmed[project.id] = time.monotonic() - KEY_REFRESH_S - 1
    assert tenancy.project_by_ingest_key(key) == project
    assert tenancy._refresher is not None
    tenancy._refresher.join(5)
    assert time.monotonic() - tenancy._confirmed[project.id] < KEY_REFRESH_S
    # Not confirmed for KEY_TRUST_S, and the catalog out of reach: not served from memory.
    tenancy._confirmed[project.id] = time.monotonic() - KEY_TRUST_S - 1

    def out(*_: object) -> None:
        raise MetadataUnavailable("test: the catalog is out")

    monkeypatch.setattr(tenancy, "_select", out)
    with pytest.raises(MetadataUnavailable):
        tenancy.project_by_ingest_key(key)
    monkeypatch.undo()
    assert tenancy.project_by_ingest_key(key) == project  # looked up again, and remembered
    assert tenancy_module.KEY_TRUST_S > tenancy_module.KEY_REFRESH_S
    tenancy._refresher.join(5)  # the read the last lookup started, before the file closes
    db.close()
