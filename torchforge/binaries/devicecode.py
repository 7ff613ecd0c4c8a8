"""Can the GPU run every installed package's CUDA code? For each conda package of a prefix, every ELF file it
installed that carries device code is read by torchforge.fatbin (every section's fatbins, not only `.nv_fatbin`:
CUDA 13's libcufft keeps its code in `.ldata`) and must hold code the GPU runs: SASS of its arch or an older one of the same major version, or PTX the driver compiles for it. torch's
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

from torchforge import fatbin
from torchforge.elf import maybe_elf
from torchforge.errors import ToolTimeoutError, UsageError
from torchforge.proc import Command, Runner

SMI_TIMEOUT_S = 30.0  # nvidia-smi answers in well under a second; a hung driver must not hang verify
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
    not_listable: tuple[str, ...] = ()  # files whose fatbins could not be read: shown, never failed by that alone
    found: tuple[str, ...] = ()  # per library: what it holds for the GPU (`lib/x.so: cubin sm_90 x393 in .ldata`)


@dataclass(frozen=True)
class Record:
    """One conda-meta record, or why it could not be read (a row of its own, never a crash)."""

    package: str  # the record's file name without .json: name-version-build
    name: str
    files: tuple[str, ...]
    problem: str | None = None


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
    try:
        result = runner.run(Command((smi, "--query-gpu=compute_cap", "--format=csv,noheader"), own_group=True),
                            check=False, timeout=SMI_TIMEOUT_S)
    except ToolTimeoutError:
        return None  # a driver that does not answer: no arch to check against (said by the missing rows)
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


def read_records(prefix: Path) -> list[Record]:
    """Every conda-meta/*.json record, sorted; one that is unreadable, not JSON or not an object carries why."""
    found = []
    for path in sorted((prefix / "conda-meta").glob("*.json")):
        try:
            meta = json.loads(path.read_text("utf-8"))
        except (OSError, UnicodeDecodeError) as exc:
            found.append(Record(path.stem, "", (), f"cannot be read: {getattr(exc, 'strerror', None) or exc}"))
            continue
        except json.JSONDecodeError as exc:
            found.append(Record(path.stem, "", (), f"is not valid JSON (line {exc.lineno}, column {exc.colno}: "
                                                   f"{exc.msg})"))
            continue
        if not isinstance(meta, dict):
            found.append(Record(path.stem, "", (), f"is a JSON {type(meta).__name__}, not a package record (an "
                                                   "object with name and files)"))
            continue
        files = meta.get("files", [])
        name = meta.get("name")
        found.append(Record(path.stem, name if isinstance(name, str) else "",
                            tuple(f for f in files if isinstance(f, str)) if isinstance(files, list) else ()))
    return found


def coverage(prefix: Path, gpu: GpuArch) -> list[PackageCoverage]:
    """Every installed package with device code: its files with no code the GPU runs, and those not listable."""
    covered: list[PackageCoverage] = []
    for record in read_records(prefix):
        if record.problem:
            continue
        lacking, unlistable, found = [], [], []
        for relative in record.files:
            if not (maybe_elf(Path(relative)) and _inside(prefix, relative)):
                continue
            code = fatbin.read(prefix / relative)
            if not code.present:
                continue
            if not code.entries:
                unlistable.append(f"{relative} ({'; '.join(code.unreadable)})")
            elif runs_on(gpu, code.sass, code.ptx):
                found.append(f"{relative}: {_for_gpu(code, gpu)}")
            else:
                lacking.append(relative)
        if lacking or unlistable or found:
            covered.append(PackageCoverage(record.package, len(lacking) + len(unlistable) + len(found),
                                           tuple(lacking), tuple(unlistable), tuple(found)))
    return covered


def _for_gpu(code: fatbin.DeviceCode, gpu: GpuArch) -> str:
    """`cubin sm_90 x393, PTX sm_50..sm_90 x8183 in .ldata`: the entries that run on the GPU, counted, and where."""
    cubins: dict[str, int] = {}
    ptx: dict[str, int] = {}
    sections: set[str] = set()
    for entry, n in code.entries:
        if entry.kind == "cubin" and runs_on(gpu, {entry.arch}, set()):
            cubins[entry.arch] = cubins.get(entry.arch, 0) + n
        elif entry.kind == "PTX" and runs_on(gpu, set(), {entry.arch}):
            ptx[entry.arch] = ptx.get(entry.arch, 0) + n
        else:
            continue
        sections.add(entry.section)
    held = [f"cubin {arch} x{n}" for arch, n in sorted(cubins.items(), key=lambda item: _order(item[0]))]
    if ptx:
        archs = sorted(ptx, key=_order)
        span = archs[0] if len(archs) == 1 else f"{archs[0]}..{archs[-1]}"
        held.append(f"PTX {span} x{sum(ptx.values())}")
    return f"{', '.join(held)} in {', '.join(sorted(sections))}"


def _order(arch: str) -> tuple[int, str]:
    found = _SM.match(arch)
    return (int(found.group(1) + found.group(2)), found.group(3)) if found else (0, arch)


def _inside(prefix: Path, relative: str) -> bool:
    """A regular file the record names inside the prefix (a record is read, never trusted to point elsewhere)."""
    path = Path(relative)
    if path.is_absolute() or ".." in path.parts:
        return False
    full = prefix / path
    return full.is_file() and not full.is_symlink()
