"""The ``<script>`` build of the browser SDK stays within its budget: 4 KB minified + gzipped.

Measured on the file as shipped (``sdk-js/dist/boxtrail.js``, rebuilt from source by the
``sdk_bundle`` fixture) with gzip level 9. ``benchmarks/bench_sdk.py`` puts the figure beside
``@datadog/browser-logs`` and ``@sentry/browser`` bundled the same way.
"""

from __future__ import annotations

import gzip
import re
from pathlib import Path

BUDGET_BYTES = 4096


def test_iife_build_is_at_most_4_kb_minified_and_gzipped(sdk_bundle: Path) -> None:
    shipped = sdk_bundle.read_bytes()
    size = len(gzip.compress(shipped, compresslevel=9, mtime=0))
    assert size <= BUDGET_BYTES, (
        f"dist/boxtrail.js is {size} bytes min+gzip, over the {BUDGET_BYTES}-byte budget: "
        "make room before adding")


def test_iife_build_is_one_minified_file_with_nothing_to_load(sdk_bundle: Path) -> None:
    text = sdk_bundle.read_text()
    assert text.startswith("(()=>{"), "one IIFE"
    assert text.count("\n") <= 3, "minified"
    assert not re.search(r"\bimport\s*[({\"']|\brequire\(", text), "self-contained"
    assert "sourceMappingURL" not in text, "the map sits beside the file, not referenced in it"
    assert "globalThis.boxtrail=" in text, "defines window.boxtrail"
