"""`torchforge verify --python`: a probe that hangs is stopped with a message and its exit code; a relative
`--python ./python` is that file, never `python` from PATH; a missing or non-executable one is named as the given
interpreter (issue 34, item 10)."""

from __future__ import annotations

import os
import re
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
    result = forge("verify", str(prefix), "--python", sys.executable, "--want", "cpu", "--timeout", "3", cwd=tmp_path,
                   env={"COLUMNS": "1000"})
    text = " ".join(result.stdout.split())
    assert result.returncode == ExitCode.AUDIT_FAILED, text
    assert f"the probe finished │ FAILED │ the probe in {sys.executable} did not finish within 3 s and was stopped" in text
    assert "--timeout" in text and "Traceback" not in result.stderr
    assert "1 of 2 checks failed: the probe finished (not so: the probe in" in " ".join(result.stderr.split())


def test_an_interpreter_whose_children_never_end_is_stopped_with_its_whole_group(tmp_path: Path) -> None:
    """`--python HANG`, a script that runs `sleep 600` (issue 40 item 14): before, the script was stopped but its
    `sleep` kept the output open and verify had not returned after 150 s; now the whole process group is stopped
    at --timeout and the row names what was stopped."""
    prefix = environment(tmp_path, "")
    hang = tmp_path / "HANG"
    hang.write_text("#!/bin/sh\nsleep 600\n")
    hang.chmod(0o755)
    result = forge("verify", str(prefix), "--python", str(hang), "--timeout", "2", cwd=tmp_path,
                   env={"COLUMNS": "1000"})  # forge() gives up after 300 s, where verify used to hang 600 s
    text = " ".join(result.stdout.split())
    assert result.returncode == ExitCode.AUDIT_FAILED, text + result.stderr
    assert f"did not finish within 2 s and was stopped: pid " in text and ": sleep 600" in text, text
    sleeper = re.search(r"pid (\d+): sleep 600", text)
    assert sleeper and not running(int(sleeper.group(1)))  # stopped, not left behind
    assert "Traceback" not in result.stderr


def running(pid: int) -> bool:
    """A process that exists and is not a zombie (one whose parent died waits for init to reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


BAD_RECORDS = {
    "a-list": (b'["name", "files"]', "is a JSON list, not a package record"),
    "not-json": (b'{"name": "x", "files": [', "is not valid JSON (line 1, column 25"),
    "not-utf8": (b'{"name": "\xff"}', "cannot be read"),
}


@pytest.mark.parametrize("case", sorted(BAD_RECORDS))
def test_a_bad_conda_meta_record_is_a_row_and_the_rest_is_still_checked(case: str, tmp_path: Path) -> None:
    """Before: `internal error`, exit 70 (a traceback from json.loads in verify.installed)."""
    prefix = environment(tmp_path, "")
    data, expected = BAD_RECORDS[case]
    (prefix / "conda-meta" / "broken-1.0-0.json").write_bytes(data)
    result = forge("verify", str(prefix), "--python", sys.executable, "--want", "cpu", cwd=tmp_path,
                   env={"COLUMNS": "1000"})
    text = " ".join(result.stdout.split())
    assert result.returncode == ExitCode.AUDIT_FAILED, text + result.stderr
    assert f"conda-meta/broken-1.0-0.json is a package record │ FAILED │ {expected}" in text, text
    assert "torch loads from the prefix │ ok" in text  # the good record is still checked
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr


def test_a_package_whose_files_are_gone_is_named(tmp_path: Path) -> None:
    prefix = environment(tmp_path, "")
    (prefix / "lib" / "libkept.so").write_bytes(b"")
    record = '{"name": "gone", "files": ["lib/libkept.so", "lib/libgone.so", "../outside.so"]}'
    (prefix / "conda-meta" / "gone-1.0-0.json").write_text(record)
    result = forge("verify", str(prefix), "--python", sys.executable, "--want", "cpu", cwd=tmp_path,
                   env={"COLUMNS": "1000"})
    text = " ".join(result.stdout.split())
    assert result.returncode == ExitCode.AUDIT_FAILED, text
    assert "gone-1.0-0: every file its record lists is present │ FAILED │ 1 of 3 missing, e.g. lib/libgone.so" in text


def test_the_summary_says_what_was_not_so(tmp_path: Path) -> None:
    """Before: "1 of 4 checks failed: the probe ran without an error", which reads as a success."""
    prefix = environment(tmp_path, "raise RuntimeError('torch is broken')\n")
    result = forge("verify", str(prefix), "--python", sys.executable, "--want", "cpu", cwd=tmp_path)
    text = " ".join(result.stderr.split())
    assert result.returncode == ExitCode.AUDIT_FAILED, text
    assert "the probe ran without an error (not so: RuntimeError: torch is broken)" in text, text


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
