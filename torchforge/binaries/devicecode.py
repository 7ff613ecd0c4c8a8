"""Can the GPU run every installed package's CUDA code? For each conda package of a prefix, every ELF file it
installed that carries device code is listed with cuobjdump (torchforge.archcheck) and must hold code the GPU
runs: SASS of its arch or an older one of the same major version, or PTX the driver compiles for it. torch's
own `get_arch_list()` says nothing about torchvision's or an extension's libraries; upstream's cu128 wheels once
lacked sm_100/sm_120 in torchvision and torchaudio only (pytorch/test-infra#6273).

The GPU's arch comes from `--gpu-arch`, else from torch on the GPU (the probe), else from `nvidia-smi`.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from torchforge.archcheck import device_code, find_cuobjdump, has_device_code
from torchforge.elf import maybe_elf
from torchforge.errors import UsageError
from torchforge.proc import Command, Runner

_GPU_ARCH = re.compile(r"^(\d+)\.(\d+)$")
_SM = re.compile(r"^sm_(\d+?)(\d)([af]?)$")


@dataclass(frozen=True)
class GpuArch:
    major: int
    minor: int
    source: str  # where it was read: --gpu-arch, torch, nvidia-smi

    @property
    def name(self) -> str:
        return f"sm_{self.major}{self.minor}"


@dataclass(frozen=True)
class PackageCoverage:
    package: str  # name-version-build
    libraries: int  # files with device code
    lacking: tuple[str, ...]  # files (relative to the prefix) with no code this GPU runs


def parse_gpu_arch(text: str, source: str) -> GpuArch:
    found = _GPU_ARCH.match(text.strip())
    if found is None:
        raise UsageError(f"--gpu-arch {text!r} is not a compute capability MAJOR.MINOR",
                         "give the GPU's compute capability as nvidia-smi --query-gpu=compute_cap prints it, e.g. 9.0")
    return GpuArch(int(found.group(1)), int(found.group(2)), source)


def detected_gpu_arch(report: dict[str, object], runner: Runner) -> GpuArch | None:
    """torch's view of GPU 0 (the probe's report), else nvidia-smi's first GPU; None where neither sees one."""
    capability = report.get("capability")
    if isinstance(capability, list) and len(capability) == 2:
        return GpuArch(int(capability[0]), int(capability[1]), "torch")
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    result = runner.run(Command((smi, "--query-gpu=compute_cap", "--format=csv,noheader")), check=False)
    first = next((line.strip() for line in result.output.splitlines() if _GPU_ARCH.match(line.strip())), None)
    return parse_gpu_arch(first, "nvidia-smi") if result.returncode == 0 and first else None


def runs_on(gpu: GpuArch, sass: set[str], ptx: set[str]) -> bool:
    """CUDA's binary compatibility: SASS for X.y runs on X.z with z >= y (an `a` variant only on X.y itself);
    PTX for an arch at or below the GPU's is compiled for it by the driver."""
    for arch in sass:
        found = _SM.match(arch)
        if found and int(found.group(1)) == gpu.major and (
                int(found.group(2)) == gpu.minor or (found.group(3) != "a" and int(found.group(2)) < gpu.minor)):
            return True
    for arch in ptx:
        found = _SM.match(arch)
        if found and (int(found.group(1)), int(found.group(2))) <= (gpu.major, gpu.minor) and (
                found.group(3) != "a" or (int(found.group(1)), int(found.group(2))) == (gpu.major, gpu.minor)):
            return True
    return False


def installed_packages(prefix: Path) -> list[tuple[str, list[str]]]:
    """(name-version-build, files) of every package in conda-meta, sorted."""
    found = []
    for record in sorted((prefix / "conda-meta").glob("*.json")):
        meta = json.loads(record.read_text("utf-8"))
        files = meta.get("files", [])
        found.append((record.stem, [f for f in files if isinstance(f, str)]))
    return found


def coverage(prefix: Path, gpu: GpuArch, runner: Runner) -> list[PackageCoverage]:
    """Every installed package with device code, and its files with no code the GPU runs."""
    tool: Path | None = None
    covered: list[PackageCoverage] = []
    for package, files in installed_packages(prefix):
        libraries = [f for f in files if maybe_elf(Path(f)) and _inside(prefix, f) and has_device_code(prefix / f)]
        if not libraries:
            continue
        # looked for only once a package has device code: a CPU prefix needs no CUDA toolkit to be verified
        tool = tool or find_cuobjdump()
        lacking = tuple(f for f in libraries if not runs_on(gpu, *device_code(prefix / f, runner, tool)))
        covered.append(PackageCoverage(package, len(libraries), lacking))
    return covered


def _inside(prefix: Path, relative: str) -> bool:
    """A regular file the record names inside the prefix (a record is read, never trusted to point elsewhere)."""
    path = Path(relative)
    if path.is_absolute() or ".." in path.parts:
        return False
    full = prefix / path
    return full.is_file() and not full.is_symlink()
