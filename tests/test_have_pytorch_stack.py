"""The pytorch a team has, through the CLI only (issue 38): the real torch 2.13.0 CPU wheel repacked with
`torchforge repack`, then `torchforge build --for` that channel's pytorch makes torch-scatter 2.1.2 from its sdist,
`torchforge install` puts both into a fresh prefix next to a stand-in conda-forge channel, and scatter_add /
scatter_max agree with plain torch. Nothing here reaches the network: pip reads the sdist's metadata in the suite's
torch 2.13.0 venv, the stand-ins carry this machine's modules (tests/test_extension_build.py says which)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from filelock import FileLock

from tests.conftest import session_shared
from tests.test_extension_build import CHECK, PY, SCATTER, SCATTER_BUILDS, scatter_compile_cache, stand_ins
from tests.test_upload_helpers import cli
from tests.tool_venvs import ensure

# xdist_group: the suite's torch-scatter builds run one after another on one worker, the first filling the
# shared compile cache (tests.test_extension_build.scatter_compile_cache), the others taking every object from it
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group(SCATTER_BUILDS),
              pytest.mark.skipif(PY != "3.11", reason="the torch 2.13.0 CPU wheel here is cp311")]
REPACKED = f"pytorch-2.13.0-whl_py{PY}_cpu_0"


@pytest.fixture(scope="module")
def repacked(torch_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """`torchforge repack` of the wheel (once per session), and the stand-ins of what it and the build need."""
    shared = session_shared(tmp_path_factory) / "have-pytorch"
    with FileLock(str(shared) + ".lock"):
        if not (shared / ".complete").exists():
            done = cli("repack", str(torch_wheel), "--out", str(shared / "torch"), timeout=1200)
            assert done.returncode == 0, done.stderr[-3000:]
            stand_ins(shared / "torch", shared / "stubs")
            (shared / ".complete").write_text("")
    return shared / "torch", shared / "stubs"


def test_build_for_a_repacked_pytorch_makes_an_extension_that_installs_and_runs(
        repacked: tuple[Path, Path], tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    torch_channel, stubs = repacked
    cache = tmp_path / "cache" / "torchforge" / "extensions"
    cache.mkdir(parents=True)
    (cache / "metadata-torch-2.13.0").symlink_to(ensure("torchcpu").parent)  # the suite's torch 2.13.0 venv
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    out = tmp_path / "out"
    done = cli("build", "--for", "pytorch ==2.13.0 whl_*", "--channel", str(torch_channel), "--channel", str(stubs),
               "--extension", str(SCATTER), "--engine", "rattler-build", "--skip-preflight", "--out", str(out),
               "--cache", str(scatter_compile_cache(tmp_path_factory)),
               env=env, timeout=1800)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert f"building for {REPACKED}" in done.stderr and "no pytorch source build is planned" in done.stderr
    assert not list(out.glob("linux-64/pytorch-*")) and not list(out.glob("linux-64/libtorch-*"))
    (built,) = out.glob("linux-64/torch-scatter-2.1.2-pt2.13.0_cpu_*.conda")
    prefix = tmp_path / "prefix"
    done = cli("install", "torch-scatter", "--channel", str(out), "--channel", str(torch_channel), "--channel",
               str(stubs), "--prefix", str(prefix))
    assert done.returncode == 0, done.stderr[-3000:]
    meta = json.loads((prefix / "conda-meta" / f"{built.name.removesuffix('.conda')}.json").read_text())
    assert [d for d in meta["depends"] if d.startswith("pytorch ")] == [f"pytorch ==2.13.0 whl_py3*{PY[2:]}_cpu_0"]
    assert (prefix / "conda-meta" / f"{REPACKED}.json").is_file()
    ran = subprocess.run([str(prefix / "bin" / "python"), "-c", CHECK], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": ""})
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "torch_scatter 2.1.2 ok against torch 2.13.0" in ran.stdout
