"""`torchforge doctor` as a user runs it: a new process, the real toolchain on PATH, the real exit code."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.cuda_standin import make_stand_in_toolkit
from tests.test_upload_helpers import cli

HAVE_NVCC = shutil.which("nvcc") is not None
NVCC_RELEASE = (
    subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout.split("release ", 1)[1].split(",", 1)[0]
    if HAVE_NVCC else None
)


@pytest.fixture(scope="module")
def full_toolkit(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The machine's CUDA 13.0 plus stand-in cuBLAS, cuSPARSE and cuDNN: what a complete toolkit looks like."""
    return {"CUDA_HOME": str(make_stand_in_toolkit(tmp_path_factory.mktemp("cuda") / "toolkit", cudnn=True))}


@pytest.mark.skipif(NVCC_RELEASE != "13.0" or Path("/usr/local/cuda/include/cublas_v2.h").exists(),
                    reason="needs the project's machines: CUDA 13.0 with nvcc but no cuBLAS")
def test_doctor_fails_for_a_toolkit_with_nvcc_but_no_cublas() -> None:
    result = cli("doctor", "--pytorch", "2.9.0", "--cuda", "13.0", "--py", "3.12", "--magma-only",
                 env={"CUDA_HOME": "/usr/local/cuda"})
    assert result.returncode == 9
    lines = [line for line in result.stdout.splitlines() if "cuBLAS (CUDA 13.0)" in line]
    assert lines and "fail" in lines[0] and "cublas_v2.h, libcublas.so" in result.stdout
    assert "libcublas-dev-13-0" in result.stdout and "libcusparse-dev-13-0" in result.stdout
    assert "cuDNN" not in result.stdout  # --magma-only: MAGMA does not link cuDNN
    assert "checks failed (cuBLAS (CUDA 13.0), cuSPARSE (CUDA 13.0))" in result.stderr


@pytest.mark.skipif(NVCC_RELEASE != "13.0", reason="needs nvcc 13.0 (the project's machines)")
def test_doctor_passes_for_the_machines_cuda_with_its_libraries(full_toolkit: dict[str, str]) -> None:
    result = cli("doctor", "--pytorch", "2.9.0", "--cuda", "13.0", "--py", "3.12", env=full_toolkit)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "cuBLAS (CUDA 13.0)" in result.stdout and "cuDNN (CUDA 13.0)" in result.stdout
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
    # every failure at once: this machine has no CUDA 11.8 toolkit, so its libraries are missing as well
    assert "5 of" in result.stderr and "checks failed (nvcc (CUDA 11.8), host compiler (CUDA 11.8), cuBLAS (CUDA 11.8)" in result.stderr


@pytest.mark.skipif(NVCC_RELEASE != "13.0", reason="needs nvcc 13.0")
def test_doctor_json_and_jobs_override(full_toolkit: dict[str, str]) -> None:
    result = cli("doctor", "--pytorch", "2.9.0", "--cuda", "13.0", "--py", "3.12", "--jobs", "3", "--json",
                 env=full_toolkit)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] is True and report["max_jobs"] == 3
    statuses = {c["name"]: c["status"] for c in report["checks"]}
    assert statuses["nvcc (CUDA 13.0)"] == "ok"


def test_doctor_rejects_an_unknown_engine_as_a_failed_check() -> None:
    result = cli("doctor", "--cuda", "cpu", "--engine", "make")
    assert result.returncode == 9
    assert "unknown engine 'make'" in result.stdout
