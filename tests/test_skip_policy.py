"""The CI rule: a skip fails the run unless tests/skips_allowed.py lists it (checked on a throwaway suite
that uses this suite's own hooks)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_upload_helpers import ROOT, cli_env

HOOKS = ("pytest_runtest_logreport", "pytest_collectreport", "pytest_sessionfinish", "pytest_terminal_summary")


def _run(suite: Path, strict: bool, *extra: str) -> subprocess.CompletedProcess[str]:
    env = cli_env({"TORCHFORGE_STRICT_SKIPS": "1"} if strict else None)
    env.pop("CI", None)
    if not strict:
        env.pop("TORCHFORGE_STRICT_SKIPS", None)
    # Its own --basetemp: an inner pytest must not clean the shared /tmp/pytest-of-<user> while the outer run uses
    # it (pytest's cleanup of numbered folders races, leaving an unclosed scandir iterator: a ResourceWarning).
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           f"--basetemp={suite / '.basetemp'}", *extra, str(suite)],
                          cwd=suite, env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("suite")
    (root / "conftest.py").write_text(f"from tests.conftest import {', '.join(HOOKS)}\n")
    (root / "test_some.py").write_text(
        "import pytest\n\n"
        "def test_runs():\n    assert True\n\n"
        "def test_needs_a_toolkit():\n    pytest.skip('needs nvcc 13.0 on PATH')\n"
    )
    return root


def test_a_skip_passes_locally_and_is_listed(suite: Path) -> None:
    result = _run(suite, strict=False)
    assert result.returncode == 0, result.stdout
    assert "skips NOT in tests/skips_allowed.py" in result.stdout
    assert "test_some.py::test_needs_a_toolkit: needs nvcc 13.0 on PATH" in result.stdout
    assert "skips allowed on these machines (tests/skips_allowed.py)" in result.stdout


@pytest.mark.parametrize("workers", [(), ("-n", "2")], ids=["serial", "xdist"])
def test_a_skip_fails_in_ci(suite: Path, workers: tuple[str, ...]) -> None:
    result = _run(suite, True, *workers)
    assert result.returncode == 1, result.stdout
    assert "(fail the run: strict)" in result.stdout and "test_needs_a_toolkit" in result.stdout
