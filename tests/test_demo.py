"""`make demo-repack` (scripts/demo_repack.py) with pip's configuration set aside: PIP_CONFIG_FILE=/dev/null and
no PIP_* variable but PIP_CERT (a trust store, not a source of packages), so pip sees stock PyPI plus what a test
puts in front of it. PyTorch's CPU index is asked first; from this network it is unreachable, and the demo says
so. The 530 MB CUDA wheel PyPI then serves is only resolved here (`--plan`); `make demo-pypi` downloads it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, TORCH

CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PY = f"{sys.version_info.major}.{sys.version_info.minor}"


def pip_set_aside(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") or k == "PIP_CERT"}
    return {**env, "PIP_CONFIG_FILE": os.devnull, **extra}


def demo(torch: str, work: Path, env: dict[str, str], *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "scripts/demo_repack.py", "--torch", torch, "--cpu-index", CPU_INDEX,
                           "--work", str(work / "demo"), "--out", str(work / "chan"), *extra],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)


def test_without_pips_configuration_the_cpu_index_failure_is_said_and_pypis_build_named(tmp_path: Path) -> None:
    done = demo(TORCH, tmp_path, pip_set_aside(), "--plan")
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("demo: ")]
    assert lines[0] == f"demo: PyTorch's CPU index {CPU_INDEX} did not serve torch {TORCH}: it is unreachable from here"
    assert lines[1].startswith("demo: falling back to pip's own index")
    tag = f"cp{PY.replace('.', '')}"
    assert lines[2] == (f"demo: torch {TORCH}: torch-{TORCH}-{tag}-{tag}-manylinux_2_28_x86_64.whl from "
                        "https://files.pythonhosted.org, a CUDA build (it requires NVIDIA's cu13 wheels)")
    assert not list((tmp_path / "demo").glob("wheels/*")) and not (tmp_path / "chan").exists()


def test_a_cuda_wheel_is_named_repacked_and_audited_under_the_name_repack_wrote(tmp_path: Path) -> None:
    """A stand-in of PyPI's CUDA torch (file name without +cu128, version.py with it) is what pip serves."""
    from tests.standin_stack import TORCH as STANDIN, Factory

    factory = Factory(tmp_path / "factory")
    factory.components()  # torch's libraries link theirs
    served = tmp_path / "served"
    served.mkdir()
    factory.torch("cu128").rename(served / f"torch-{STANDIN}-3-cp{PY.replace('.', '')}-cp{PY.replace('.', '')}"
                                           "-manylinux_2_28_x86_64.whl")
    done = demo(STANDIN, tmp_path, pip_set_aside(PIP_NO_INDEX="1", PIP_FIND_LINKS=str(served)))
    assert done.returncode == 0, done.stderr
    package = f"pytorch-{STANDIN}-whl_cf_py{PY}_cuda12.8_cudnn9.10.2_200.conda"
    assert (tmp_path / "chan" / "linux-64" / package).is_file()
    assert f"torchforge rpath audit {tmp_path / 'chan/linux-64' / package}\n" in done.stderr
    assert "ELF files audited: clean" in done.stdout
    assert f"demo: got {tmp_path}/demo/wheels/torch-{STANDIN}-3-" in done.stderr and ": the CUDA 12.8 build" in done.stderr
    assert f"demo: {package} is the CUDA 12.8 build: it needs conda-forge's CUDA packages" in done.stderr
    assert not (tmp_path / "demo" / "env").exists()


@pytest.mark.slow
def test_the_real_cpu_wheel_is_repacked_installed_and_imported(torch_wheel: Path, tmp_path: Path) -> None:
    """The CPU wheel offered beside stock PyPI (a find-links folder, as this machine's pip has it): pip prefers
    2.13.0+cpu to PyPI's 2.13.0, and the demo goes all the way."""
    served = tmp_path / "served"
    served.mkdir()
    (served / torch_wheel.name).symlink_to(torch_wheel)
    done = demo(TORCH, tmp_path, pip_set_aside(PIP_FIND_LINKS=str(served)))
    assert done.returncode == 0, done.stderr
    package = f"pytorch-{TORCH}-whl_py{PY}_cpu_0.conda"
    assert f"demo: torch {TORCH}: {torch_wheel.name} from the folder {served} (pip's find-links)" in done.stderr
    assert f"installed {package} into {tmp_path / 'demo' / 'env'}" in done.stdout
    assert f"{TORCH}+cpu {tmp_path}/demo/env/lib/python{PY}/site-packages/torch/__init__.py" in done.stdout
    assert "torch.ones(3).sum() = 3.0" in done.stdout
