"""Rules the test suite keeps about itself (issue 25, items 16 and 17)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).parent
CLOCKS = {"monotonic", "perf_counter", "time", "monotonic_ns", "perf_counter_ns", "time_ns"}


def _is_clock(node: ast.AST) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in CLOCKS
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "time")


def _reads_a_clock(node: ast.AST) -> bool:
    return any(_is_clock(n) for n in ast.walk(node))


def _clock_variables(tree: ast.AST) -> set[str]:
    """Names bound to a clock reading (`started = time.monotonic()`)."""
    return {t.id for n in ast.walk(tree) if isinstance(n, ast.Assign) and _is_clock(n.value)
            for t in n.targets if isinstance(t, ast.Name)}


def test_no_test_asserts_on_elapsed_time() -> None:
    """Speed is measured in a benchmark (`make bench`), never asserted: a timed assertion fails on a busy machine
    and passes on a fast one for the wrong reason."""
    timed = []
    for path in sorted(TESTS.rglob("test_*.py")):
        tree = ast.parse(path.read_text(), str(path))
        clocks = _clock_variables(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Assert) and (_reads_a_clock(node.test) or any(
                    isinstance(n, ast.Name) and n.id in clocks for n in ast.walk(node.test))):
                timed.append(f"{path.relative_to(TESTS.parent)}:{node.lineno}")
    assert timed == []
