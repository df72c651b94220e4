"""Where the tests find the repository's files, whichever folder a test module is in."""

from __future__ import annotations

from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parent.parent
MANIFESTS: Final = ROOT / "tests" / "manifests"
EXAMPLES: Final = ROOT / "policies" / "examples"
