"""`torchforge verify PREFIX`: an installed environment checked from the inside.

A probe runs in the environment's Python (or `--python`, with the prefix's site-packages first on its path),
imports torch, torchvision and torchaudio, touches the GPU when there is one, and reports what it found and
every shared library mapped into the process (/proc/self/maps). The checks are made here, on that report:
each package loads from the prefix, they agree on the CUDA build, CUDA works where a GPU is, the GPU's
architecture is compiled in (or PTX covers it), every CUDA library loaded comes from the prefix, and a CPU
build where CUDA was wanted is an error.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from torchforge.binaries.catalog import catalog
from torchforge.binaries.devicecode import GpuArch, coverage, read_records
from torchforge.errors import ToolTimeoutError, UsageError
from torchforge.proc import Command, Runner

# The probe's text, run with `-c` in the environment's Python (it imports nothing of torchforge).
PROBE = (Path(__file__).parent / "gpu_probe.py").read_text(encoding="utf-8")

# Importing torch with CUDA takes seconds to a minute on a cold cache; a probe still running after this hangs.
PROBE_TIMEOUT_S = 600.0

# Driver libraries: installed with the driver, never in an environment (rpath.toml [system]).
DRIVER = re.compile(r"^(libcuda\.so|libnvidia-|libcudadebugger)")


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    ran: bool = True  # False: not run (no GPU here), which is not a failure; the detail says why


def gpu_present() -> bool:
    return Path("/proc/driver/nvidia/version").exists() or Path("/dev/nvidiactl").exists()


def _site_packages(prefix: Path) -> Path:
    found = sorted(prefix.glob("lib/python3*/site-packages"))
    if not found:
        raise UsageError(f"{prefix} has no lib/python3*/site-packages", "give the prefix of a conda environment")
    return found[0]


def probe(prefix: Path, python: Path | None, runner: Runner, timeout_s: float = PROBE_TIMEOUT_S) -> dict[str, object]:
    """The probe's report; where it did not finish or printed none, `{"probe_failed": why}` (a row, not a crash).
    The probe runs in a process group of its own, stopped whole at the time limit (an interpreter that is a
    script starting other processes leaves none behind)."""
    if not (prefix / "conda-meta").is_dir():
        raise UsageError(f"{prefix} is not a conda environment (no conda-meta)", "give an environment's prefix")
    exe = _interpreter(prefix, python)
    path = os.pathsep.join(filter(None, [str(_site_packages(prefix)), os.environ.get("PYTHONPATH", "")]))
    try:
        result = runner.run(Command(argv=(str(exe), "-c", PROBE), env={"PYTHONPATH": path}, own_group=True),
                            check=False, timeout=timeout_s)
    except ToolTimeoutError as stopped:
        what = stopped.message.partition("(stopped: ")[2].rstrip(")")
        return {"probe_failed": f"the probe in {exe} did not finish within {timeout_s:g} s and was stopped"
                                f"{': ' + what if what else ''} (importing torch, torchvision or torchaudio hung: run "
                                "`PYTHONPATH=<its site-packages> python -c 'import torch'` to see where, or give more "
                                "time with --timeout)"}
    line = next((ln for ln in result.output.splitlines() if ln.startswith("TORCHFORGE-PROBE ")), None)
    try:
        report = json.loads(line.removeprefix("TORCHFORGE-PROBE ")) if line else None
    except json.JSONDecodeError:
        report = None
    if not isinstance(report, dict):
        return {"probe_failed": f"the probe did not run in {exe} (exit {result.returncode}): "
                                f"{result.output.strip()[-500:] or 'no output'}; check that the interpreter starts "
                                "and matches the environment's Python"}
    return report


def _interpreter(prefix: Path, python: Path | None) -> Path:
    """The interpreter to probe with: `--python` as given, a relative path against the working folder (never
    looked up on PATH), or the prefix's own."""
    if python is None:
        exe = prefix / "bin" / "python"
        if not exe.exists():
            raise UsageError(f"{prefix} has no bin/python", "pass --python with an interpreter of the same version")
        return exe
    exe = python.absolute()
    if not exe.exists():
        raise UsageError(f"--python {python}: {exe} does not exist",
                         "give the path of an interpreter of the environment's Python version")
    if not exe.is_file() or not os.access(exe, os.X_OK):
        raise UsageError(f"--python {python}: {exe} is not an executable file",
                         "give the path of an interpreter (a file with execute permission), e.g. /usr/bin/python3")
    return exe


def installed(prefix: Path) -> set[str]:
    """Conda package names in the prefix (conda-meta/NAME-VERSION-BUILD.json) whose records could be read."""
    return {record.name for record in read_records(prefix) if not record.problem}


def record_checks(prefix: Path) -> list[Check]:
    """A row for each conda-meta record that cannot be read, and for each package whose record lists files that
    are gone: verify checks the rest, it never stops there."""
    found = []
    for record in read_records(prefix):
        if record.problem:
            found.append(Check(f"conda-meta/{record.package}.json is a package record", False,
                               f"{record.problem}; reinstall that package, or remove the file if no package owns it"))
            continue
        gone = [f for f in record.files if _listed_inside(f) and not os.path.lexists(prefix / f)]
        if gone:
            found.append(Check(f"{record.package}: every file its record lists is present", False,
                               f"{len(gone)} of {len(record.files)} missing, e.g. {', '.join(gone[:3])}; reinstall "
                               "the package"))
    return found


def _listed_inside(relative: str) -> bool:
    path = Path(relative)
    return not path.is_absolute() and ".." not in path.parts


def _cuda_library(name: str) -> bool:
    prefixes = tuple(p for c in catalog().components.values() for p in c.libraries)
    return name.startswith(prefixes) and not DRIVER.match(name)


def checks(prefix: Path, report: dict[str, object], want: str, gpu_arch: GpuArch | None = None) -> list[Check]:
    """`gpu_arch`: the arch every installed package's CUDA code must run on (none checked without one)."""
    if "probe_failed" in report:  # what needs no probe is still checked
        return [Check("the probe finished", False, str(report["probe_failed"])), *record_checks(prefix),
                *(device_code_checks(prefix, gpu_arch) if gpu_arch is not None else [])]
    real = os.path.realpath(prefix) + os.sep
    present = installed(prefix)
    found: list[Check] = []
    modules: dict[str, dict[str, str]] = report["modules"]  # type: ignore[assignment]
    locals_: dict[str, str] = {}
    for module, package in (("torch", "pytorch"), ("torchvision", "torchvision"), ("torchaudio", "torchaudio")):
        if package not in present:
            continue
        info = modules.get(module, {})
        where = info.get("file", "")
        ok = bool(where) and os.path.realpath(where).startswith(real)
        found.append(Check(f"{module} loads from the prefix", ok, where or info.get("error", "not importable")))
        if "version" in info:
            locals_[module] = info["version"].partition("+")[2] or "?"
    tags = set(locals_.values())
    found.append(Check("torch, torchvision, torchaudio agree on the build", len(tags) <= 1,
                       ", ".join(f"{m} {t}" for m, t in sorted(locals_.items()))))
    cuda_build = report.get("cuda_build")
    gpu = gpu_present()
    wanted = want == "cuda" or (want == "auto" and gpu)
    if wanted:
        found.append(Check("a CUDA build is installed", bool(cuda_build),
                           f"CUDA {cuda_build}" if cuda_build else "torch is a CPU build where CUDA was wanted"))
    if gpu and cuda_build:
        found.extend(_gpu_checks(report))
    loaded = [p for p in report.get("maps", []) if _cuda_library(os.path.basename(p))]  # type: ignore[union-attr]
    outside = [p for p in loaded if not os.path.realpath(p).startswith(real)]
    found.append(Check("every CUDA library loaded comes from the prefix", not outside,
                       "; ".join(outside) if outside else f"{len(loaded)} loaded, all inside"))
    found.extend(record_checks(prefix))
    if gpu_arch is not None:
        found.extend(device_code_checks(prefix, gpu_arch))
    found.extend(probe_checks(prefix, report.get("gpu_probes", [])))  # type: ignore[arg-type]
    if "error" in report:
        found.append(Check("the probe ran without an error", False, str(report["error"])))
    return found


def probe_checks(prefix: Path, rows: list[dict[str, object]]) -> list[Check]:
    """One row per GPU probe: ok where the GPU's answer is within its tolerance of the CPU's and came from a
    library inside the prefix (named with its package); not run, with why, where there is no GPU."""
    real = os.path.realpath(prefix) + os.sep
    owners = {f: r.package for r in read_records(prefix) if not r.problem for f in r.files}
    found = []
    for row in rows:
        name = f"GPU probe: {row.get('name') or row.get('probe')}"
        if "skipped" in row:
            found.append(Check(name, True, str(row["skipped"]), ran=False))
        elif "failed" in row:
            found.append(Check(name, False, f"failed: {row['failed']}"))
        else:
            library = str(row.get("library") or "")
            inside = not library or os.path.realpath(library).startswith(real)
            relative = os.path.relpath(os.path.realpath(library), os.path.realpath(prefix)) if library else ""
            package = owners.get(relative, "no package's record names it") if inside else "outside the prefix"
            error, tolerance = float(row["error"]), float(row["tolerance"])  # type: ignore[arg-type]
            answered = f"answered by {relative or library} ({package})" if library else \
                "no separate library file was mapped for it"
            found.append(Check(name, inside and error <= tolerance,
                               f"max error {error:.3g} against the CPU (tolerance {tolerance:g}); {answered}"))
    return found


def cuda_arch_check(seen: str | None) -> Check:
    """Which CEP 46 `__cuda_arch` a solver on this machine sees (information: the packages' run constraints on it
    are what keeps a build for another GPU out at install time)."""
    return Check("__cuda_arch a solver here sees (CEP 46)", True,
                 f"{seen}: a package whose __cuda_arch constraint excludes it is refused at install" if seen else
                 "absent (no GPU, or no __cuda): packages' __cuda_arch constraints do not apply here")


def device_code_checks(prefix: Path, gpu: GpuArch) -> list[Check]:
    """One check per installed package with CUDA device code: it fails when none of its libraries holds code for
    the GPU. A library without any beside one with it is shown, not failed: NVIDIA's helper libraries hold a few
    kernels for one GPU (the CUDA 13 libcufftw.so.12: one sm_75 cubin) while the package's main library holds them
    all (torchforge.cudaarch says the same rule); a library whose fatbins cannot be read is named as not listable."""
    found = []
    for package in coverage(prefix, gpu):
        readable = len(package.found)
        plural = "library" if readable == 1 else "libraries"
        if package.lacking and not readable:
            parts = [f"no SASS or PTX for {gpu.name} in " + ", ".join(package.lacking)]
        else:
            parts = [f"{readable} {plural} with device code for {gpu.name}"] if readable else []
            parts += [f"without code for {gpu.name} (shown, not failed: the package's other libraries have it): "
                      + ", ".join(package.lacking)] if package.lacking else []
        parts += [f"not listable (shown, not failed): {', '.join(package.not_listable)}"] if package.not_listable \
            else []
        parts += [f"runs: {'; '.join(package.found)}"] if package.found else []
        found.append(Check(f"{package.package}: CUDA code for the GPU ({gpu.name}, from {gpu.source})",
                           not (package.lacking and not readable), "; ".join(parts)))
    return found


def _gpu_checks(report: dict[str, object]) -> list[Check]:
    available = bool(report.get("available"))
    found = [Check("torch.cuda.is_available()", available, str(report.get("device", "no device usable")))]
    if not available:
        return found
    major, minor = report["capability"]  # type: ignore[misc]
    arch = f"sm_{major}{minor}"
    archs: list[str] = report.get("arch_list", [])  # type: ignore[assignment]
    ptx = [a for a in archs if a.startswith("compute_") and int(a[8:]) <= major * 10 + minor]
    found.append(Check("the GPU's architecture is compiled in", arch in archs or bool(ptx),
                       f"{arch} in {' '.join(archs)}" if arch in archs else f"{arch}: PTX {ptx}" if ptx else
                       f"{arch} not in {' '.join(archs)}"))
    found.append(Check("a CUDA kernel and cuDNN run", report.get("sum") == 4.0 and bool(report.get("cudnn")),
                       f"sum {report.get('sum')}, cuDNN {report.get('cudnn')}"))
    return found
