"""The CEL builder: its printer, literals, whitespace class and bindings."""

from __future__ import annotations

import json
import re
import unicodedata

from hypothesis import given
from hypothesis import strategies as st

from webhook.render.cel import SPACE, TEXT_WIDTH, literal, printed, text, tokens, unbind


def test_what_fits_is_left_as_written() -> None:
    assert printed("a && (b || c)") == "a && (b || c)"
    assert printed('x.matches("^ a  b $")') == 'x.matches("^ a  b $")'


def test_the_lowest_operator_breaks_first_and_leads_its_line() -> None:
    condition = " || ".join(f"variables.name{i} in variables.list{i}" for i in range(6))
    lines = printed(f"{condition} ? 'yes' : 'no'", width=60).splitlines()
    assert lines[0] == "variables.name0 in variables.list0"
    assert lines[1:6] == [f"|| variables.name{i} in variables.list{i}" for i in range(1, 6)]
    assert lines[6:] == ["? 'yes'", ": 'no'"]


def test_a_bracket_that_does_not_fit_opens_with_its_parts_indented() -> None:
    body = " && ".join(f"has(c.field{i})" for i in range(8))
    lines = printed(f"variables.containers.exists(c, {body})", width=40).splitlines()
    # The macro's name stays beside the bracket; the close lines up with the opener.
    assert lines[0] == "variables.containers.exists(c,"
    assert lines[1:-1] == ["  has(c.field0)", *(f"  && has(c.field{i})" for i in range(1, 8))]
    assert lines[-1] == ")"


def test_a_list_fills_its_lines() -> None:
    names = [f"nvidia.com/resource-{i}" for i in range(6)]
    lines = printed(f"r in {json.dumps(names)}", width=60).splitlines()
    assert lines[0] == "r in ["
    assert lines[-1] == "]"
    assert all(len(line) <= 60 for line in lines)
    assert len(lines) == 5


def test_string_literals_are_never_broken() -> None:
    tricky = '"a || b ( c" + \'d, e ? f : g\' + "\\" && ("'
    expression = " && ".join([f"x{i}.startsWith({tricky})" for i in range(4)])
    out = printed(expression, width=30)
    assert tokens(out) == tokens(expression)
    assert '"a || b ( c"' in out and "'d, e ? f : g'" in out and '"\\" && ("' in out


# Expressions of the shapes the builder writes: calls, macros, lists, maps, indexes,
# operators of every precedence, strings with brackets and operators in them.
_LEAVES = st.sampled_from(
    ["a", "b.c", "size(x)", "'(|| '", '"a, b"', "1", "[]", "{}", "'?:'", "variables.name"]
)


def _combined(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.tuples(children, st.sampled_from([" && ", " || ", " == ", " + ", " in "]), children).map(
            "".join
        ),
        st.tuples(children, children, children).map(lambda t: f"{t[0]} ? {t[1]} : {t[2]}"),
        st.lists(children, min_size=1, max_size=4).map(lambda xs: f"f({', '.join(xs)})"),
        st.tuples(children, children).map(lambda t: f"{t[0]}.exists(e, {t[1]})"),
        st.lists(children, max_size=4).map(lambda xs: "[" + ", ".join(xs) + "]"),
        st.tuples(children, children).map(lambda t: "{" + f"{t[0]}: {t[1]}" + "}"),
        children.map(lambda x: f"!({x})"),
        st.tuples(children, children).map(lambda t: f"{t[0]}[{t[1]}]"),
    )


@given(st.recursive(_LEAVES, _combined, max_leaves=40), st.integers(min_value=10, max_value=80))
def test_printing_keeps_every_token_and_settles(expression: str, width: int) -> None:
    out = printed(expression, width=width)
    assert tokens(out) == tokens(expression)
    assert printed(out, width=width) == out
    assert all(line == line.rstrip() for line in out.splitlines())


def test_literals_stay_ascii() -> None:
    assert literal("\u2026") == '"\\u2026"'
    assert literal("\U0001f600") == '"\\U0001f600"'
    assert literal("a\nb") == '"a\\nb"'


def _value(cel: str) -> str:
    """The string a concatenation of JSON-escaped literals (what :func:`text` writes)."""
    return "".join(json.loads(piece) for piece in re.findall(r'"(?:\\.|[^"\\])*"', cel))


def test_a_long_text_breaks_into_pieces_that_spell_it() -> None:
    short = "remove it"
    assert text(short) == literal(short)
    long = "a message " * 30 + "\u2026 done"
    cel = text(long)
    assert cel.startswith("(") and cel.endswith(")")
    assert _value(cel) == long
    assert all(len(piece) <= TEXT_WIDTH + 2 for piece in re.findall(r'"[^"]*"', cel))


def test_the_space_class_is_what_python_strips() -> None:
    """Every character str.strip() drops, by range or as one of Unicode's separators (\\pZ),
    and none other."""
    body = SPACE[1:-1]
    assert body.endswith("\\pZ")
    listed: set[int] = set()
    for low, high in re.findall(r"\\x\{([0-9a-f]+)\}(?:-\\x\{([0-9a-f]+)\})?", body):
        listed.update(range(int(low, 16), int(high or low, 16) + 1))
    separators = {c for c in range(0x110000) if unicodedata.category(chr(c)).startswith("Z")}
    spaces = {c for c in range(0x110000) if chr(c).isspace()}
    assert listed | separators == spaces
    assert not listed & separators


def test_a_binding_is_a_one_element_map() -> None:
    assert unbind("cel.bind(x, a.b, x + 1)") == "[a.b].map(x, x + 1)[0]"


def test_bindings_nest_in_value_and_body() -> None:
    assert unbind("cel.bind(x, cel.bind(y, 1, y), cel.bind(z, x, [x, z]))") == (
        "[[1].map(y, y)[0]].map(x, [x].map(z, [x, z])[0])[0]"
    )


def test_commas_and_brackets_in_strings_and_calls_stay_in_their_argument() -> None:
    expression = "f(cel.bind(s, 'a, (b' + \"c]\\\"\", g(s, {'k': [1, 2]})), cel.bind(t, 2, t))"
    assert unbind(expression) == (
        "f(['a, (b' + \"c]\\\"\"].map(s, g(s, {'k': [1, 2]}))[0], [2].map(t, t)[0])"
    )


def test_text_without_a_binding_is_left_as_it_is() -> None:
    expression = "a.exists(c, c.name == 'cel.bind') && b"
    assert unbind(expression) == expression
