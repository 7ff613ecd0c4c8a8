"""On which GPUs a CUDA package runs, as CEP 46's `__cuda_arch` sees them, from the device code really in it.

CEP 46 (conda/ceps@04652ad0:cep-0046.md) defines `__cuda_arch`: the lowest compute capability of the machine's
GPUs as `{major}.{minor}`, absent where no GPU (or no `__cuda`) is seen, overridden by `CONDA_OVERRIDE_CUDA_ARCH`.
A package built here says where it runs with a `constrains` entry on `__cuda_arch`, never a `depends`: a run
constraint binds only where the virtual package is present, so a CPU runner or a solver without `__cuda_arch`
still installs it, while a solver on a GPU outside its code refuses it. conda-forge's `cuda-arch` metapackage
(conda-incubator/nvidia-virtual-packages README: `run: __cuda_arch >=X`) expresses only a lower bound, right for
PTX but not for SASS, which runs on its own major only; and depending on it would need `__cuda_arch` everywhere.

The rule (CUDA's compatibility, as torchforge.binaries.devicecode.runs_on): SASS for X.y runs on X.z, z >= y (an
arch-specific `sm_90a` on 9.0 only); PTX for X.y on every GPU from X.y up (`a` PTX on X.y only). A package runs
where one of its libraries has code: NVIDIA's component packages hold helper libraries whose few kernels are for
one GPU (the CUDA 13 `libcufftw.so.12`: a single sm_75 cubin, read on the H200) beside the library that does the
work (`libcufft.so.12`: sm_75 to sm_120), so "every library" refused cuFFT on every GPU but sm_75. Whether every
library torchforge compiles holds the whole arch list is the build's arch check (torchforge.archcheck).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from torchforge import fatbin

_SM = re.compile(r"^sm_(\d+?)(\d)([af]?)$")
NAME = "__cuda_arch"
_NEVER = (10**6, 0)  # above every compute capability: an interval's open end
Interval = tuple[tuple[int, int], tuple[int, int]]  # [low, high) of (major, minor)


def _cc(arch: str) -> tuple[int, int, str] | None:
    found = _SM.match(arch)
    return (int(found.group(1)), int(found.group(2)), found.group(3)) if found else None


def runs_on(sass: Iterable[str], ptx: Iterable[str]) -> list[Interval]:
    """The compute capabilities one library's code runs on, as merged [low, high) intervals."""
    spans: list[Interval] = []
    for arch in sass:
        if cc := _cc(arch):
            major, minor, variant = cc
            spans.append(((major, minor), (major, minor + 1) if variant == "a" else (major + 1, 0)))
    for arch in ptx:
        if cc := _cc(arch):
            major, minor, variant = cc
            spans.append(((major, minor), (major, minor + 1) if variant == "a" else _NEVER))
    return _merge(spans)


def _merge(spans: list[Interval]) -> list[Interval]:
    merged: list[Interval] = []
    for low, high in sorted(spans):
        if merged and low <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], high))
        else:
            merged.append((low, high))
    return merged


def spec(libraries: Iterable[fatbin.DeviceCode]) -> str | None:
    """`__cuda_arch >=9.0,<10.0`: where one of the package's libraries has code that runs; None without any."""
    where = _merge([span for code in libraries for span in runs_on(code.sass, code.ptx)])
    if not where:
        return None
    return f"{NAME} " + "|".join(f">={_v(low)}" + ("" if high == _NEVER else f",<{_v(high)}") for low, high in where)


def _v(cc: tuple[int, int]) -> str:
    return f"{cc[0]}.{cc[1]}"


def with_constraint(constrains: Iterable[str], constraint: str | None) -> list[str]:
    """`constrains` with the package's `__cuda_arch` entry replaced by `constraint` (kept out where None)."""
    kept = [c for c in constrains if c.split()[0] != NAME]
    return kept + ([constraint] if constraint else [])
