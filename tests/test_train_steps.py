"""gnnscale/train.py reads as named steps (issue #48): no function of it is longer than a page.

A function's length is its lines from ``def`` to its end, its docstring left out (an API's documentation is not
code to walk); the limit is 60 lines. The steps themselves are checked by name: the loop must not fold back into
one function.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ROOT / "gnnscale" / "train.py"
LIMIT = 60
STEPS = ("_load_and_check", "_plan", "_build", "_resume", "_run_epochs", "_report")


def functions(tree: ast.AST) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def code_lines(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines from ``def`` (decorators included) to the function's last line, less its docstring's."""
    first = min([fn.lineno] + [d.lineno for d in fn.decorator_list])
    assert fn.end_lineno is not None
    total = fn.end_lineno - first + 1
    doc = fn.body[0] if fn.body else None
    if isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant) and isinstance(doc.value.value, str):
        assert doc.end_lineno is not None
        total -= doc.end_lineno - doc.lineno + 1
    return total


def test_code_lines_counts_a_long_function_and_leaves_out_its_docstring() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(LIMIT + 1))
    long = ast.parse(f'def f():\n    """one\n    two\n    """\n{body}\n')
    assert code_lines(functions(long)[0]) == LIMIT + 2
    short = ast.parse('def g():\n    """a\n\n    b\n    """\n    return 1\n')
    assert code_lines(functions(short)[0]) == 2


def test_no_function_of_train_is_longer_than_the_limit() -> None:
    tree = ast.parse(TRAIN.read_text())
    long = {fn.name: n for fn in functions(tree) if (n := code_lines(fn)) > LIMIT}
    assert not long, f"gnnscale/train.py: functions over {LIMIT} lines (docstrings left out), split them: {long}"


def test_train_runs_the_named_steps() -> None:
    names = {fn.name for fn in functions(ast.parse(TRAIN.read_text()))}
    assert set(STEPS) <= names, f"gnnscale/train.py lacks the steps {sorted(set(STEPS) - names)}"


def test_train_does_not_import_predict_to_save() -> None:
    tree = ast.parse(TRAIN.read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "gnnscale.predict" not in imported, "train saves models through gnnscale.saved_model, never predict"
