"""No function or method in torchforge/ is over 80 lines (issue 30; the house style in CONVENTIONS: functions
under 80 lines), except the few listed below, which may only shrink.

A function's size is its lines from `def` to its last line (decorators apart, docstring, comments and blank
lines in), nested functions counted again on their own; its name is the module's dotted name and the path of
classes and functions down to it (`torchforge.commands.build.register.build`).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from tests.test_import_cycles import _modules

LIMIT = 80
MODULE_NOTE = 400  # modules this long are named in a failure message, as a hint where to split; not a rule
MODULE_LIMIT = 600  # no module over this many lines (issue 43 move 6), with no exceptions

# Over the limit when the rule came (issue 30's "before"), each with its size then. The list may only shrink:
# a listed function that grows fails, and one that shrinks fails until its number here is lowered to its new
# size (or it leaves the list, once at LIMIT or under), so the numbers never rise again.
LONG_FUNCTIONS: dict[str, int] = {}


def _functions(node: ast.AST, prefix: str) -> Iterator[tuple[str, int]]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            name = f"{prefix}.{child.name}"
            yield name, (child.end_lineno or child.lineno) - child.lineno + 1
            yield from _functions(child, name)
        elif isinstance(child, ast.ClassDef):
            yield from _functions(child, f"{prefix}.{child.name}")
        else:  # functions under `if TYPE_CHECKING:`, `try:` and the like
            yield from _functions(child, prefix)


def function_sizes(sources: dict[str, str]) -> dict[str, int]:
    """Every function and method of the modules {dotted name: source}, by qualified name."""
    return {name: size for module, source in sources.items() for name, size in _functions(ast.parse(source), module)}


def size_problems(sizes: dict[str, int], listed: dict[str, int]) -> list[str]:
    """Each way `sizes` breaks the rule given the list, as a line saying what to do."""
    problems = []
    for name, size in sorted(sizes.items()):
        allowed = listed.get(name)
        if allowed is None and size > LIMIT:
            problems.append(f"{name}: {size} lines, over {LIMIT}: split it (the list of exceptions only shrinks)")
        elif allowed is not None and size > allowed:
            problems.append(f"{name}: {size} lines, grew from {allowed}: a listed function may only shrink")
        elif allowed is not None and size <= LIMIT:
            problems.append(f"{name}: {size} lines, at or under {LIMIT} now: take it off LONG_FUNCTIONS")
        elif allowed is not None and size < allowed:
            problems.append(f"{name}: {size} lines, shrank from {allowed}: lower its number in LONG_FUNCTIONS to {size}")
    problems += [f"{name}: listed but gone: take it off LONG_FUNCTIONS" for name in sorted(listed.keys() - sizes.keys())]
    return problems


def _long_modules(sources: dict[str, str]) -> str:
    long = sorted(((len(s.splitlines()), m) for m, s in sources.items() if len(s.splitlines()) > MODULE_NOTE), reverse=True)
    return ", ".join(f"{m} {n}" for n, m in long)


def test_no_function_is_over_the_limit_except_the_shrinking_list() -> None:
    sources = {name: path.read_text(encoding="utf-8") for name, path in _modules().items()}
    problems = size_problems(function_sizes(sources), LONG_FUNCTIONS)
    assert not problems, "\n".join([*problems, f"(not a rule: modules over {MODULE_NOTE} lines: {_long_modules(sources)})"])


def module_problems(sources: dict[str, str], limit: int = MODULE_LIMIT) -> list[str]:
    """Each module over `limit` lines, as a line saying so."""
    return [f"{module}: {len(source.splitlines())} lines, over {limit}: split it along its seams"
            for module, source in sorted(sources.items()) if len(source.splitlines()) > limit]


def test_no_module_is_over_the_limit() -> None:
    sources = {name: path.read_text(encoding="utf-8") for name, path in _modules().items()}
    problems = module_problems(sources)
    assert not problems, "\n".join(problems)


def test_the_module_rule_sees_a_long_module_and_only_that() -> None:
    short, long = "x = 1\n" * MODULE_LIMIT, "x = 1\n" * (MODULE_LIMIT + 1)
    assert module_problems({"pkg.short": short, "pkg.long": long}) == [
        f"pkg.long: {MODULE_LIMIT + 1} lines, over {MODULE_LIMIT}: split it along its seams"]


def test_the_size_rule_sees_each_kind_of_problem() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(LIMIT))
    source = f"class Big:\n    def method(self) -> None:\n    {body.replace(chr(10), chr(10) + '    ')}\n\n" \
             f"def small() -> None:\n    pass\n"
    sizes = function_sizes({"pkg.mod": source})
    assert sizes == {"pkg.mod.Big.method": LIMIT + 1, "pkg.mod.small": 2}
    assert size_problems(sizes, {}) == ["pkg.mod.Big.method: 81 lines, over 80: split it (the list of exceptions only shrinks)"]
    assert size_problems(sizes, {"pkg.mod.Big.method": 81}) == []
    assert size_problems(sizes, {"pkg.mod.Big.method": 85})[0].endswith("lower its number in LONG_FUNCTIONS to 81")
    assert "grew from 80" in size_problems(sizes, {"pkg.mod.Big.method": 80})[0]
    assert "take it off LONG_FUNCTIONS" in size_problems(sizes, {"pkg.mod.Big.method": 81, "pkg.mod.small": 90})[0]
    assert size_problems(sizes, {"pkg.mod.Big.method": 81, "pkg.mod.gone": 99}) == \
        ["pkg.mod.gone: listed but gone: take it off LONG_FUNCTIONS"]
