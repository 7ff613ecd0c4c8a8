"""Rules the test suite keeps about itself (issue 25, items 16 and 17)."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cuda_standin import make_stand_in_toolkit

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


def timed_assertions(source: str, filename: str = "<test>") -> list[int]:
    """The lines of `source` whose assert depends on a clock reading."""
    tree = ast.parse(source, filename)
    clocks = _clock_variables(tree)
    return [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Assert) and (_reads_a_clock(node.test) or any(
            isinstance(n, ast.Name) and n.id in clocks for n in ast.walk(node.test)))]


def test_no_test_asserts_on_elapsed_time() -> None:
    """Speed is measured in a benchmark (`make bench`), never asserted: a timed assertion fails on a busy machine
    and passes on a fast one for the wrong reason."""
    timed = [f"{path.relative_to(TESTS.parent)}:{line}" for path in sorted(TESTS.rglob("test_*.py"))
             for line in timed_assertions(path.read_text(), str(path))]
    assert timed == []


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
    printed one for compilecache.py's nvcc wrapper); every module compiles without a warning."""
    import warnings

    root = TESTS.parent
    for path in sorted([*root.joinpath("torchforge").rglob("*.py"), *root.joinpath("bench").rglob("*.py"),
                        *TESTS.glob("*.py")]):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            compile(path.read_text(encoding="utf-8"), str(path), "exec")
