"""Rules the test suite keeps about itself (issue 25, items 16 and 17)."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cuda_standin import make_stand_in_toolkit

TESTS = Path(__file__).parent
# time's clocks, and datetime's readings of the current time.
CLOCKS = {"monotonic", "perf_counter", "time", "monotonic_ns", "perf_counter_ns", "time_ns", "process_time",
          "process_time_ns", "thread_time", "thread_time_ns", "now", "utcnow", "today"}


@dataclass(frozen=True)
class _Clocks:
    """How a module can read a clock: the names it gave the `time`/`datetime` modules and the clock functions
    it imported (`from time import perf_counter as now`)."""

    modules: frozenset[str]
    functions: frozenset[str]


def _clocks_of(tree: ast.AST) -> _Clocks:
    modules: set[str] = set()
    functions: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {a.asname or a.name for a in node.names if a.name in ("time", "datetime")}
        elif isinstance(node, ast.ImportFrom) and node.module in ("time", "datetime"):
            # `from datetime import datetime`: the class, whose now() is a clock like the module's.
            for alias in node.names:
                if alias.name in CLOCKS:
                    functions.add(alias.asname or alias.name)
                elif alias.name == "datetime":
                    modules.add(alias.asname or alias.name)
    return _Clocks(frozenset(modules), frozenset(functions))


def _is_clock(node: ast.AST, clocks: _Clocks, timers: set[str]) -> bool:
    """A clock reading: `time.monotonic()`, `now()` imported as a clock, `datetime.datetime.now()`, or a call of a
    function of the module that returns one (`timers`)."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    if isinstance(func, ast.Name):
        return func.id in clocks.functions or func.id in timers
    if isinstance(func, ast.Attribute) and func.attr in CLOCKS:
        base = func.value.attr if isinstance(func.value, ast.Attribute) else getattr(func.value, "id", None)
        return base in clocks.modules
    return False


def _outside_text(node: ast.AST) -> Iterator[ast.AST]:
    """`ast.walk` that skips f-strings: a clock read into a name (`f"cache-{time.time_ns()}"`) is not a time."""
    yield node
    for child in ast.iter_child_nodes(node):
        if not isinstance(child, ast.JoinedStr):
            yield from _outside_text(child)


def _depends_on_a_clock(node: ast.AST, clocks: _Clocks, timers: set[str], timed: set[str]) -> bool:
    return any(_is_clock(n, clocks, timers) or (isinstance(n, ast.Name) and n.id in timed) for n in _outside_text(node))


def _bindings(tree: ast.AST) -> list[tuple[list[str], ast.AST]]:
    """(names bound, value) for every assignment: plain, annotated, augmented, tuple targets and `:=`."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            targets: list[ast.AST] = list(node.targets)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.NamedExpr)) and node.value is not None:
            targets = [node.target]
        else:
            continue
        found.append(([n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)], node.value))
    return found


def timed_assertions(source: str, filename: str = "<test>") -> list[int]:
    """The lines of `source` whose assert depends on a clock reading: read in the assert itself, or carried there
    through variables (`elapsed = time.monotonic() - t0`) or a function of the module that returns it. Names are
    followed module-wide, not per scope: a name once bound to a time is a time everywhere in the module."""
    tree = ast.parse(source, filename)
    clocks = _clocks_of(tree)
    bindings = _bindings(tree)
    functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    timed: set[str] = set()
    timers: set[str] = set()
    while True:  # to a fixed point: each pass can only add names
        before = len(timed) + len(timers)
        timed |= {name for names, value in bindings if _depends_on_a_clock(value, clocks, timers, timed) for name in names}
        timers |= {f.name for f in functions if any(isinstance(r, ast.Return) and r.value is not None
                                                    and _depends_on_a_clock(r.value, clocks, timers, timed)
                                                    for r in ast.walk(f))}
        if len(timed) + len(timers) == before:
            break
    return sorted(node.lineno for node in ast.walk(tree)
                  if isinstance(node, ast.Assert) and _depends_on_a_clock(node.test, clocks, timers, timed))


def test_no_test_asserts_on_elapsed_time() -> None:
    """Speed is measured in a benchmark (`make bench`), never asserted: a timed assertion fails on a busy machine
    and passes on a fast one for the wrong reason."""
    timed = [f"{path.relative_to(TESTS.parent)}:{line}" for path in sorted(TESTS.rglob("*.py"))
             for line in timed_assertions(path.read_text(), str(path))]
    assert timed == []


# Each a timed assertion the rule must find, in the ways a test writes one (issue 34 item 20).
TIMED = {
    "attribute call in the assert": "import time\nt0 = time.monotonic()\nassert time.monotonic() - t0 < 5\n",
    "clock to variable to assert": "import time\nt0 = time.monotonic()\nelapsed = time.monotonic() - t0\nassert elapsed < 5\n",
    "imported function": "from time import perf_counter\nstart = perf_counter()\nassert perf_counter() - start < 1\n",
    "imported function, through a variable": "from time import perf_counter\nstart = perf_counter()\ntaken = perf_counter() - start\nassert taken < 1\n",
    "aliased import": "from time import monotonic as now\nbegin = now()\nassert now() - begin < 2\n",
    "aliased module": "import time as clock\nbegin = clock.time()\nspent = clock.time() - begin\nassert spent <= 3\n",
    "two steps of variables": "import time\nt0 = time.perf_counter_ns()\nt1 = time.perf_counter_ns()\ndelta = t1 - t0\nseconds = delta / 1e9\nassert seconds < 1\n",
    "annotated and augmented": "import time\nspent: float = 0.0\nt0 = time.monotonic()\nspent += time.monotonic() - t0\nassert spent < 1\n",
    "tuple unpacking": "import time\nstart, end = time.monotonic(), time.monotonic()\nassert end - start < 1\n",
    "walrus": "import time\nassert (took := time.monotonic()) < 10\n",
    "helper that returns the elapsed time": (
        "import time\ndef timed(f):\n    t0 = time.monotonic()\n    f()\n    return time.monotonic() - t0\n"
        "def test_fast():\n    assert timed(print) < 0.5\n"),
    "datetime": "from datetime import datetime\nt0 = datetime.now()\nassert (datetime.now() - t0).total_seconds() < 5\n",
}
# Clock readings that are not timed assertions: a deadline for a wait, a unique name, a timestamp written.
UNTIMED = {
    "deadline of a wait": ("import time\ndeadline = time.monotonic() + 300\nwhile time.monotonic() < deadline:\n"
                           "    time.sleep(1)\nassert done\n"),
    "a unique name from the clock": ('import time\nrecords = solve(cache=f"gw-{time.time_ns()}")\n'
                                     "assert 'x' in records\n"),
    "sleep": "import time\ntime.sleep(0.1)\nassert True\n",
    "unrelated names": "import time\nelapsed = 3\nassert elapsed == 3\n",
}


@pytest.mark.parametrize("case", sorted(TIMED))
def test_the_timing_rule_finds_each_way_of_writing_a_timed_assertion(case: str) -> None:
    source = TIMED[case]
    assert timed_assertions(source) == [source.splitlines().index(next(
        line for line in source.splitlines() if line.lstrip().startswith("assert"))) + 1]


@pytest.mark.parametrize("case", sorted(UNTIMED))
def test_the_timing_rule_leaves_clock_readings_that_are_not_asserted_on(case: str) -> None:
    assert timed_assertions(UNTIMED[case]) == []


MACHINE_DEPENDENT = [
    "tests/test_preflight.py::test_a_toolkit_without_cublas_fails_with_what_would_fix_it",
    "tests/test_preflight.py::test_a_complete_toolkit_and_cudnn_from_its_own_folders_pass",
    "tests/test_preflight.py::test_engine_auto_without_conda_is_the_embedded_rattler_build",
    "tests/test_preflight.py::test_no_nvidia_smi_is_not_a_problem_for_building",
    "tests/test_doctor.py::test_doctor_fails_for_a_toolkit_with_nvcc_but_no_cublas",
    "tests/test_targets.py::test_token_lookup_order_and_repr",
]


@pytest.mark.skipif(shutil.which("nvcc") is None or shutil.which("gcc") is None, reason="needs nvcc and gcc")
def test_tests_of_a_missing_tool_pass_under_strict_skips_on_a_machine_that_has_it(tmp_path: Path) -> None:
    """Issue 25 item 17: on a better-equipped CI runner (cuBLAS in the toolkit, conda, nvidia-smi on PATH) these
    tests once skipped, which fails a run under strict skips. Here such a machine is made (a complete stand-in
    toolkit as CUDA_HOME, stand-in conda and nvidia-smi first on PATH) and they must pass, not skip."""
    toolkit = make_stand_in_toolkit(tmp_path / "cuda", cudnn=True)
    tools = tmp_path / "tools"
    tools.mkdir()
    for name, body in {"nvidia-smi": 'echo "580.65, NVIDIA H100"\n',
                       "conda": 'if [ "$1 $2" = "build --version" ]; then echo "conda-build 24.9.0"; exit 0; fi\nexit 1\n'}.items():
        (tools / name).write_text(f"#!/bin/sh\n{body}")
        (tools / name).chmod(0o755)
    env = {**os.environ, "CUDA_HOME": str(toolkit), "PATH": f"{tools}{os.pathsep}{os.environ['PATH']}",
           "TORCHFORGE_STRICT_SKIPS": "1"}
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "-rs",
                             f"--basetemp={tmp_path / 'inner'}", *MACHINE_DEPENDENT], cwd=TESTS.parent, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:]
    assert f"{len(MACHINE_DEPENDENT)} passed" in result.stdout, result.stdout[-3000:]


def test_no_source_file_warns_when_compiled() -> None:
    """An invalid escape such as "\\$" in a string is a SyntaxWarning on Python 3.12 (the GPU machine's Python
    printed one for compilecache.py's nvcc wrapper); every module compiles without a warning, the scripts of
    tests/gpu/ too (run only on a GPU machine, they would otherwise meet their first compiler there)."""
    import warnings

    root = TESTS.parent
    for path in sorted([*root.joinpath("torchforge").rglob("*.py"), *root.joinpath("bench").rglob("*.py"),
                        *TESTS.glob("*.py"), *TESTS.joinpath("gpu").rglob("*.py")]):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            compile(path.read_text(encoding="utf-8"), str(path), "exec")


# The modules of tests/ that may import py-rattler, and why (issue 34 item 21).
RATTLER_ALLOWED = {
    "tests/rattler_in_child.py": "the tests' py-rattler work; its importing functions run in torchforge.rattlerchild",
    "tests/stack_env.py": "a program of its own (`python -m tests.stack_env`, make repack-cuda-stack), never imported",
}
# Programs of tests/ that another interpreter runs: they import what only that one has (never pytest's).
OTHER_INTERPRETERS = {
    "tests/feedstock_render.py": "run by .venv-conda's Python (conda-build and its yaml) for the feedstock oracle",
}


def rattler_imports(source: str, filename: str = "<test>") -> list[int]:
    """The lines of `source` that load py-rattler: `import rattler[.x]`, `from rattler[.x] import ...`, or
    `importlib.import_module` / `__import__` of it (py-rattler-build, `rattler_build`, is another package)."""
    def is_rattler(name: str | None) -> bool:
        return name is not None and (name == "rattler" or name.startswith("rattler."))

    lines = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import) and any(is_rattler(a.name) for a in node.names):
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and is_rattler(node.module):
            lines.append(node.lineno)
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str) and is_rattler(node.args[0].value)
              and ((isinstance(node.func, ast.Name) and node.func.id == "__import__")
                   or (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module"))):
            lines.append(node.lineno)
    return sorted(lines)


LOADS_RATTLER = {
    "import": "import rattler\n",
    "import of a submodule": "def f():\n    import rattler.exceptions\n",
    "from-import": "from rattler import Gateway, solve\n",
    "from-import of a submodule": "from rattler.package_streaming import extract\n",
    "aliased": "import rattler as r\n",
    "importlib": "import importlib\nm = importlib.import_module('rattler')\n",
    "__import__": "m = __import__('rattler.exceptions')\n",
}


@pytest.mark.parametrize("case", sorted(LOADS_RATTLER))
def test_the_rattler_rule_finds_each_way_of_importing_it(case: str) -> None:
    source = LOADS_RATTLER[case]
    assert rattler_imports(source) == [len(source.splitlines())]


def test_the_rattler_rule_leaves_rattler_build_and_the_childs_helper_alone() -> None:
    assert rattler_imports("import rattler_build\nfrom rattler_build import Stage0Recipe\n"
                           "from tests.rattler_in_child import solve\nfrom torchforge.rattlerchild import call\n") == []


def test_no_test_module_loads_py_rattler_into_the_pytest_process() -> None:
    """py-rattler crashes now and then at interpreter exit, so torchforge runs it in a child (torchforge.rattlerchild);
    a test that imports it crashes its pytest worker the same way. The tests' solves, installs and MatchSpec
    readings go through tests/rattler_in_child.py, whose py-rattler imports are all in functions that run in the
    child; tests/gpu/ holds scripts for other machines."""
    found = [f"{path.relative_to(TESTS.parent)}:{line}" for path in sorted(TESTS.glob("*.py"))
             if str(path.relative_to(TESTS.parent)) not in RATTLER_ALLOWED
             for line in rattler_imports(path.read_text(), str(path))]
    assert found == []
    helper = ast.parse((TESTS / "rattler_in_child.py").read_text())
    for node in helper.body:
        assert not rattler_imports(ast.unparse(node)) or (
            isinstance(node, ast.FunctionDef) and node.name.startswith("_")), ast.unparse(node)[:200]
    # Nothing the tests import (tests/*.py and what they import of torchforge) loads it when imported.
    modules = sorted(f"tests.{p.stem}" for p in TESTS.glob("*.py")
                     if str(p.relative_to(TESTS.parent)) not in {**RATTLER_ALLOWED, **OTHER_INTERPRETERS})
    code = ("import importlib, sys\nfor name in sys.argv[1:]: importlib.import_module(name)\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'rattler'))")
    done = subprocess.run([sys.executable, "-c", code, *modules], cwd=TESTS.parent, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]"
