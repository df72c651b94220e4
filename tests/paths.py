"""Where the tests find the repository's files, whichever folder a test module is in."""

from __future__ import annotations

from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parent.parent
MANIFESTS: Final = ROOT / "tests" / "manifests"
EXAMPLES: Final = ROOT / "policies" / "examples"
DOCS: Final = ROOT / "docs"
DEFAULT_POLICY_FILE: Final = ROOT / "webhook" / "policies" / "default.yaml"


def documentation_pages() -> list[Path]:
    """The README (the front page) and every page under docs/, in that order."""
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def documentation() -> str:
    """Every page's text, the README first: where the runnable examples are found."""
    return "\n".join(page.read_text("utf-8") for page in documentation_pages())
