"""torchvision for the pytorch a team has, both flavours, through the CLI only (issue 38): the real torch 2.13.0
CPU wheel repacked with `torchforge repack` (tests/test_have_pytorch_stack.py's `repacked`), then
`torchforge standin-channel --for ... --with torchvision` for what the companion's recipe installs, `torchforge
build --for ... --with torchvision --with-source torchvision=tests/fixtures/vision_ops` (a miniature built with
torch's own BuildExtension against the torch in the recipe's host: its README says what it stands in for), and
`torchforge install` into a fresh prefix, where the miniature's operator runs through torch's dispatcher.
conda-forge's recipe runs `pip check` in its test: it found that a repacked pytorch without its dist-info's
setuptools requirement fails it (torchforge/data/pypi_to_conda.toml)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.test_extension_build import PY
from tests.test_have_pytorch_stack import REPACKED, repacked_once
from tests.test_upload_helpers import cli
from torchforge.elf import read_elf

ROOT = Path(__file__).resolve().parent.parent
VISION = ROOT / "tests" / "fixtures" / "vision_ops"
SETUPTOOLS = ROOT / "tests" / "fixtures" / "setuptools_wheel"  # the real setuptools the stand-in needs, offline
FOR = "pytorch ==2.13.0 whl_*"
RUN = """
import torch, torchvision, torchvision.ops
assert torchvision.torch_version == torch.__version__, (torchvision.torch_version, torch.__version__)
print("ones_sum", torchvision.ops.ones_sum(7).item(), "torchvision", torchvision.__version__)
"""
BUILDS = {"official": f"py{PY.replace('.', '')}_cpu", "conda-forge": f"cpu_py{PY.replace('.', '')}_h*_1"}

pytestmark = [pytest.mark.slow, pytest.mark.skipif(PY != "3.11", reason="the torch 2.13.0 CPU wheel here is cp311")]


@pytest.fixture(scope="module")
def repacked(torch_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return repacked_once(torch_wheel, tmp_path_factory)  # one repack per session, shared with the stack's tests


@pytest.mark.parametrize("flavour", ["official", "conda-forge"])
def test_torchvision_builds_for_a_repacked_pytorch_installs_and_runs(flavour: str, repacked: tuple[Path, Path],
                                                                     tmp_path: Path) -> None:
    torch_channel, stubs = repacked
    companion_stubs = tmp_path / "companion-stubs"
    done = cli("standin-channel", "--for", FOR, "--channel", str(torch_channel), "--channel", str(stubs), "--with",
               "torchvision", "--flavour", flavour, "--wheels", str(SETUPTOOLS), "--out", str(companion_stubs),
               env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not list(companion_stubs.glob("*/pytorch-*")), "the pytorch is its channel's file, never a stand-in"
    channels = ("--channel", str(torch_channel), "--channel", str(companion_stubs), "--channel", str(stubs))
    out = tmp_path / "out"
    done = cli("build", "--for", FOR, *channels, "--with", "torchvision", "--with-source", f"torchvision={VISION}",
               "--flavour", flavour, "--engine", "rattler-build", "--skip-preflight", "--no-cache",
               "--config", str(companion_stubs / "torchforge.toml"), "--out", str(out),
               env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}, timeout=1800)
    logs = "".join(p.read_text()[-3000:] for p in (out / "logs").glob("*.log")) if (out / "logs").is_dir() else ""
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:] + logs
    assert f"building for {REPACKED}" in done.stderr and "no pytorch source build is planned" in done.stderr
    (built,) = out.glob(f"linux-64/torchvision-0.28.0-{BUILDS[flavour]}.conda")
    assert not list(out.glob("linux-64/pytorch-*")) and not list(out.glob("linux-64/libtorch-*"))
    prefix = tmp_path / "prefix"
    done = cli("install", "torchvision", "--channel", str(out), *channels, "--prefix", str(prefix))
    assert done.returncode == 0, done.stderr[-3000:]
    meta = json.loads((prefix / "conda-meta" / f"{built.name.removesuffix('.conda')}.json").read_text())
    assert (prefix / "conda-meta" / f"{REPACKED}.json").is_file()  # the repacked file, not another pytorch
    pins = [d for d in meta["depends"] if d.split()[0] == "pytorch"]
    assert pins and all(p.startswith("pytorch ==2.13.0") for p in pins), meta["depends"]
    # the operator library links torch's own libraries by SONAME from the installed pytorch, no copy of them
    (library,) = (prefix / "lib" / f"python{PY}" / "site-packages" / "torchvision").glob("_C*.so")
    assert {"libtorch_cpu.so", "libc10.so"} <= set(read_elf(library).needed), read_elf(library).needed
    assert not [f for f in meta["files"] if f.rsplit("/", 1)[-1].startswith(("libtorch", "libc10"))], meta["files"]
    ran = subprocess.run([str(prefix / "bin" / "python"), "-W", "ignore", "-c", RUN], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin"}, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "ones_sum 7 torchvision 0.28.0" in ran.stdout, ran.stdout


def test_whether_the_stand_in_python_builds_wheels_does_not_depend_on_the_folder_it_is_asked_in(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A `wheel` folder where the command runs (a user's download folder) made the stand-in python's check find
    `wheel` and skip the real setuptools, and the companion's build then failed with "invalid command
    'bdist_wheel'": the check runs isolated."""
    from torchforge.extensions.standins import builds_wheels

    neutral = builds_wheels(PY)
    (tmp_path / "wheel").mkdir()
    monkeypatch.chdir(tmp_path)
    assert builds_wheels(PY) == neutral
