"""`torchforge doctor` as a user runs it: a new process, the real toolchain on PATH, the real exit code."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from tests.test_upload_helpers import cli

# cuDNN and friends are not on this machine: the doctor sees stand-in files under their names (conftest.py).
pytestmark = pytest.mark.usefixtures("bundled_libraries")

HAVE_NVCC = shutil.which("nvcc") is not None
NVCC_RELEASE = (
    subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout.split("release ", 1)[1].split(",", 1)[0]
    if HAVE_NVCC else None
)


@pytest.mark.skipif(NVCC_RELEASE != "13.0", reason="needs nvcc 13.0 (the project's machines)")
def test_doctor_passes_for_the_machines_cuda() -> None:
    result = cli("doctor", "--pytorch", "2.9.0", "--cuda", "13.0", "--py", "3.12")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "nvcc (CUDA 13.0)" in result.stdout and "release 13.0" in result.stdout
    assert "MAX_JOBS" in result.stdout


@pytest.mark.skipif(NVCC_RELEASE != "13.0", reason="needs nvcc 13.0 and gcc > 11 (the project's machines)")
def test_doctor_prints_every_problem_then_exits_9() -> None:
    result = cli("doctor", "--cuda", "11.8", "--py", "3.10")
    assert result.returncode == 9
    # the whole table first, both failures in it, then the error
    assert "nvcc (CUDA 11.8)" in result.stdout and "is CUDA 13.0" in result.stdout
    assert "host compiler (CUDA 11.8)" in result.stdout and "GCC <= 11" in result.stdout
    assert "cmake" in result.stdout and "disk" in result.stdout
    assert "2 of" in result.stderr and "checks failed" in result.stderr


@pytest.mark.skipif(NVCC_RELEASE != "13.0", reason="needs nvcc 13.0")
def test_doctor_json_and_jobs_override() -> None:
    result = cli("doctor", "--pytorch", "2.9.0", "--cuda", "13.0", "--py", "3.12", "--jobs", "3", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] is True and report["max_jobs"] == 3
    statuses = {c["name"]: c["status"] for c in report["checks"]}
    assert statuses["nvcc (CUDA 13.0)"] == "ok"


def test_doctor_rejects_an_unknown_engine_as_a_failed_check() -> None:
    result = cli("doctor", "--cuda", "cpu", "--engine", "make")
    assert result.returncode == 9
    assert "unknown engine 'make'" in result.stdout
