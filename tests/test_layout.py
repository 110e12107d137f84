"""The size budgets of ../shared/DESIGN.md section 2: files of at most 600 lines (kernels and
pure data tables excepted) and functions of at most 60 lines."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SOURCES = sorted(p for d in ("vjx", "serving", "benchmarks") for p in (ROOT / d).rglob("*.py"))
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 60
EXEMPT_FILES = {"vjx/kernels"}


def _relative(path: pathlib.Path) -> str:
    return path.relative_to(ROOT).as_posix()


@pytest.mark.parametrize("path", SOURCES, ids=_relative)
def test_file_fits_the_budget(path):
    if any(_relative(path).startswith(prefix) for prefix in EXEMPT_FILES):
        return
    num_lines = sum(1 for line in path.read_text().splitlines() if line.strip())
    assert num_lines <= MAX_FILE_LINES, f"{num_lines} non-blank lines: split the file"


@pytest.mark.parametrize("path", SOURCES, ids=_relative)
def test_functions_fit_the_budget(path):
    tree = ast.parse(path.read_text())
    too_long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not too_long, f"functions over {MAX_FUNCTION_LINES} lines: {too_long}"
