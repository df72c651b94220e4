"""The layer rules that import-linter cannot see: the core reads and writes no files."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.paths import ROOT

CORE = ROOT / "webhook" / "core"
# Calls that reach the file system or run code whatever the imports say.
_FORBIDDEN_CALLS = frozenset({"open", "exec", "eval", "__import__", "compile", "input"})
_FORBIDDEN_METHODS = frozenset(
    {"read_text", "read_bytes", "write_text", "write_bytes", "open", "mkdir", "unlink"}
)


def _io_calls(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id in _FORBIDDEN_CALLS:
            found.append(f"line {node.lineno}: {func.id}()")
        elif isinstance(func, ast.Attribute) and func.attr in _FORBIDDEN_METHODS:
            found.append(f"line {node.lineno}: .{func.attr}()")
    return found


@pytest.mark.parametrize("path", sorted(CORE.glob("*.py")), ids=lambda p: p.name)
def test_core_module_does_no_file_io(path: Path) -> None:
    assert _io_calls(path.read_text()) == []


def test_the_check_sees_file_io() -> None:
    source = "from pathlib import Path\nx = Path('p').read_text()\nwith open('f') as f: pass\n"
    assert _io_calls(source) == ["line 2: .read_text()", "line 3: open()"]
