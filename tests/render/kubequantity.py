"""Kubernetes' ``resource.Quantity`` as kube-apiserver parses, compares and prints it.

A stand-in for Go code that cannot run here: what the apiserver writes for a quantity
before admission (its canonical text) and what the CEL quantity library answers on it.
It answers as kubernetes/kubernetes staging/src/k8s.io/apimachinery/pkg/api/resource does
at v1.36.3 (apimachinery v0.36.3, the version the e2e kube-apiserver is built from):

- :func:`parse` is ``ParseQuantity`` (quantity.go:278-389) with ``parseQuantityString``
  (quantity.go:161-275) and the suffixes of suffix.go:88-198: the int64 fast path
  (value and scale) where it applies, the exact decimal otherwise, rounded up to 1n and
  capped at 2^63-1 for binary suffixes; and whether it keeps the text as written.
- :meth:`Quantity.text` is ``String``/``MarshalJSON`` (quantity.go:680-725) through
  ``CanonicalizeBytes`` (quantity.go:425-459) and amount.go's ``AsCanonicalBytes`` and
  ``AsCanonicalBase1024Bytes`` (amount.go:257-299, 312-339).
- :meth:`Quantity.as_int64` is ``AsInt64`` (quantity.go:517-523, amount.go:78-88): only
  the fast path with a scale of at least 0 answers; ``1000m`` does not, though it is 1.
- :func:`decode` is ``UnmarshalJSON`` (quantity.go:733-752): null is zero, and the JSON
  text of a number or the inside of a string is trimmed (Go's ``strings.TrimSpace``).

Values with exponents beyond :data:`EXPONENT_LIMIT` raise :class:`Unmodelled`: nothing
here follows where Go's int32 scales overflow.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Final

import orjson

INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1
# ParseQuantity's precision budget for the fast path (math.go:28, maxInt64Factors).
_MAX_INT64_FACTORS: Final = 18
_NANO: Final = -9
EXPONENT_LIMIT: Final = 400

_DECIMAL: Final = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12}
_DECIMAL_MORE: Final = {"P": 15, "E": 18}
_BINARY: Final = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL_SUFFIX: Final = {v: k for k, v in {**_DECIMAL, **_DECIMAL_MORE}.items()}
_BINARY_SUFFIX: Final = {v: k for k, v in _BINARY.items()}
_SUFFIX_CHARS: Final = frozenset("eEinumkKMGTP")
# Go's unicode.IsSpace (strings.TrimSpace): the Latin-1 spaces and White_Space.
_GO_SPACE: Final = "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
_EXPONENT: Final = re.compile(r"[+-]?[0-9]+")


class Unmodelled(ValueError):
    """A quantity this stand-in does not follow Go on (exponents beyond its limit)."""


@dataclass(frozen=True)
class Quantity:
    """A parsed quantity: its exact value, its format, Go's int64 form when the fast
    path took it, and the text as written when Go keeps it."""

    value: Fraction
    format: str
    fast: tuple[int, int] | None
    kept: str | None

    def as_int64(self) -> int | None:
        """``AsInt64``: the value where the fast path holds it at a scale >= 0, else None."""
        if self.fast is None:
            return None
        value, scale = self.fast
        if scale < 0:
            return None
        result = value * 10**scale
        return result if INT64_MIN <= result <= INT64_MAX else None

    def cmp(self, other: Quantity) -> int:
        """``Cmp``: exact, whatever the forms."""
        return (self.value > other.value) - (self.value < other.value)

    def text(self) -> str:
        """``String``: the text kept as written, else the canonical form."""
        if self.kept is not None:
            return self.kept
        if self.value == 0:
            return "0"
        number = self.value
        form = self.format
        if form == "BinarySI":
            if -1024 < number < 1024 or number.denominator != 1:
                form = "DecimalSI"
            else:
                mantissa, times = _remove_factors(int(number), 1024)
                return str(mantissa) + _BINARY_SUFFIX.get(times * 10, "")
        if form not in ("DecimalSI", "DecimalExponent"):
            form = "DecimalExponent"
        mantissa, exponent = _decimal_digits(number)
        while exponent % 3:
            mantissa *= 10
            exponent -= 1
        if form == "DecimalExponent":
            return str(mantissa) + (f"e{exponent}" if exponent else "")
        # Go emits no suffix for an exponent outside its table (suffix.go:74-86).
        return str(mantissa) + _DECIMAL_SUFFIX.get(exponent, "")


def _remove_factors(value: int, base: int) -> tuple[int, int]:
    """math.go's removeInt64Factors: ``value`` without its factors of ``base``."""
    sign = -1 if value < 0 else 1
    value = abs(value)
    times = 0
    while value >= base and value % base == 0:
        value //= base
        times += 1
    return sign * value, times


def _decimal_digits(number: Fraction) -> tuple[int, int]:
    """``number`` (a multiple of 10^-9 here) as mantissa * 10^exponent, no factor of 10
    left in the mantissa."""
    exponent = 0
    while number.denominator != 1:
        number *= 10
        exponent -= 1
    mantissa, times = _remove_factors(int(number), 10)
    return mantissa, exponent + times


def _split(text: str) -> tuple[bool, str, str, str, str] | None:
    """parseQuantityString: (positive, value, numerator, denominator, suffix), or None."""
    positive = True
    pos = 0
    end = len(text)
    if pos < end and text[0] in "+-":
        positive = text[0] != "-"
        pos += 1
    while pos < end and text[pos] == "0":
        pos += 1
    if pos >= end:
        return positive, "0", "0", "", ""
    start = pos
    while pos < end and text[pos].isascii() and text[pos].isdigit():
        pos += 1
    if pos >= end:
        return positive, text, text[start:], "", ""
    numerator = text[start:pos] or "0"
    denominator = ""
    if text[pos] == ".":
        pos += 1
        begin = pos
        while pos < end and text[pos].isascii() and text[pos].isdigit():
            pos += 1
        denominator = text[begin:pos]
        if pos >= end:
            return positive, text, numerator, denominator, ""
    value = text[:pos]
    suffix_start = pos
    while pos < end and text[pos] in _SUFFIX_CHARS:
        pos += 1
    if pos < end and text[pos] in "+-":
        pos += 1
    while pos < end and text[pos].isascii() and text[pos].isdigit():
        pos += 1
    if pos < end:
        return None
    return positive, value, numerator, denominator, text[suffix_start:]


def _interpret(suffix: str) -> tuple[int, int, str] | None:
    """suffix.go's interpret: (base, exponent, format), or None."""
    if suffix in _DECIMAL or suffix in _DECIMAL_MORE:
        return 10, {**_DECIMAL, **_DECIMAL_MORE}[suffix], "DecimalSI"
    if suffix in _BINARY:
        return 2, _BINARY[suffix], "BinarySI"
    if len(suffix) > 1 and suffix[0] in "eE" and _EXPONENT.fullmatch(suffix[1:]):
        exponent = int(suffix[1:])
        if not INT64_MIN <= exponent <= INT64_MAX:
            return None
        # Go keeps the low 32 bits (int32(parsed)).
        exponent = (exponent + 2**31) % 2**32 - 2**31
        return 10, exponent, "DecimalExponent"
    return None


def parse(text: str) -> Quantity | None:
    """``ParseQuantity``: the quantity ``text`` denotes, or None where Go errs."""
    if not text:
        return None
    if text == "0":
        return Quantity(Fraction(0), "DecimalSI", (0, 0), "0")
    split = _split(text)
    if split is None:
        return None
    positive, value, numerator, denominator, suffix = split
    interpreted = _interpret(suffix)
    if interpreted is None:
        return None
    base, exponent, form = interpreted
    if abs(exponent) > EXPONENT_LIMIT:
        raise Unmodelled(text)
    scale = 0
    mantissa = 1
    if form == "BinarySI":
        if exponent >= 0 and not denominator:
            mantissa = 1 << exponent
            precision = 15 - len(numerator) - int(exponent * 3 / 10) - 1
        else:
            precision = -1
    else:
        scale = exponent
        precision = _MAX_INT64_FACTORS - (len(numerator) + len(denominator))
    if precision >= 0:
        scale -= len(denominator)
        if scale >= _NANO:
            shifted = numerator + denominator
            digits = int(shifted)
            if digits > INT64_MAX:
                return None
            result = digits * mantissa
            if result <= INT64_MAX:
                result = result if positive else -result
                exact = Fraction(result) * Fraction(10) ** scale
                kept: str | None = None
                if form == "BinarySI":
                    if exponent % 10 == 0 and digits & 0x07:
                        kept = text
                elif scale % 3 == 0 and not shifted.endswith("000") and shifted[0] != "0":
                    kept = text
                return Quantity(exact, form, (result, scale), kept)
    if value.startswith((".", "+.", "-.")) or value.endswith("."):
        # inf.Dec's SetString on these is not followed here.
        raise Unmodelled(text)
    amount = Fraction(value)
    amount = amount * Fraction(base) ** exponent
    sign = -1 if amount < 0 else 1
    amount = abs(amount)
    if amount != 0:
        # Rounded up to 1n (inf.RoundUp: away from zero, the sign is off here).
        nanos = amount * 10**9
        whole = -(-nanos.numerator // nanos.denominator)
        amount = Fraction(whole, 10**9)
    if form == "BinarySI" and amount > INT64_MAX:
        amount = Fraction(INT64_MAX)
    if form == "BinarySI" and 0 < amount < 1:
        form = "DecimalSI"
    return Quantity(sign * amount, form, None, None)


def decode(raw: Any) -> Quantity | None:
    """``UnmarshalJSON`` of the JSON value ``raw``: None where the apiserver refuses it."""
    if raw is None:
        return Quantity(Fraction(0), "", (0, 0), None)
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int):
        return parse(str(raw))
    if isinstance(raw, float):
        # As the tests send it: orjson writes NaN and the infinities as null.
        text = orjson.dumps(raw).decode()
        return decode(None) if text == "null" else parse(text)
    if isinstance(raw, str):
        return parse(raw.strip(_GO_SPACE))
    return None
