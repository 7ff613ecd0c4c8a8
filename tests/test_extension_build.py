"""An extension from its real PyPI sdist (torch-scatter 2.1.2, a CPU build) built for the real torch 2.13.0 CPU
wheel repacked by torchforge, through the pipeline's recipe step, with both engines: the package pins that
pytorch build exactly, installs next to it with py-rattler, and scatter_add / scatter_max agree with plain torch.

Channels: the repacked pytorch, and stand-ins for python (this machine's 3.11), pip and setuptools (metadata only:
the stand-in python sees this machine's site-packages, which hold them) and for what the base Python lacks
(`wheel`, `filelock`, `fsspec`), which carry the real modules from the torchcpu venv (tests/tool_venvs.py)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from filelock import FileLock
from packaging.utils import canonicalize_name

from tests.conftest import session_shared
from tests.kernel_stack import carried_stubs
from tests.rattler_in_child import solve_and_install
from tests.stack_env import stand_in_specs
from tests.tool_venvs import ensure
from torchforge.diagnose import explain_log
from torchforge.engines import Engine
from torchforge.engines.conda_build import CondaBuildEngine
from torchforge.engines.rattler_build import RattlerBuildEngine
from torchforge.extensions.metadata import read_metadata
from torchforge.extensions.recipe import ExtensionInputs, extension_recipe
from torchforge.havepytorch import in_channel
from torchforge.extensions.sdist import fetch, parse_spec
from torchforge.localchannel import index
from torchforge.flavours.base import Plan
from torchforge.pipeline import BuildSettings, Pipeline, StepResult, plan_steps
from torchforge.proc import Runner
from torchforge.binaries.stack import repack_stack
from torchforge.standin import make_stub_channel, write_stub

SCATTER = Path(__file__).parent / "fixtures" / "sdists" / "torch_scatter-2.1.2.tar.gz"
PY = f"{sys.version_info.major}.{sys.version_info.minor}"
# Real modules the stand-in python's own site-packages lacks: wheel (setuptools' bdist_wheel), and two of torch's
# import requirements.
CARRIED = ("wheel", "filelock", "fsspec")
CHECK = """
import torch, torch_scatter
src = torch.tensor([[2., 0., 1., 4., 3.], [0., 2., 1., 3., 4.]])
index = torch.tensor([[4, 5, 4, 2, 3], [0, 0, 2, 2, 1]])
out = torch_scatter.scatter_add(src, index, dim=-1, dim_size=6)
ref = torch.zeros(2, 6).scatter_add_(-1, index, src)
assert torch.equal(out, ref), (out, ref)
top, arg = torch_scatter.scatter_max(src, index, dim=-1, dim_size=6)
ref_max = torch.zeros(2, 6).scatter_reduce_(-1, index, src, "amax", include_self=False)
assert torch.equal(top, ref_max), (top, ref_max)
assert all(src[r, arg[r, c]] == top[r, c] for r in range(2) for c in range(6) if arg[r, c] < 5)
print("torch_scatter", torch_scatter.__version__, "ok against torch", torch.__version__)
"""

pytestmark = pytest.mark.skipif(PY != "3.11", reason="the torch 2.13.0 CPU wheel here is cp311")


@pytest.fixture(scope="module")
def channels(torch_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    shared = session_shared(tmp_path_factory) / "extension-channels"
    with FileLock(str(shared) + ".lock"):
        if not (shared / ".complete").exists():
            repack_stack([torch_wheel], shared / "torch", Runner())
            stand_ins(shared / "torch", shared / "stubs")
            (shared / ".complete").write_text("")
    return shared / "torch", shared / "stubs"


def stand_ins(torch_channel: Path, stubs: Path) -> None:
    """A stand-in channel for what the repacked pytorch and an extension's build require, carrying real modules."""
    site = ensure("torchcpu").parent / "lib" / f"python{PY}" / "site-packages"
    carried = carried_stubs(list(CARRIED), site, PY)  # and what they require (wheel: packaging)
    assert set(CARRIED) <= set(carried), (CARRIED, sorted(carried))
    specs = [s for s in stand_in_specs(torch_channel) if canonicalize_name(s.split()[0]) not in carried]
    make_stub_channel(stubs, sorted({*specs, "pip", "setuptools"}))
    for stub in carried.values():
        write_stub(stub, stubs / "linux-64")
    index(stubs)


# the xdist group of the suite's torch-scatter builds (`make test` runs -n 2 --dist loadgroup): on one worker, one
# after another, so the first fills scatter_compile_cache and the others take every object from it
SCATTER_BUILDS = "torch-scatter-builds"


def scatter_compile_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One compile cache for the suite's torch-scatter 2.1.2 builds against the repacked torch 2.13.0 (both engines
    here, the stack file's and the channel pytorch's builds): base_dir and hash_dir=false make an object compiled
    under one output folder a hit under another (torchforge/compilecache.py), so the session compiles it once.
    Each build still runs whole: recipe, engine, link, audit, package."""
    return session_shared(tmp_path_factory) / "torch-scatter-compile-cache"


def build(engine: Engine, channels: tuple[Path, Path], out: Path, tmp_path: Path,
          cache_root: Path | None = None) -> StepResult:
    torch_python = str(ensure("torchcpu") / "python")
    archive = fetch(parse_spec(str(SCATTER)), tmp_path / "sdist", torch_python, Runner())
    inputs = ExtensionInputs(archive, read_metadata(archive, torch_python, Runner(), tmp_path),
                             in_channel(channels[0], "linux-64"), "",
                             tuple(c.resolve().as_uri() for c in channels))
    recipe = extension_recipe(inputs, engine.recipe_format.value)
    settings = BuildSettings(out=out, cache_root=cache_root)
    # a build after another of the session's (either engine) takes every object from the cache: the wrappers
    # name both engines' host prefixes by one path (torchforge/compilecache.py, SITE_MAP)
    warm = cache_root is not None and any(cache_root.glob(f"{recipe.cache_group}/[0-9a-f]/*"))
    (result,) = Pipeline(engine, Runner(), settings).run(plan_steps(Plan("extension", (recipe,)), settings))
    if warm and result.ok:
        assert result.cache is not None and (result.cache.host.misses, result.cache.uncached) == (0, 0) \
            and result.cache.host.hits > 0, result.cache
    return result


def check_installed(result: StepResult, channels: tuple[Path, Path], out: Path, prefix: Path) -> None:
    assert result.ok, result.error + (result.log.read_text()[-4000:] if result.log else "")
    solve_and_install([out.resolve().as_uri(), *(c.resolve().as_uri() for c in channels)], ["torch-scatter"], prefix)
    meta = json.loads(next((prefix / "conda-meta").glob("torch-scatter-*.json")).read_text())
    (pin,) = [d for d in meta["depends"] if d.startswith("pytorch ")]
    assert pin in ("pytorch ==2.13.0 whl_py3.11_cpu_0", "pytorch ==2.13.0 whl_py3*11_cpu_0")  # conda-build, rattler
    assert meta["build"].startswith("pt2.13.0_cpu_") and meta["build"].endswith("_py311_0")
    assert (prefix / "conda-meta" / "pytorch-2.13.0-whl_py3.11_cpu_0.json").is_file()
    done = subprocess.run([str(prefix / "bin" / "python"), "-c", CHECK], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": ""})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "torch_scatter 2.1.2 ok against torch 2.13.0" in done.stdout


@pytest.mark.slow
@pytest.mark.xdist_group(SCATTER_BUILDS)
def test_torch_scatter_built_with_rattler_build_installs_and_runs(
        channels: tuple[Path, Path], tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    out = tmp_path / "out"
    result = build(RattlerBuildEngine(), channels, out, tmp_path, scatter_compile_cache(tmp_path_factory))
    check_installed(result, channels, out, tmp_path / "prefix")


@pytest.fixture()
def conda_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, str]:
    from tests.condabuild import HOW_TO_GET_ONE, find_conda_tool

    tool = find_conda_tool()
    if tool is None:
        pytest.skip(HOW_TO_GET_ONE)
    env = tool.env(tmp_path / "conda")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


@pytest.mark.slow
@pytest.mark.xdist_group(SCATTER_BUILDS)
def test_torch_scatter_built_with_conda_build_installs_and_runs(
        channels: tuple[Path, Path], conda_env: dict[str, str], tmp_path: Path,
        tmp_path_factory: pytest.TempPathFactory) -> None:
    out = tmp_path / "out"
    result = build(CondaBuildEngine(), channels, out, tmp_path, scatter_compile_cache(tmp_path_factory))
    check_installed(result, channels, out, tmp_path / "prefix")


# A setup.py that, like causal-conv1d's and mamba-ssm's without their switch, fetches a prebuilt wheel when pip
# builds it (and not while pip reads its metadata, which happens before the build, outside it).
# It also tries, first, what no proxy variable stops: a connection of its own to a socket the test listens on, and
# a file outside its folder (the build's pip runs in torchforge/isolation.py's namespaces).
DOWNLOADER = """import pathlib, socket, sys, urllib.request
from setuptools import setup
if "bdist_wheel" in sys.argv:
    for attempt in (lambda: socket.create_connection(("127.0.0.1", {port}), timeout=5),
                    lambda: pathlib.Path({outside!r}).write_text("written by setup.py")):
        try:
            attempt()
        except OSError as exc:
            print("setup.py:", exc)
    urllib.request.urlretrieve("https://pypi.org/simple/ninja/", "prebuilt.html")
setup(name="fetches-prebuilt", version="1.0", py_modules=["fetches_prebuilt"])
"""


def test_a_build_that_tries_the_network_fails_and_says_so(channels: tuple[Path, Path], tmp_path: Path) -> None:
    source = tmp_path / "fetches_prebuilt-1.0"
    source.mkdir()
    outside = tmp_path / "outside.txt"
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    (source / "setup.py").write_text(DOWNLOADER.format(port=listener.getsockname()[1], outside=str(outside)))
    (source / "fetches_prebuilt.py").write_text("VALUE = 1\n")
    torch_python = str(ensure("torchcpu") / "python")
    archive = fetch(parse_spec(str(source)), tmp_path / "sdist", torch_python, Runner())
    inputs = ExtensionInputs(archive, read_metadata(archive, torch_python, Runner(), tmp_path),
                             in_channel(channels[0], "linux-64"), "",
                             tuple(c.resolve().as_uri() for c in channels))
    engine = RattlerBuildEngine()
    settings = BuildSettings(out=tmp_path / "out")
    (result,) = Pipeline(engine, Runner(), settings).run(
        plan_steps(Plan("extension", (extension_recipe(inputs, engine.recipe_format.value),)), settings))
    assert not result.ok and result.log is not None
    log = result.log.read_text()
    assert "urllib.error.URLError: <urlopen error" in log and "no-network-at-build-time.invalid" in log
    # what `torchforge build` prints under a failed package: the diagnosis, with the fix
    assert "extension-download-blocked" in [d.id for d in explain_log(result.log)]
    assert not list((tmp_path / "out").glob("linux-64/fetches-prebuilt-*"))
    assert "setup.py: [Errno 101] Network is unreachable" in log and not outside.exists()
    with listener, pytest.raises(BlockingIOError):
        listener.accept()  # nothing connected


@pytest.mark.slow
def test_a_torchvision_like_kernel_miniature_built_for_the_repacked_torch_installs_and_runs(
        channels: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """tests/fixtures/vision_kernels (a real cpp_extension with a CPU op and a CUDA kernel) through the same
    recipe, here as a CPU build; tests/gpu/kernel_stack.sh runs the same tests/kernel_stack.py for CUDA on the
    GPU machine. Its requirements come from the torchcpu venv's real packages where it has them."""
    from tests import kernel_stack

    site = ensure("torchcpu").parent / "lib" / f"python{PY}" / "site-packages"
    assert kernel_stack.main([str(channels[0]), str(tmp_path / "k"), "--site", str(site),
                              "--torch-python", str(ensure("torchcpu") / "python")]) == 0
    printed = capsys.readouterr().out
    assert "pytorch in the channel: 2.13.0 whl_py3.11_cpu_0 (python 3.11, cuda None)" in printed
    assert "carried with their real files:" in printed and "setuptools" in printed and "typing_extensions" in printed
    assert "vision-kernels 0.1.0 pt2.13.0_cpu_" in printed and ", pytorch 2.13.0 whl_py3.11_cpu_0" in printed
    assert f"torch 2.13.0+cpu from {tmp_path / 'k' / 'prefix'}" in printed
    assert "vision_kernels built with torch 2.13.0 cuda None kernel False" in printed
    assert "cpu box_area ok: [6.0, 12.0, 1.0]" in printed
