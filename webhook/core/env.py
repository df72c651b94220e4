"""Container environment as the kubelet will see it: literal values, valueFrom, $(VAR)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.core.workload import MAPPINGS


def env_value(entry: Mapping[str, Any]) -> str | None:
    """An env entry's literal value; None when it comes from valueFrom."""
    if "valueFrom" in entry:
        return None
    value = entry.get("value", "")
    return value if isinstance(value, str) else str(value)


def effective_env(container: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """Env entries by name; the last entry of a name wins, as in the kubelet."""
    env = container.get("env")
    if not isinstance(env, list):
        return {}
    return {
        entry["name"]: entry
        for entry in env
        if isinstance(entry, MAPPINGS) and isinstance(entry.get("name"), str)
    }


def opaque(value: str | None) -> bool:
    """A value the kubelet decides: from valueFrom, or with $(VAR) references it expands."""
    return value is None or "$(" in value
