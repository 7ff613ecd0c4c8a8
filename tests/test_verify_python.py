"""`torchforge verify --python`: a probe that hangs is stopped with a message and its exit code; a relative
`--python ./python` is that file, never `python` from PATH; a missing or non-executable one is named as the given
interpreter (issue 34, item 10)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from torchforge.errors import ExitCode

HERE = f"python{sys.version_info.major}.{sys.version_info.minor}"


def forge(*argv: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "torchforge.cli", *argv], capture_output=True, text=True,
                          cwd=cwd, env={**os.environ, **(env or {})}, timeout=300)


def environment(root: Path, torch_init: str) -> Path:
    """A conda prefix whose site-packages hold a `torch` package with `torch_init` as its __init__.py."""
    prefix = root / "env"
    (prefix / "conda-meta").mkdir(parents=True)
    (prefix / "conda-meta" / "pytorch-2.9.0-py3.11_cpu_0.json").write_text('{"name": "pytorch"}')
    package = prefix / "lib" / HERE / "site-packages" / "torch"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(torch_init)
    (package / "version.py").write_text("__version__ = '2.9.0+cpu'\ncuda = None\n")
    return prefix


def test_a_probe_whose_import_never_returns_is_stopped_at_the_time_limit(tmp_path: Path) -> None:
    # A torch whose import blocks forever, as one deadlocked in its initialisation does.
    prefix = environment(tmp_path, "import time\ntime.sleep(10**6)\n")
    result = forge("verify", str(prefix), "--python", sys.executable, "--want", "cpu", "--timeout", "3", cwd=tmp_path)
    text = " ".join(result.stderr.split())
    assert result.returncode == ExitCode.AUDIT_FAILED, text
    assert f"the probe in {sys.executable} did not finish within 3 s and was stopped" in text
    assert "--timeout" in text and "Traceback" not in text


def test_a_relative_python_is_the_file_in_the_working_folder_not_one_on_path(tmp_path: Path) -> None:
    """`./python` is a wrapper that marks its runs; a `python` on PATH that would be picked instead fails."""
    prefix = environment(tmp_path, "version = None\n")
    marker = tmp_path / "ran-the-given-interpreter"
    wrapper = tmp_path / "python"
    wrapper.write_text(f"#!/bin/sh\ntouch {marker}\nexec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    elsewhere = tmp_path / "path-bin"
    elsewhere.mkdir()
    wrong = elsewhere / "python"
    wrong.write_text("#!/bin/sh\necho 'the python from PATH ran' >&2\nexit 3\n")
    wrong.chmod(0o755)
    result = forge("verify", str(prefix), "--python", "./python", "--want", "cpu", cwd=tmp_path,
                   env={"PATH": f"{elsewhere}{os.pathsep}{os.environ['PATH']}", "COLUMNS": "250"})
    assert "the python from PATH ran" not in result.stderr + result.stdout
    assert marker.is_file(), result.stderr
    assert "torch loads from the prefix │ ok" in " ".join(result.stdout.split()), result.stdout


@pytest.mark.parametrize("case", ["missing", "folder", "not-executable"])
def test_a_python_that_is_not_an_executable_file_is_named_with_what_would_work(case: str, tmp_path: Path) -> None:
    prefix = environment(tmp_path, "")
    given = tmp_path / "py"
    if case == "folder":
        given.mkdir()
    elif case == "not-executable":
        given.write_text("#!/bin/sh\nexit 0\n")
        given.chmod(0o644)
    result = forge("verify", str(prefix), "--python", "py", cwd=tmp_path)
    text = " ".join(result.stderr.split())
    assert result.returncode == ExitCode.USAGE, text
    expected = "does not exist" if case == "missing" else "is not an executable file"
    assert f"--python py: {given} {expected}" in text and "what would work" in text
    assert "has no bin/python" not in text
