"""The quantity parser against the kubernetes client's parser as an oracle."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes.utils.quantity import parse_quantity

from webhook.core.quantity import parse

NUMBERS = st.from_regex(r"[+-]?([0-9]{1,12}(\.[0-9]{0,6})?|\.[0-9]{1,6})", fullmatch=True)
SUFFIXES = st.sampled_from(
    ["", "n", "u", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]
) | st.from_regex(r"[eE][+-]?[0-9]{1,2}", fullmatch=True)


@settings(max_examples=500, deadline=None)
@given(number=NUMBERS, suffix=SUFFIXES)
def test_agrees_with_the_kubernetes_client(number: str, suffix: str) -> None:
    text = number + suffix
    parsed = parse(text)
    assert parsed is not None
    assert parsed.value == parse_quantity(text)  # type: ignore[no-untyped-call]


@pytest.mark.parametrize(
    ("text", "value", "binary"),
    [
        ("3k", Decimal(3000), False),
        ("3Gi", Decimal(3 << 30), True),
        ("500m", Decimal("0.5"), False),
    ],
)
def test_examples(text: str, value: Decimal, binary: bool) -> None:
    parsed = parse(text)
    assert parsed is not None
    assert parsed.value == value
    assert parsed.binary is binary


@pytest.mark.parametrize(
    "text",
    [
        "",
        "abc",
        "1_000",
        "NaN",
        "Infinity",
        " 3",
        "3 ",
        "3000\n",
        "1e",
        "3ki",
        "3KiB",
        "1e99999999999",
    ],
)
def test_not_quantities(text: str) -> None:
    assert parse(text) is None
