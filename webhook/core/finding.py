"""A finding: a rule id and a message that says what to change, before the policy acts.

Messages quote user-supplied values (env values, annotation values, quantities, the
names of schedulers and nodes) through :func:`quoted`, so each finding also knows its
``redacted`` text: the same sentence with those values replaced by ``"…"``, fit for
audit logs that must not hold what a user typed into an env var.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Final

# Delimiters no message contains on its own; stripped from the values they wrap.
_OPEN: Final = "\x1e"
_CLOSE: Final = "\x1f"
_VALUE: Final = re.compile(f"{_OPEN}[^{_CLOSE}]*{_CLOSE}")
# What stands for a user's value in redacted text.
HIDDEN: Final = "\u2026"
_MARKS: Final = str.maketrans({_OPEN: '"', _CLOSE: '"'})
_STRIP: Final = str.maketrans({_OPEN: None, _CLOSE: None})


def quoted(value: object) -> str:
    """``value`` in double quotes, marked as user-supplied for :attr:`Finding.redacted`."""
    return f"{_OPEN}{str(value).translate(_STRIP)}{_CLOSE}"


def shown(text: str) -> str:
    """Text with :func:`quoted` marks turned into plain double quotes."""
    return text.translate(_MARKS) if _OPEN in text else text


def redacted(text: str) -> str:
    """Text with every :func:`quoted` value replaced by ``"…"``."""
    return _VALUE.sub(f'"{HIDDEN}"', text) if _OPEN in text else text


@dataclass(slots=True)
class Finding:
    """A finding about a request, before the policy turns it into a violation."""

    rule: str
    message: str
    redacted: str = field(init=False)

    def __post_init__(self) -> None:
        self.redacted = redacted(self.message)
        self.message = shown(self.message)
