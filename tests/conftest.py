"""Shared fixtures: manifests as users write them, and the bundled policies."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
