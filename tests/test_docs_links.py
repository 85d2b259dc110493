"""Every relative link in README.md and docs/*.md resolves: the file exists, and a
``#fragment`` names a heading of the Markdown file it points into (slugged as GitHub
slugs headings). A page moved or a heading renamed fails here, not in a reader's hands."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^()\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def anchors(page: Path) -> set[str]:
    """The fragments GitHub gives the page's headings (a repeated one gets -1, -2, ...)."""
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6} (.+)$", FENCE.sub("", page.read_text()), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def links(page: Path) -> list[str]:
    return [target for target in LINK.findall(FENCE.sub("", page.read_text()))
            if not re.match(r"[a-z][a-z0-9+.-]*:", target)]  # http:, mailto:, ...


def test_the_slugs_are_github_s() -> None:
    page = REPO / "docs" / "cluster.md"
    assert "one-node-cut-from-one-engine" in anchors(page)


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(REPO).as_posix() for p in PAGES])
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in links(page):
        path, _, fragment = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no file {file.relative_to(REPO)}")
        elif fragment and file.suffix == ".md" and fragment not in anchors(file):
            broken.append(f"{target}: no heading #{fragment} in {file.relative_to(REPO)}")
    assert not broken, f"{page.relative_to(REPO)}:\n" + "\n".join(broken)


def test_no_page_links_out_of_the_repository() -> None:
    outside = [f"{page.relative_to(REPO)}: {target}" for page in PAGES
               for target in links(page)
               if not (page.parent / target.partition("#")[0]).resolve().is_relative_to(REPO)]
    assert not outside, "\n".join(outside)
