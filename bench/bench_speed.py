"""Speed where teams wait (issue 42): an extension's second Python, a second runner through a shared cache server,
and the jobs and peak memory of one build.

- "extension, second Python": the CUDA objects of the kernel miniature (tests/fixtures/vision_kernels) as torch's
  cpp_extension compiles them for two real interpreters (this machine's CPython 3.11 and pyenv's 3.12), each with
  its own include folder and its own lib/pythonX.Y/site-packages holding the torch wheel's headers, in a fresh
  build folder per Python through the compile cache's nvcc wrapper; the second's time / the first's (goal: at most
  0.15). Needs nvcc on PATH.
- "second runner with the shared cache": the torch_heavy fixture (tests/fixtures/torch_heavy) built through the
  pytorch recipe (rattler-build) into two clean output folders, each with its own empty local cache, both with a
  loopback HTTP cache server (tests/test_remote_cache.py's store): the second's time / the first's, and its
  share of objects from the server.
- "jobs and peak memory": that first build's MAX_JOBS (chosen from memory and its package's budget) and the
  peak memory of its largest process.

`--quick`: 3 C++ units, one Python pair: it shows the benchmark runs, not figures.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

from bench import Row

if TYPE_CHECKING:
    from torchforge.pipeline import StepResult
    from torchforge.remotecache import RemoteCache

ROOT = Path(__file__).resolve().parent.parent
KERNELS = ROOT / "tests" / "fixtures" / "vision_kernels"
HEAVY = ROOT / "tests" / "fixtures" / "torch_heavy"
SECOND_PYTHON = "/root/.pyenv/versions/3.12.*/bin/python3.12"


def _interpreters() -> list[str]:
    found = sorted(glob.glob(SECOND_PYTHON))
    return [sys.executable, found[-1]] if found else []


def _torch_wheel() -> Path | None:
    found = sorted((ROOT / ".cache" / "torchforge-tests").glob("torch-*-wheel/torch-*.whl"))
    return found[0] if found else None


def _cuda_objects(python: str, staging: Path, cache: object, wheel: Path) -> float:
    """One Python's build of the miniature's CUDA objects, with cpp_extension's include folders for it."""
    from torchforge.compilecache import CompileCache

    assert isinstance(cache, CompileCache)
    include, tag = subprocess.run([python, "-c", "import sys, sysconfig; print(sysconfig.get_paths()['include']); "
                                   "print(f'{sys.version_info[0]}.{sys.version_info[1]}')"],
                                  capture_output=True, text=True, check=True).stdout.split()
    site = staging / "host" / "lib" / f"python{tag}" / "site-packages"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site, [n for n in archive.namelist() if n.startswith("torch/include/c10/")])
    work = staging / "work"
    shutil.copytree(KERNELS / "csrc", work / "csrc")
    objects = work / f"build/temp.linux-x86_64-cpython-{tag.replace('.', '')}/csrc"
    objects.mkdir(parents=True)
    env = {**os.environ, **cache.build_env(staging, staging / "ccache-stats.log")}
    torch_include = site / "torch" / "include"
    started = time.monotonic()
    subprocess.run([env["CUDA_NVCC_EXECUTABLE"], "--generate-dependencies-with-compile", "--dependency-output",
                    f"{objects}/box_area_cuda.o.d", f"-I{torch_include}", f"-I{torch_include}/torch/csrc/api/include",
                    f"-I{include}", "-c", str(work / "csrc" / "box_area_cuda.cu"), "-o", f"{objects}/box_area_cuda.o",
                    "-D__CUDA_NO_HALF_OPERATORS__", "--expt-relaxed-constexpr", "--compiler-options", "'-fPIC'",
                    "-DTORCH_EXTENSION_NAME=_C", "-gencode=arch=compute_90,code=sm_90", "-std=c++17"],
                   cwd=work, env=env, check=True, capture_output=True)
    return time.monotonic() - started


def _second_python(tmp: Path) -> list[Row]:
    from tests.test_build import NVCC_RELEASE, nvcc_release
    from torchforge.compilecache import CompileCache, find_ccache, read_stats

    measure = "extension, second Python (vision_kernels' CUDA objects): 2nd / 1st"
    pythons, wheel, ccache = _interpreters(), _torch_wheel(), find_ccache()
    if nvcc_release() != NVCC_RELEASE or len(pythons) < 2 or wheel is None or ccache is None:
        return [Row("speed", measure, "-", skipped=f"needs nvcc {NVCC_RELEASE}, {SECOND_PYTHON}, the torch wheel of "
                    "the test cache (run tests/test_compile_once.py once) and ccache")]
    cache = CompileCache(tmp / "cache", "vision-kernels-0.1.0-cu130-linux_64-0", ccache)
    cache.prepare()
    seconds = []
    for number, python in enumerate(pythons):
        staging = tmp / f"python{number}" / "staging"
        seconds.append(_cuda_objects(python, staging, cache, wheel))
        hits = read_stats(staging / "ccache-stats.log").hits
        shutil.rmtree(staging.parent)
    return [Row("speed", measure, f"{seconds[1] / seconds[0]:.3f}",
                f"{seconds[0]:.2f} s then {seconds[1]:.2f} s ({hits} hit); {pythons[0]} then "
                f"{pythons[1]}; {_load()}")]


def _heavy_build(out: Path, stubs: Path, remote: RemoteCache | None, quick: bool) -> StepResult:
    from torchforge.channels import SiteChannels
    from torchforge.engines.rattler_build import RattlerBuildEngine
    from torchforge.pipeline import BuildSettings, Pipeline
    from torchforge.proc import Runner
    from torchforge.flavours.official.render import plan
    from torchforge.sequence import official_steps
    from torchforge.flavours.official.variant import Options, Selection

    engine = RattlerBuildEngine()
    selection = Selection.from_flags("2.9.0", "cpu", "3.11", None, Options(
        source=str(HEAVY), extra_env=(("TORCH_HEAVY_TUS", "3" if quick else os.environ.get("TORCH_HEAVY_TUS", "40")),)))
    settings = BuildSettings(out=out, site_channels=SiteChannels(replace=(f"file://{stubs}",)), size_jobs=True,
                             extra_env={"MAX_JOBS": str(os.cpu_count() or 1)}, remote_cache=remote)
    (result,) = [r for r in Pipeline(engine, Runner(), settings).run(official_steps(plan(selection), engine, settings))
                 if r.step.kind == "pytorch"]
    return result


def _shared_cache(tmp: Path, quick: bool) -> list[Row]:
    from tests.stubchannel import make_stub_channel, recipe_requirements
    from tests.test_remote_cache import serve
    from torchforge.flavours.official.recipe import pytorch_context
    from torchforge.remotecache import remote_cache
    from torchforge.flavours.official.render import plan
    from torchforge.templates import RecipeFormat
    from torchforge.flavours.official.render import render_files
    from torchforge.flavours.official.variant import Options, Selection

    selection = Selection.from_flags("2.9.0", "cpu", "3.11", None, Options(source=str(HEAVY)))
    specs = [spec for variant in plan(selection).variants
             for spec in recipe_requirements(render_files(pytorch_context(variant), RecipeFormat.RATTLER_BUILD)["recipe.yaml"])]
    stubs = tmp / "stubs"
    make_stub_channel(stubs, [*specs, "pip"], python_alias=True)
    with serve() as (url, _):
        first = _heavy_build(tmp / "runner1" / "channel", stubs, remote_cache(url), quick)
        second = _heavy_build(tmp / "runner2" / "channel", stubs, remote_cache(url), quick)
    if not (first.ok and second.ok):
        failed = first if not first.ok else second
        return [Row("speed", "second runner with the shared cache", "-", failed.error.splitlines()[0][:120], ok=False)]
    assert second.cache is not None and second.cache.remote is not None
    objects = second.cache.host.total + second.cache.cuda.total
    return [Row("speed", "second runner with the shared cache: 2nd / 1st (cold)", f"{second.seconds / first.seconds:.3f}",
                f"{first.seconds:.0f} s cold, {second.seconds:.0f} s; objects from the server "
                f"{second.cache.remote.hits}/{objects}; {second.cache.summary()}; {_load()}"),
            Row("speed", "one build: planned jobs, peak memory",
                f"MAX_JOBS {first.jobs}, {first.peak_rss_kib / 1024**2:.2f} GiB",
                "torch_heavy; the largest process of the build (wait4); the log says how the jobs were chosen")]


def _load() -> str:
    return "load average {:.1f} {:.1f} {:.1f}".format(*os.getloadavg())


def run(quick: bool = False) -> list[Row]:
    sys.path.insert(0, str(ROOT))  # tests/ helpers: the stand-in channel, the cache server
    with tempfile.TemporaryDirectory(prefix="bench-speed-") as tmp_name:
        tmp = Path(tmp_name)
        return _second_python(tmp / "pythons") + _shared_cache(tmp / "shared", quick)
