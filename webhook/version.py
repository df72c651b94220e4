"""The version of gpushare-webhook that is running, as ``--version``, ``/healthz`` and the
``gpushare_build_info`` metric report it."""

from __future__ import annotations

import functools
import importlib.metadata
import tomllib
from pathlib import Path
from typing import Final

DISTRIBUTION: Final = "gpushare-webhook"
# Beside the package in a source checkout; absent from an installed wheel.
_PYPROJECT: Final = Path(__file__).resolve().parent.parent / "pyproject.toml"
UNKNOWN: Final = "0+unknown"


@functools.cache
def version() -> str:
    """The installed distribution's version, else the source checkout's pyproject.toml's."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return source_version(_PYPROJECT)


def source_version(pyproject: Path) -> str:
    """``project.version`` of a pyproject.toml, :data:`UNKNOWN` when it cannot be read."""
    try:
        with pyproject.open("rb") as file:
            found = tomllib.load(file)["project"]["version"]
    except (OSError, tomllib.TOMLDecodeError, KeyError, TypeError):
        return UNKNOWN
    return found if isinstance(found, str) else UNKNOWN
