"""What CI and `make ci-local` say on a machine without podman and the tools around it: run for real with PATH
stripped of them (tests/cuda_standin.path_without), so this runs the same on a machine that has them. The
pipeline itself (30 minutes) is never started here: nothing it needs is found.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.ci_local import TOOLS
from tests.conftest import REPO
from tests.cuda_standin import path_without

ALL_TOOLS = tuple(tool for tool, _ in TOOLS)
MISSING = ("ci-local cannot run here: podman, runc, debootstrap, rsync, node, npm are not on PATH; install them all "
           "with: apt-get install -y podman runc debootstrap rsync nodejs npm")


def _env(farm: Path, *also: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TORCHFORGE_NO_CONTAINER", "CI", "TORCHFORGE_STRICT_SKIPS")}
    return {**env, "PATH": path_without((*ALL_TOOLS, *also), farm)}


def test_make_ci_local_names_every_missing_tool_at_once_and_fails(tmp_path: Path) -> None:
    done = subprocess.run(["make", "--no-print-directory", "ci-local"], cwd=REPO, env=_env(tmp_path / "bin"),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 2, done.stdout + done.stderr
    assert MISSING in done.stderr.splitlines()
    assert "pytest" not in done.stdout + done.stderr  # the pipeline's tests were not started


def test_make_ci_local_fails_when_its_tests_only_skip(tmp_path: Path) -> None:
    """`make -i` goes on past the tool check: the pipeline's tests then skip, and that fails too."""
    done = subprocess.run(["make", "--no-print-directory", "-i", "ci-local"], cwd=REPO, env=_env(tmp_path / "bin"),
                          capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    assert "6 skipped" in output and "skips NOT in tests/skips_allowed.py (fail the run: strict)" in output
    assert f"tests/test_ci_local.py::test_the_compile_cache_is_saved_then_reused: {MISSING}" in output
    assert [line.split("] ")[-1] for line in done.stderr.splitlines() if "(ignored)" in line] == \
        ["Error 1 (ignored)", "Error 1 (ignored)"]  # the tool check and pytest both failed


def _copy_of_checkout(dest: Path) -> Path:
    """The checkout's files as git sees them (tracked and untracked, not ignored): `.ci/run` removes .venv."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, capture_output=True,
                            check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        if (REPO / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, dest / name)
    return dest


@pytest.mark.slow
def test_ci_without_podman_ends_with_the_skip_and_its_reason_not_a_pass(tmp_path: Path) -> None:
    """.ci/run where podman cannot be installed (no apt-get either): the container tests and the container
    benchmark are allowed skips, and the last lines say so, with exit 3. TESTS and BENCH narrow `make test` and
    `make bench-quick` to the container tests and benchmark (the whole suite is not run here)."""
    checkout = _copy_of_checkout(tmp_path / "checkout")
    env = {**_env(tmp_path / "bin", "apt-get"), "TESTS": "tests/test_container_build.py", "BENCH": "container"}
    done = subprocess.run(["bash", ".ci/run"], cwd=checkout, env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 3, done.stdout[-3000:] + done.stderr[-3000:]
    reason = "podman or its images could not be set up on this CI machine (see the output above)"
    assert done.stderr.splitlines()[-2:] == [
        "ci: SKIPPED, not run: tests/test_container_build.py, tests/test_container_conda_forge.py, tests/test_ci_local.py "
        "and the container benchmark: "
        + reason, "ci: not a pass: everything else passed; exit 3 (skipped)"]
    assert "SKIPPED, not run: container: torch_like cpu in podman / on this machine: podman is not on PATH" \
        in done.stdout and "(allowed (tests/skips_allowed.py))" in done.stdout
    assert "ci: passed" not in done.stdout
