"""The documentation holds together: every relative link resolves, every anchor exists,
and the front page stays a front page."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.paths import ROOT, documentation_pages

# [text](target) outside code spans; images too.
LINK = re.compile(r"(?<!`)\[[^\]\n]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"```.*?```", re.DOTALL)


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to dashes."""
    found = set()
    for line in page.read_text("utf-8").splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            title = re.sub(r"[^\w\- ]", "", title)
            found.add(title.replace(" ", "-"))
    return found


def links(page: Path) -> list[str]:
    text = FENCE.sub("", page.read_text("utf-8"))
    # Indented code blocks: four spaces after a blank line hold commands, not links.
    text = "\n".join(line for line in text.splitlines() if not line.startswith("    "))
    return LINK.findall(text)


@pytest.mark.parametrize("page", documentation_pages(), ids=lambda p: p.name)
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in links(page):
        if re.match(r"[a-z]+:", target):
            continue  # http:, https:, mailto:
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists() or (
            anchor and resolved.suffix == ".md" and anchor not in anchors(resolved)
        ):
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)}: broken links {broken}"


def test_every_page_is_reachable_from_the_front_page() -> None:
    front = {Path(t.partition("#")[0]).name for t in links(ROOT / "README.md")}
    pages = {p.name for p in documentation_pages()[1:]}
    assert pages <= front, f"not linked from README.md: {sorted(pages - front)}"


def test_the_front_page_is_short_and_installs_early() -> None:
    lines = (ROOT / "README.md").read_text("utf-8").splitlines()
    assert len(lines) <= 300
    install = next(i for i, line in enumerate(lines) if line.startswith("    helm install "))
    assert install < 80
