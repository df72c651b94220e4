"""The CEL builder: literals, lists, globs as RE2, the whitespace class, has-guarded reads,
and bindings written for an apiserver whose CEL has no ``cel.bind``.

Knows nothing of pods or policies: text in, CEL text out.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypedDict


class NamedExpression(TypedDict):
    """A named CEL expression, as a policy's variable and a matchCondition are written on
    the wire."""

    name: str
    expression: str


# What Python's str.strip() drops (str.isspace()), which the core strips from env and
# annotation values. CEL's trim() keeps \x1c-\x1f, so values are matched with this class
# around the words instead of trimmed. Unicode's separators (Zs, Zl, Zp) are all spaces to
# Python, and RE2 names them \pZ from the same Unicode tables (Go's unicode.Z, Unicode 15;
# none has changed since 6.3): the class stays short enough to read on one line.
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


def _is_separator(code: int) -> bool:
    return unicodedata.category(chr(code)).startswith("Z")


SPACE: Final = (
    "[" + _ranges(c for c in range(0x3001) if chr(c).isspace() and not _is_separator(c)) + "\\pZ]"
)


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


def call_args(text: str, start: int) -> tuple[list[str], int]:
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
        (name, value, body), end = call_args(expression, at + len(marker) - 1)
        replaced = f"[{unbind(value)}].map({name}, {unbind(body)})[0]"
        expression = expression[:at] + replaced + expression[end:]
        at = expression.find(marker, at + len(replaced))
    return expression


def literal(text: str) -> str:
    """A CEL string literal of ``text``.

    JSON's escapes are CEL's, bar ``\\/`` (json.dumps never writes it). Past ASCII, CEL's
    own ``\\u``/``\\U`` escapes (never the surrogate pairs ``ensure_ascii`` would write,
    which CEL refuses): the text stays ASCII, which YAML writes as a block.
    """
    return "".join(_escaped(ch) for ch in json.dumps(text, ensure_ascii=False))


def _escaped(ch: str) -> str:
    code = ord(ch)
    if code < 0x7F:
        return ch
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


# How long one piece of a long text is (:func:`text`): a message reads as lines of prose.
TEXT_WIDTH: Final = 72


def text(value: str) -> str:
    """A CEL string of ``value``: its literal, or past :data:`TEXT_WIDTH` characters its
    pieces' literals (each ending after a space), joined with ``+`` in parentheses, so
    that a message breaks into lines as prose does."""
    pieces = [""]
    for word in re.split(r"(?<= )", value):
        if pieces[-1] and len(pieces[-1]) + len(word) > TEXT_WIDTH:
            pieces.append("")
        pieces[-1] += word
    if len(pieces) == 1:
        return literal(value)
    return "(" + " + ".join(literal(piece) for piece in pieces) + ")"


def any_of(terms: Sequence[str], *, joiner: str = " || ") -> str:
    return joiner.join(f"({term})" for term in terms) if terms else "false"


# ------------------------------------------------------------------ the printer

# How wide a printed expression's lines are, before YAML indents them: the generated files
# keep every line under 200 characters, with room for the nesting of a Helm values file.
WIDTH: Final = 100

# What CEL reads as one token where the printer must not break: string literals (with
# their escapes, raw and bytes prefixes, triple quotes), words, two-character operators.
_TOKEN: Final = re.compile(
    r"""(?P<string>(?:[rRbB]{1,2})?(?:'''(?:\\.|[^\\])*?'''|\"\"\"(?:\\.|[^\\])*?\"\"\"
        |'(?:\\.|[^'\\\n])*'|"(?:\\.|[^"\\\n])*"))
      |(?P<word>[A-Za-z0-9_]+)
      |(?P<op>&&|\|\||==|!=|<=|>=|[^\sA-Za-z0-9_])""",
    re.VERBOSE | re.DOTALL,
)

_OPEN: Final = {"(": ")", "[": "]", "{": "}"}

_CLOSE: Final = frozenset(_OPEN.values())


@dataclass(frozen=True, slots=True)
class _Token:
    text: str
    # Whether the builder wrote whitespace before it: a line that fits keeps its spacing.
    spaced: bool


@dataclass(frozen=True, slots=True)
class _Group:
    open: _Token
    items: list[_Item]
    close: _Token


_Item = _Token | _Group


def tokens(expression: str) -> list[str]:
    """The tokens of ``expression``: what the printer keeps, whitespace aside."""
    out = []
    at = 0
    while at < len(expression):
        if expression[at].isspace():
            at += 1
            continue
        match = _TOKEN.match(expression, at)
        if match is None:  # pragma: no cover - the pattern's last branch takes any character
            raise ValueError(f"no CEL token at {at}: {expression[at : at + 20]!r}")
        out.append(match.group())
        at = match.end()
    return out


def _parse(expression: str) -> list[_Item]:
    stack: list[tuple[_Token | None, list[_Item]]] = [(None, [])]
    at, spaced, previous = 0, False, ""
    while at < len(expression):
        if expression[at].isspace():
            at, spaced = at + 1, True
            continue
        match = _TOKEN.match(expression, at)
        if match is None:  # pragma: no cover - the pattern's last branch takes any character
            raise ValueError(f"no CEL token at {at}: {expression[at : at + 20]!r}")
        text = match.group()
        # No space inside a bracket or before a comma, however the text was broken: the
        # printer reads its own output as it read the builder's.
        opened = previous in _OPEN
        token = _Token(text, spaced and not opened and text not in _CLOSE and text != ",")
        at, spaced, previous = match.end(), False, text
        opener = stack[-1][0]
        if token.text in _OPEN:
            stack.append((token, []))
        elif opener is not None and token.text == _OPEN[opener.text]:
            _, items = stack.pop()
            stack[-1][1].append(_Group(opener, items, token))
        else:
            stack[-1][1].append(token)
    if len(stack) != 1:
        raise ValueError(f"unbalanced brackets in {expression[:60]!r}")
    return stack[0][1]


def _flat(items: Sequence[_Item]) -> str:
    out = []
    for item in items:
        if isinstance(item, _Group):
            out.append(_flat([item.open]) + _flat(item.items) + item.close.text)
        else:
            out.append((" " if item.spaced else "") + item.text)
    return "".join(out)


def _is(item: _Item, *texts: str) -> bool:
    return isinstance(item, _Token) and item.text in texts


def _split(items: Sequence[_Item], *ops: str) -> list[list[_Item]]:
    """``items`` cut at each of ``ops`` (which start the parts after the first)."""
    parts: list[list[_Item]] = [[]]
    for item in items:
        if _is(item, *ops) and parts[-1]:
            parts.append([])
        parts[-1].append(item)
    return parts


def _ternary(items: Sequence[_Item]) -> tuple[list[_Item], list[_Item], list[_Item]] | None:
    """``cond ? then : else`` of ``items`` (the ``:`` that closes the first ``?``)."""
    asked = next((i for i, item in enumerate(items) if _is(item, "?")), None)
    if asked is None:
        return None
    depth = 0
    for i in range(asked + 1, len(items)):
        if _is(items[i], "?"):
            depth += 1
        elif _is(items[i], ":"):
            if depth == 0:
                return list(items[:asked]), list(items[asked + 1 : i]), list(items[i + 1 :])
            depth -= 1
    return None


def _binary_plus(items: Sequence[_Item]) -> list[list[_Item]]:
    """``items`` cut before each binary ``+`` (one after an operand)."""
    parts: list[list[_Item]] = [[]]
    for item in items:
        last = parts[-1][-1] if parts[-1] else None
        operand = last is not None and (isinstance(last, _Group) or not _is(last, *_OPERATORS))
        if _is(item, "+") and operand:
            parts.append([])
        parts[-1].append(item)
    return parts


_OPERATORS: Final = (
    "&&",
    "||",
    "==",
    "!=",
    "<",
    "<=",
    ">",
    ">=",
    "+",
    "-",
    "*",
    "/",
    "%",
    "!",
    "?",
    ":",
    ",",
    "in",
    ".",
)


def _prefixed(prefix: str, items: Sequence[_Item], width: int) -> list[str]:
    """``items`` after ``prefix`` (an operator): a part that only opens brackets keeps
    its lines under the operator's column, closing where the operator stands; any other
    lines go under the part's first."""
    lines = _layout(items, width - len(prefix))
    shift = 0 if _cuts(items) is None else len(prefix)
    return [prefix + lines[0], *(" " * shift + line for line in lines[1:])]


def _cuts(items: Sequence[_Item]) -> tuple[str, list[list[_Item]]] | None:
    """Where ``items`` are cut, lowest operator first: ``?:`` (condition, then, else),
    else ``||``, ``&&``, a string's ``+`` (the parts after the first start with it)."""
    ternary = _ternary(items)
    if ternary is not None:
        return "?", list(ternary)
    for op in ("||", "&&"):
        parts = _split(items, op)
        if len(parts) > 1:
            return op, parts
    parts = _binary_plus(items)
    return ("+", parts) if len(parts) > 1 else None


def _layout(items: Sequence[_Item], width: int) -> list[str]:
    """The lines of ``items`` at most ``width`` wide where breaks can make them so: cut at
    the lowest operator, each part under the first with its operator leading; else the
    brackets that do not fit are opened."""
    flat = _flat(items).strip()
    cuts = None if len(flat) <= width else _cuts(items)
    if len(flat) <= width:
        return [flat]
    if cuts is None:
        return _opened(items, width)
    op, parts = cuts
    if op == "?":
        condition, then, otherwise = parts
        return [
            *_layout(condition, width),
            *_prefixed("? ", then, width),
            *_prefixed(": ", otherwise, width),
        ]
    lines = _layout(parts[0], width)
    for part in parts[1:]:
        lines.extend(_prefixed(op + " ", part[1:], width))
    return lines


def _opened(items: Sequence[_Item], width: int) -> list[str]:
    """``items`` on one line but for each bracket that does not fit: its parts (cut at its
    commas) go on the lines below, indented, as many to a line as fit where each fits
    whole, else one to a line but for the names a macro binds (``exists(c,``), which stay
    beside the bracket; its close goes on the next line."""
    lines: list[str] = []
    line = ""
    for item in items:
        piece = _flat([item])
        if not line:
            piece = piece.lstrip()
        if not isinstance(item, _Group) or len(line) + len(piece) <= width or not item.items:
            line += piece
            continue
        line += _flat([item.open]).lstrip() if not line else _flat([item.open])
        hugged = _hugged(line, item, width)
        if hugged is not None:
            lines.extend(hugged[:-1])
            line = hugged[-1]
            continue
        args = [arg[1:] if i else arg for i, arg in enumerate(_split(item.items, ","))]
        flats = [_flat(arg).strip() for arg in args]
        inner = width - 2
        if all(len(flat) < inner for flat in flats):
            lines.append(line)
            lines.extend("  " + row for row in _filled(flats, inner))
        else:
            while len(args) > 1 and len(args[0]) == 1 and isinstance(args[0][0], _Token):
                line += flats[0] + ", "
                args, flats = args[1:], flats[1:]
            lines.append(line.rstrip())
            for i, arg in enumerate(args):
                sub = _layout(arg, inner)
                if i < len(args) - 1:
                    sub[-1] += ","
                lines.extend("  " + s for s in sub)
        line = item.close.text
    lines.append(line)
    return lines


def _hugged(line: str, group: _Group, width: int) -> list[str] | None:
    """``line`` (ending in the open of ``group``) and ``group``'s one part, where that part
    is itself a chain of brackets (``(x.exists(c, ...))``): its lines follow the open, and
    the close follows its last, with no level of their own."""
    if any(_is(item, ",") for item in group.items) or _cuts(group.items) is not None:
        return None
    sub = _opened(group.items, width)
    if len(sub) < 2 or len(line) + len(sub[0]) > width:
        return None
    return [line + sub[0], *sub[1:-1], sub[-1] + group.close.text]


def _filled(flats: Sequence[str], width: int) -> list[str]:
    """``flats`` comma-separated, as many to a line as fit in ``width``."""
    rows = [""]
    for i, flat in enumerate(flats):
        piece = flat + ("," if i < len(flats) - 1 else "")
        if rows[-1] and len(rows[-1]) + 1 + len(piece) > width:
            rows.append("")
        rows[-1] += (" " if rows[-1] else "") + piece
    return rows


def printed(expression: str, *, width: int = WIDTH) -> str:
    """``expression`` broken into lines at most ``width`` wide (a string literal longer
    than that stays whole), its nesting indented; the same tokens, so the same CEL: CEL
    reads a newline as any other space."""
    return "\n".join(line.rstrip() for line in _layout(_parse(expression), width))
