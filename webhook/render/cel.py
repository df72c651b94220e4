"""The CEL builder: literals, lists, globs as RE2, the whitespace class, has-guarded reads,
and bindings written for an apiserver whose CEL has no ``cel.bind``.

Knows nothing of pods or policies: text in, CEL text out.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final


# What Python's str.strip() drops (str.isspace()), which the core strips from env and
# annotation values. CEL's trim() keeps \x1c-\x1f, so values are matched with this class
# around the words instead of trimmed.
def _ranges(codes: Iterable[int]) -> str:
    """An RE2 class body of ``codes`` (ascending), runs as ranges."""
    runs: list[list[int]] = []
    for code in codes:
        if runs and runs[-1][1] == code - 1:
            runs[-1][1] = code
        else:
            runs.append([code, code])
    return "".join(
        f"\\x{{{low:x}}}" + (f"-\\x{{{high:x}}}" if high > low else "") for low, high in runs
    )


SPACE: Final = "[" + _ranges(code for code in range(0x3001) if chr(code).isspace()) + "]"


def stripped_in(value: str, words: Iterable[str]) -> str:
    """``value.strip().lower() in words`` (ASCII case: no other letter lowers to one of
    the words, all ASCII letters, digits and dashes)."""
    alternatives = "|".join("".join(c if c.isalnum() else "\\" + c for c in w) for w in words)
    regex = f"^{SPACE}*(?:{alternatives}){SPACE}*$"
    return f"{value}.lowerAscii().matches({literal(regex)})"


def strings(items: Iterable[str]) -> str:
    return "[" + ", ".join(literal(item) for item in items) + "]"


def glob_regex(pattern: str) -> str:
    """An RE2 regular expression (anchored) that matches what fnmatch's ``pattern`` matches.

    ``*`` any text, ``?`` one character, ``[...]`` a set (``[!...]`` negated); a ``[``
    without its ``]`` is literal, as in fnmatch.
    """
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        i += 1
        if c == "*":
            out.append(".*")
        elif c == "?":
            out.append(".")
        elif c == "[":
            j = i
            if j < n and pattern[j] == "!":
                j += 1
            if j < n and pattern[j] == "]":
                j += 1
            while j < n and pattern[j] != "]":
                j += 1
            if j >= n:
                out.append(r"\[")
                continue
            body = pattern[i:j]
            i = j + 1
            negate = body.startswith("!")
            if negate:
                body = body[1:]
            out.append(_glob_set(body, negate=negate))
        else:
            out.append("\\" + c if not (c.isalnum() or c == "_") and c.isascii() else c)
    return "(?s)^" + "".join(out) + "$"


def _glob_set(body: str, *, negate: bool) -> str:
    """A fnmatch set ``[body]`` as an RE2 class: ``a-z`` ranges (a reversed one matches
    nothing, as fnmatch drops it), every other character literal."""
    items: list[str] = []
    k = 0
    while k < len(body):
        if k + 2 < len(body) and body[k + 1] == "-":
            low, high = ord(body[k]), ord(body[k + 2])
            if low <= high:
                items.append(f"\\x{{{low:x}}}-\\x{{{high:x}}}")
            k += 3
        else:
            items.append(f"\\x{{{ord(body[k]):x}}}")
            k += 1
    if not items:
        # Nothing in the set: a negated one matches any character, else none does.
        return "." if negate else "[^\\x{0}-\\x{10ffff}]"
    return ("[^" if negate else "[") + "".join(items) + "]"


def glob_test(value: str, patterns: Iterable[str]) -> str:
    """``value`` (a CEL string) matches one of ``patterns`` as the core's match_any does."""
    exact = sorted({p for p in patterns if not any(ch in p for ch in "*?[")})
    globs = sorted({p for p in patterns if any(ch in p for ch in "*?[")})
    terms = []
    if exact:
        terms.append(f"{value} in {strings(exact)}")
    terms.extend(f"{value}.matches({literal(glob_regex(p))})" for p in globs)
    return " || ".join(terms) or "false"


def guarded(root: str, path: Iterable[str]) -> str:
    """``root.<path>`` when every step exists, else an empty map."""
    guards = []
    node = root
    for part in path:
        node = f"{node}.{part}"
        guards.append(f"has({node})")
    return f"({' && '.join(guards)} ? {node} : {{}})"


# Non-ASCII letters that upper-case to ASCII ones (Python's str.upper(), as Go's
# strings.ToUpper the runtimes use on capability names): CEL has only upperAscii().
_UPPER_TO_ASCII: Final = (("\u0131", "i"), ("\u017f", "s"))


def upper(value: str) -> str:
    for letter, ascii_letter in _UPPER_TO_ASCII:
        value = f"{value}.replace({literal(letter)}, {literal(ascii_letter)})"
    return f"{value}.upperAscii()"


def ints(values: Iterable[int]) -> str:
    return "[" + ", ".join(str(v) for v in values) + "]"


def cel_value(value: Any) -> str:
    """A CEL literal of the JSON value ``value`` (maps, lists, strings, numbers, booleans,
    null): what the apiserver's view of an object holds, for ``==`` and ``in``."""
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{literal(str(k))}: {cel_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(cel_value(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, int | float):
        return repr(value)
    return literal(str(value))


def _split_args(text: str, start: int) -> tuple[list[str], int]:
    """The top-level comma-separated arguments of the call whose ``(`` is at ``start``,
    and the index after its ``)``."""
    args, depth, i, begin, quote = [], 0, start + 1, start + 1, ""
    while True:
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            if depth == 0:
                args.append(text[begin:i].strip())
                return args, i + 1
            depth -= 1
        elif ch == "," and depth == 0:
            args.append(text[begin:i].strip())
            begin = i + 1
        i += 1


def unbind(expression: str) -> str:
    """``cel.bind(x, value, body)`` written as ``[value].map(x, body)[0]``: the
    apiserver's CEL environment has no bindings library, and one element mapped binds
    a name all the same (``value`` is evaluated once)."""
    marker = "cel.bind("
    at = expression.find(marker)
    while at != -1:
        (name, value, body), end = _split_args(expression, at + len(marker) - 1)
        replaced = f"[{unbind(value)}].map({name}, {unbind(body)})[0]"
        expression = expression[:at] + replaced + expression[end:]
        at = expression.find(marker, at + len(replaced))
    return expression


def literal(text: str) -> str:
    """A CEL string literal of ``text``.

    JSON's escapes are CEL's, bar ``\\/`` (json.dumps never writes it); non-ASCII
    stays literal because CEL refuses the surrogate pairs ``ensure_ascii`` would write.
    """
    return json.dumps(text, ensure_ascii=False)


def any_of(terms: Sequence[str], *, joiner: str = " || ") -> str:
    return joiner.join(f"({term})" for term in terms) if terms else "false"
