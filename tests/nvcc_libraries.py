"""Shared libraries the real nvcc 13.0 builds here, once (all xdist workers and later sessions share them): the
device code each holds is known from its own -gencode flags, which the readers under test are checked against."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from tests.conftest import cached
from tests.test_build import nvcc_release

KERNEL = """
__global__ void add_one(float *x, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] += 1; }
extern "C" void launch(float *x, int n) { add_one<<<(n + 255) / 256, 256>>>(x, n); }
"""

# library -> nvcc flags; the -gencode lists are what each library must be read to hold
LIBRARIES: dict[str, tuple[str, ...]] = {
    "sass90": ("-gencode", "arch=compute_90,code=sm_90"),
    "sass90_ptx90": ("-gencode", "arch=compute_90,code=[sm_90,compute_90]"),
    "ptx80": ("-gencode", "arch=compute_80,code=compute_80"),
    "sass86": ("-gencode", "arch=compute_86,code=sm_86"),
    "arch90a": ("-arch=sm_90a",),
    "several_compressed": ("-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=[sm_90,compute_90]",
                           "-gencode", "arch=compute_100,code=sm_100", "-Xfatbin", "-compress-all"),
    "several_plain": ("-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=[sm_90,compute_90]",
                      "-gencode", "arch=compute_100,code=sm_100", "-Xfatbin", "-compress=false"),
}
# sass90's fatbin moved out of .nv_fatbin, as NVIDIA's CUDA 13 libcufft keeps most of its code in .ldata
MOVED = "in_ldata"


def gencode_code(flags: tuple[str, ...]) -> tuple[set[str], set[str]]:
    """(SASS, PTX) archs nvcc was asked for: `code=sm_X` is SASS, `code=compute_X` PTX; `-arch=sm_X` is both."""
    sass, ptx = set(), set()
    for flag in flags:
        if flag.startswith("-arch=sm_"):
            sass.add(flag.removeprefix("-arch="))
            ptx.add(flag.removeprefix("-arch="))
        for code in flag.partition("code=")[2].strip("[]").split(","):
            if code.startswith("sm_"):
                sass.add(code)
            elif code.startswith("compute_"):
                ptx.add("sm_" + code.removeprefix("compute_"))
    return sass, ptx


def nvcc_library(folder: Path, name: str, flags: tuple[str, ...]) -> Path:
    source = folder / f"{name}.cu"
    source.write_text(KERNEL)
    out = folder / f"lib{name}.so"
    subprocess.run(["nvcc", "-shared", "-Xcompiler", "-fPIC", *flags, str(source), "-o", str(out)], check=True,
                   capture_output=True)
    source.unlink()
    return out


def _build(folder: Path) -> None:
    for name, flags in LIBRARIES.items():
        nvcc_library(folder, name, flags)
    subprocess.run(["objcopy", "--rename-section", ".nv_fatbin=.ldata", str(folder / "libsass90.so"),
                    str(folder / f"lib{MOVED}.so")], check=True, capture_output=True)


@pytest.fixture(scope="session")
def nvcc_libraries() -> Path:
    """The folder of lib<name>.so for each of LIBRARIES, and lib<MOVED>.so: built once (no torchforge code makes
    them), under a name that changes with the kernel, the flags and the nvcc release."""
    release = nvcc_release()
    if release is None:
        pytest.skip("needs nvcc on PATH")
    key = hashlib.sha256(repr((KERNEL, sorted(LIBRARIES.items()), MOVED, release)).encode()).hexdigest()[:12]
    return cached(f"nvcc-libraries-{key}", _build)
