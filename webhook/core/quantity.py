"""Kubernetes resource quantities (``3k``, ``500m``, ``3Gi``, ``1e3``) as exact decimals.

The grammar and multipliers are those of k8s.io/apimachinery's resource.Quantity.
The kubernetes client has a parser too, but importing it loads the whole client
(~17 MB per process); the tests hold this one to it as an oracle.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, DecimalException
from typing import Final

_GRAMMAR: Final = re.compile(
    r"(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?P<suffix>[eE](?P<exponent>[+-]?[0-9]+)|[KMGTPE]i|[numkMGTPE])?"
)
_MULTIPLIERS: Final = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}


@dataclass(frozen=True, slots=True)
class Quantity:
    value: Decimal
    suffix: str

    @property
    def binary(self) -> bool:
        return self.suffix.endswith("i")


def parse(text: str) -> Quantity | None:
    """The quantity ``text`` denotes, or None when it is not one."""
    match = _GRAMMAR.fullmatch(text)
    if match is None:
        return None
    number = Decimal(match.group("number"))
    suffix = match.group("suffix") or ""
    exponent = match.group("exponent")
    if exponent is not None:
        try:
            return Quantity(number.scaleb(int(exponent)), suffix)
        except (DecimalException, ValueError):
            return None
    return Quantity(number * _MULTIPLIERS[suffix], suffix)
