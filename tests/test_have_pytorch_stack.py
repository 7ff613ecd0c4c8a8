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
from tests.test_closure import WHEELS
from tests.test_upload_helpers import cli
from tests.tool_venvs import ensure

# xdist_group: the suite's torch-scatter builds run one after another on one worker, the first filling the
# shared compile cache (tests.test_extension_build.scatter_compile_cache), the others taking every object from it
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group(SCATTER_BUILDS),
              pytest.mark.skipif(PY != "3.11", reason="the torch 2.13.0 CPU wheel here is cp311")]
REPACKED = f"pytorch-2.13.0-whl_py{PY}_cpu_0"


@pytest.fixture(scope="module")
def repacked(torch_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return repacked_once(torch_wheel, tmp_path_factory)


def repacked_once(torch_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
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


RECORDER_SETUP = '''\
import os
from pathlib import Path
from setuptools import setup

# what the build gave this package's setup.py: the team's variable, and that torchforge's own are still set
Path("recorded_env").mkdir(exist_ok=True)
Path("recorded_env/__init__.py").write_text(
    f"TEAM_SWITCH = {os.environ.get('TEAM_SWITCH')!r}\\nNO_INDEX = {os.environ.get('PIP_NO_INDEX')!r}\\n")
setup(packages=["recorded_env"])
'''
RECORDER_PROJECT = '''\
[build-system]
requires = ["setuptools", "wheel"]
build-backend = "setuptools.build_meta"

[project]
name = "recorded-env"
version = "1.0"
dependencies = ["sortedcollections>=2"]
'''


def test_an_extensions_own_build_variable_reaches_its_build_and_its_requirement_is_brought_along(
        repacked: tuple[Path, Path], tmp_path: Path) -> None:
    """`--extension-env recorded-env:TEAM_SWITCH=on` with the real rattler-build: the setup.py saw the value (and
    torchforge's own PIP_NO_INDEX beside it), and the package is the one `matrix` names with that variable. The
    sdist requires sortedcollections, which no channel has: with `--wheels` (real PyPI wheels) the build repacks it
    and sortedcontainers, which it requires in turn, into --out before the extension builds, and `torchforge
    install recorded-env` solves all three into a fresh prefix (before: the extension's package required a name no
    channel had, and only an install found out)."""
    import tarfile
    torch_channel, stubs = repacked
    tree = tmp_path / "recorded-env-1.0"
    tree.mkdir()
    (tree / "setup.py").write_text(RECORDER_SETUP)
    (tree / "pyproject.toml").write_text(RECORDER_PROJECT)
    (tree / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: recorded-env\nVersion: 1.0\n")
    sdist = tmp_path / "recorded_env-1.0.tar.gz"
    with tarfile.open(sdist, "w:gz") as archive:
        archive.add(tree, arcname=tree.name)
    flags = ("--for", "pytorch ==2.13.0 whl_*", "--channel", str(torch_channel), "--channel", str(stubs),
             "--extension", str(sdist), "--extension-env", "recorded-env:TEAM_SWITCH=on")
    matrix = cli("matrix", *flags, "--json")
    assert matrix.returncode == 0, matrix.stderr
    stem = json.loads(matrix.stdout)[-1]["id"]
    out = tmp_path / "out"
    done = cli("build", *flags, "--wheels", str(WHEELS), "--engine", "rattler-build", "--skip-preflight",
               "--no-cache", "--out", str(out), env={"XDG_CACHE_HOME": str(tmp_path / "cache")}, timeout=1200)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    (built,) = out.glob("linux-64/recorded-env-1.0-*.conda")
    assert built.name == f"{stem}.conda"
    said = " ".join(done.stderr.split())
    assert f"brought along: {out / 'linux-64' / 'sortedcollections-2.1.0-whl_py'}" in said, said[-3000:]
    brought = sorted(p.name for p in out.glob("linux-64/sorted*.conda"))
    assert brought == [f"sortedcollections-2.1.0-whl_py{PY}_0.conda", f"sortedcontainers-2.4.0-whl_py{PY}_0.conda"]
    prefix = tmp_path / "prefix"
    installed = cli("install", "recorded-env", "--channel", str(out), "--channel", str(torch_channel), "--channel",
                    str(stubs), "--prefix", str(prefix))
    assert installed.returncode == 0, installed.stderr[-3000:]
    assert {p.name.rsplit("-", 2)[0] for p in (prefix / "conda-meta").glob("*.json")} >= \
        {"recorded-env", "sortedcollections", "sortedcontainers", "pytorch"}
    from conda_package_streaming.package_streaming import stream_conda_component
    recorded = about = ""
    with built.open("rb") as handle:
        for tar, member in stream_conda_component(built.name, handle, "pkg"):
            if member.name.endswith("recorded_env/__init__.py"):
                recorded = tar.extractfile(member).read().decode()
    with built.open("rb") as handle:
        for tar, member in stream_conda_component(built.name, handle, "info"):
            if member.name == "info/about.json":
                about = tar.extractfile(member).read().decode()
    assert "TEAM_SWITCH = 'on'" in recorded and "NO_INDEX = '1'" in recorded, recorded
    settings = json.loads(json.loads(about)["extra"]["torchforge_settings"])
    assert settings["variables"] == {"TEAM_SWITCH": "on"}
