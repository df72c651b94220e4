"""Policy files: the bundled default policy and policy files on disk.

The decision core parses text (:func:`webhook.core.policy.parse_policy`); reading
files is done here, at the edge, for the service, the CLI and the tests alike.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Final

from webhook.core.policy import Policy, PolicyError
from webhook.core.policy import parse_policy as _parse

DEFAULT_SOURCE: Final = "webhook/policies/default.yaml"


def _bundled_default() -> Policy:
    text = resources.files(__name__).joinpath("default.yaml").read_text("utf-8")
    return _parse(text, base=None, source=DEFAULT_SOURCE)


DEFAULT_POLICY: Final = _bundled_default()


def parse_policy(text: str, *, source: str = "<policy>") -> Policy:
    """A policy from YAML text; what it leaves out comes from the bundled default."""
    return _parse(text, base=DEFAULT_POLICY, source=source)


def load_policy(path: str | Path | None) -> Policy:
    """Load a policy file, or the bundled default when ``path`` is None."""
    if path is None:
        return DEFAULT_POLICY
    source = str(path)
    try:
        text = Path(path).read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyError(source, [f"cannot read: {exc}"]) from None
    return parse_policy(text, source=source)


__all__ = ["DEFAULT_POLICY", "Policy", "PolicyError", "load_policy", "parse_policy"]
