"""`torchforge doctor` as a user runs it: a new process, the real toolchain on PATH, the real exit code."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.cuda_standin import make_stand_in_toolkit
from tests.stubchannel import make_stub_channel
from tests.test_upload_helpers import cli
from torchforge.flavours.official.recipe import pytorch_context
from torchforge.flavours.official.render import plan
from torchforge.flavours.official.variant import Options, Selection

# cuDNN and friends are not on this machine: the doctor sees stand-in files under their names (conftest.py).
pytestmark = pytest.mark.usefixtures("bundled_libraries")

HAVE_NVCC = shutil.which("nvcc") is not None
NVCC_RELEASE = (
    subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout.split("release ", 1)[1].split(",", 1)[0]
    if HAVE_NVCC else None
)


def requirements(pytorch: str, accel: str, python: str) -> list[str]:
    """The build and host requirements of one variant's rendered recipe (what doctor solves)."""
    (variant,) = plan(Selection.from_flags(pytorch, accel, python, None, Options())).variants
    context = pytorch_context(variant)
    return [*context.build_requirements, *context.host_requirements]


def site_config(folder: Path, channel: Path) -> Path:
    """A torchforge.toml that replaces every data channel with one local channel (an air-gapped site)."""
    config = folder / "torchforge.toml"
    config.write_text(f'[channels]\nreplace = ["file://{channel}"]\n')
    return config


@pytest.fixture(scope="module")
def mirror(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local channel with every build and host requirement of the variants below, and its config file."""
    root = tmp_path_factory.mktemp("site")
    make_stub_channel(root / "mirror", [*requirements("2.9.0", "13.0", "3.12"), *requirements("2.5.1", "11.8", "3.10")],
                      runnable=False)
    return site_config(root, root / "mirror")


@pytest.fixture(scope="module")
def full_toolkit(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The machine's CUDA 13.0 plus stand-in cuBLAS, cuSPARSE and cuDNN: what a complete toolkit looks like."""
    return {"CUDA_HOME": str(make_stand_in_toolkit(tmp_path_factory.mktemp("cuda") / "toolkit", cudnn=True))}


@pytest.mark.skipif(NVCC_RELEASE != "13.0", reason="needs nvcc 13.0 (the project's machines)")
def test_doctor_fails_for_a_toolkit_with_nvcc_but_no_cublas(mirror: Path, tmp_path: Path) -> None:
    # The machine's CUDA 13.0 without cuBLAS and cuSPARSE, made the same way where the toolkit has them.
    toolkit = make_stand_in_toolkit(tmp_path / "cuda", cublas=False)
    result = cli("doctor", "--pytorch", "2.9.0", "--flavour", "official", "--cuda", "13.0", "--py", "3.12", "--magma-only",
                 "--config", str(mirror), env={"CUDA_HOME": str(toolkit)})
    assert result.returncode == 9
    lines = [line for line in result.stdout.splitlines() if "cuBLAS (CUDA 13.0)" in line]
    assert lines and "fail" in lines[0] and "cublas_v2.h, libcublas.so" in result.stdout
    assert "libcublas-dev-13-0" in result.stdout and "libcusparse-dev-13-0" in result.stdout
    assert "cuDNN" not in result.stdout  # --magma-only: MAGMA does not link cuDNN
    # nor does it bundle libraries, read the pytorch source or need a channel (its recipe has no requirements)
    rows = [line.split("│")[1].strip() for line in result.stdout.splitlines() if line.startswith("│")]
    assert rows and not [row for row in rows if row.startswith(("bundled ", "channel ", "requirements (", "source"))]
    assert "checks failed (cuBLAS (CUDA 13.0), cuSPARSE (CUDA 13.0))" in result.stderr


@pytest.mark.skipif(NVCC_RELEASE != "13.0", reason="needs nvcc 13.0 (the project's machines)")
def test_doctor_passes_for_the_machines_cuda_with_its_libraries(mirror: Path, full_toolkit: dict[str, str]) -> None:
    result = cli("doctor", "--pytorch", "2.9.0", "--flavour", "official", "--cuda", "13.0", "--py", "3.12", "--config", str(mirror),
                 env=full_toolkit)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "cuBLAS (CUDA 13.0)" in result.stdout and "cuDNN (CUDA 13.0)" in result.stdout
    assert "nvcc (CUDA 13.0)" in result.stdout and "release 13.0" in result.stdout
    assert "MAX_JOBS" in result.stdout


@pytest.mark.skipif(NVCC_RELEASE != "13.0", reason="needs nvcc 13.0 and gcc > 11 (the project's machines)")
def test_doctor_prints_every_problem_then_exits_9(mirror: Path) -> None:
    result = cli("doctor", "--cuda", "11.8", "--py", "3.10", "--config", str(mirror))
    assert result.returncode == 9
    # the whole table first, both failures in it, then the error
    assert "nvcc (CUDA 11.8)" in result.stdout and "is CUDA 13.0" in result.stdout
    assert "host compiler (CUDA 11.8)" in result.stdout and "GCC <= 11" in result.stdout
    assert "cmake" in result.stdout and "disk" in result.stdout
    # every failure at once: this machine has no CUDA 11.8 toolkit, so its libraries are missing as well
    assert "checks failed (nvcc (CUDA 11.8), host compiler (CUDA 11.8), cuBLAS (CUDA 11.8)" in result.stderr
    # ... and names the image that has what this machine lacks
    assert "image (CUDA 11.8)" in result.stdout and "pytorch/conda-builder:cuda11.8" in result.stdout
    assert "--container" in result.stdout


@pytest.mark.skipif(NVCC_RELEASE != "13.0", reason="needs nvcc 13.0")
def test_doctor_json_and_jobs_override(mirror: Path, full_toolkit: dict[str, str]) -> None:
    result = cli("doctor", "--pytorch", "2.9.0", "--flavour", "official", "--cuda", "13.0", "--py", "3.12", "--jobs", "3", "--json",
                 "--config", str(mirror), env=full_toolkit)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] is True and report["max_jobs"] == 3
    statuses = {c["name"]: c["status"] for c in report["checks"]}
    assert statuses["nvcc (CUDA 13.0)"] == "ok"


def test_doctor_rejects_an_unknown_engine_as_a_failed_check(tmp_path: Path) -> None:
    """Exit 9 for the engine alone: the channels are a local one that answers (no network)."""
    from tests.offline_site import offline_site

    config = offline_site(tmp_path / "site", requirements("2.5.1", "cpu", "3.12"))
    result = cli("doctor", "--pytorch", "2.5.1", "--cuda", "cpu", "--py", "3.12", "--engine", "make", "--json",
                 "--config", str(config), "--out", str(tmp_path / "out"))
    assert result.returncode == 9, result.stderr
    failed = {row["name"]: row["detail"] for row in json.loads(result.stdout)["checks"] if row["status"] == "fail"}
    assert list(failed) == ["engine"] and "unknown engine 'make'" in failed["engine"], failed


def test_doctor_names_the_requirement_a_channel_lacks(tmp_path: Path) -> None:
    """A local channel with every requirement but pyyaml: the solve fails and doctor says which and where."""
    wanted = requirements("2.9.0", "cpu", "3.11")
    assert "pyyaml" in wanted
    make_stub_channel(tmp_path / "mirror", [spec for spec in wanted if spec != "pyyaml"], runnable=False)
    config = site_config(tmp_path, tmp_path / "mirror")
    result = cli("doctor", "--pytorch", "2.9.0", "--flavour", "official", "--cuda", "cpu", "--py", "3.11", "--config", str(config),
                 "--out", str(tmp_path / "out"), "--json")
    assert result.returncode == 9, result.stderr
    checks = {c["name"]: c for c in json.loads(result.stdout)["checks"]}
    assert checks[f"channel file://{tmp_path / 'mirror'}"]["status"] == "ok"
    row = checks["requirements (pytorch-2.9.0-cpu-py311-linux_64)"]
    assert row["status"] == "fail"
    # (the output channel does not exist yet, so only the mirror is looked in)
    assert row["detail"] == f"host: no package for pyyaml in file://{tmp_path / 'mirror'}"
    # the same channel with pyyaml added solves
    make_stub_channel(tmp_path / "mirror", ["pyyaml"], runnable=False)
    result = cli("doctor", "--pytorch", "2.9.0", "--flavour", "official", "--cuda", "cpu", "--py", "3.11", "--config", str(config),
                 "--out", str(tmp_path / "out"), "--json")
    checks = {c["name"]: c for c in json.loads(result.stdout)["checks"]}
    assert checks["requirements (pytorch-2.9.0-cpu-py311-linux_64)"]["status"] == "ok", checks


def test_doctor_fails_a_folder_that_is_not_an_indexed_channel(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    config = site_config(tmp_path, tmp_path / "empty")
    result = cli("doctor", "--pytorch", "2.9.0", "--flavour", "official", "--cuda", "cpu", "--py", "3.11", "--config", str(config), "--json")
    assert result.returncode == 9
    checks = {c["name"]: c for c in json.loads(result.stdout)["checks"]}
    row = checks[f"channel file://{tmp_path / 'empty'}"]
    assert row["status"] == "fail" and "no noarch/repodata.json" in row["detail"]
    assert checks["requirements (pytorch-2.9.0-cpu-py311-linux_64)"]["status"] == "warn"
