"""Compile once for all Pythons (torchforge/compilecache.py): an extension's or companion's cache group is the same
for every Python of one pytorch release, CUDA, arch list and platform (one key function for every recipe), and a
second Python's compiles hit the first one's objects although each names the torch headers of its own
lib/python3.X/site-packages (the wrappers' link)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.test_build import needs_nvcc
from torchforge.compilecache import COMPILERS_VARIABLE, CompileCache, find_ccache, read_stats
from torchforge.extensions.recipe import PytorchBuild, cache_group, settings_of

# The pytorch builds of one channel: the repacked CPU wheel's for two Pythons, and the same release for CUDA.
CPU_311 = PytorchBuild("2.13.0", "whl_py3.11_cpu_0", "linux-64", "3.11", None)
CPU_312 = dataclasses.replace(CPU_311, build="whl_py3.12_cpu_0", python="3.12")
CUDA_311 = PytorchBuild("2.13.0", "whl_py3.11_cuda13.0_0", "linux-64", "3.11", "13.0")
CUDA_312 = dataclasses.replace(CUDA_311, build="whl_py3.12_cuda13.0_0", python="3.12")
SDIST = "torch-scatter==2.1.2"


def _group(pytorch: PytorchBuild, arch_list: str = "", sdist: str = SDIST) -> str:
    return cache_group(settings_of("torch-scatter", "2.1.2", sdist, pytorch, arch_list), pytorch)


def test_an_extension_has_one_cache_group_for_every_python_and_another_for_what_changes_objects() -> None:
    assert _group(CPU_311) == _group(CPU_312)
    assert _group(CUDA_311, "9.0") == _group(CUDA_312, "9.0")
    assert _group(CUDA_311, "9.0").startswith("torch-scatter-2.1.2-cu130-linux_64-")
    assert len({_group(CPU_311), _group(CUDA_311, "9.0"), _group(CUDA_311, "8.0;9.0"),
                _group(dataclasses.replace(CUDA_311, version="2.12.0"), "9.0"),
                _group(CUDA_311, "9.0", sdist="sha256:" + "0" * 64)}) == 5


def test_the_official_companions_of_two_pythons_share_one_group() -> None:
    from torchforge.flavours.base import Request
    from torchforge.sequence import plan

    recipes = plan("official", Request("2.5.1", "12.4", "3.11,3.12", "linux-64", with_packages=("torchvision",)),
                   "rattler-build").recipes
    groups = {r.python: r.cache_group for r in recipes if r.kind == "torchvision"}
    assert set(groups) == {"3.11", "3.12"} and groups["3.11"] == groups["3.12"] is not None
    assert groups["3.11"].startswith("torchvision-0.20.1-cu124-linux_64-")
    pytorch = {r.python: r.cache_group for r in recipes if r.kind == "pytorch"}
    assert pytorch["3.11"] == pytorch["3.12"] != groups["3.11"]


def _host_prefix(root: Path, python: str, wheel: Path) -> Path:
    """A build's host prefix as the engine makes it: the real torch headers of the wheel (c10's and torch's
    header-only macros) under lib/pythonX.Y/site-packages/torch/include."""
    site = root / "host" / "lib" / f"python{python}" / "site-packages"
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if name.startswith(("torch/include/c10/macros/", "torch/include/torch/headeronly/")):
                archive.extract(name, site)
    return site / "torch" / "include"


KERNEL = """#include <c10/macros/Macros.h>
__global__ void scale(float* x) { x[threadIdx.x] *= 2.0f; }
C10_API int launch(float* x) { scale<<<1, 32>>>(x); return 0; }
"""
HOST = "#include <c10/macros/Macros.h>\nC10_API int answer() { return 42; }\n"


def _build(staging: Path, cache: CompileCache, python: str, wheel: Path) -> tuple[int, int]:
    """One Python's compiles in its own build folder (the pipeline's staging): the kernel through the nvcc wrapper
    (torch's cpp_extension runs it as PYTORCH_NVCC), the C++ file through the CC wrapper route.sh makes, each with
    -I naming this Python's torch headers; (hits, misses) of ccache."""
    include = _host_prefix(staging, python, wheel)
    work = staging / "work"
    work.mkdir(parents=True)
    (work / "kernel.cu").write_text(KERNEL)
    (work / "host.cpp").write_text(HOST)
    stats_log = staging / "ccache-stats.log"
    env = {**{k: v for k, v in os.environ.items() if k not in ("CC", "CXX")}, **cache.build_env(staging, stats_log),
           "PYTHON": sys.executable}
    cxx = subprocess.run(["bash", "-euc", f'. "{env[COMPILERS_VARIABLE]}/route.sh"; printf "%s" "$CXX"'], env=env,
                         capture_output=True, text=True, check=True).stdout.split()[0]
    objects = work / f"build/temp.linux-x86_64-cpython-{python.replace('.', '')}"
    objects.mkdir(parents=True)
    for argv in ([env["CUDA_NVCC_EXECUTABLE"], "--generate-dependencies-with-compile", "--dependency-output",
                  f"{objects}/kernel.o.d", f"-I{include}", "-c", str(work / "kernel.cu"), "-o", f"{objects}/kernel.o",
                  "-gencode", "arch=compute_90,code=sm_90", "--compiler-options", "-fPIC", "-std=c++17"],
                 [cxx, "-MMD", "-MF", f"{objects}/host.o.d", "-I", str(include), "-fPIC", "-c", str(work / "host.cpp"),
                  "-o", f"{objects}/host.o"]):
        subprocess.run(argv, cwd=work, env=env, check=True)
    stats = read_stats(stats_log)
    return stats.hits, stats.misses


@needs_nvcc
def test_a_second_pythons_compiles_hit_the_first_ones_objects(torch_wheel: Path, tmp_path: Path) -> None:
    """Two builds of one group, each in a fresh folder with its own Python's host prefix: the second's CUDA and C++
    objects are hits, although the headers lie under lib/python3.12 instead of lib/python3.11; without the
    wrappers' link the preprocessed sources differ in every header's path and both miss (seen by hand)."""
    ccache = find_ccache()
    assert ccache is not None
    cache = CompileCache(tmp_path / "cache", "torch-scatter-2.1.2-cu130-linux_64-0", ccache)
    cache.prepare()
    assert _build(tmp_path / "first" / "staging", cache, "3.11", torch_wheel) == (0, 2)
    shutil.rmtree(tmp_path / "first")  # the pipeline removes a build's staging folder after it
    assert _build(tmp_path / "second" / "staging", cache, "3.12", torch_wheel) == (2, 0)
