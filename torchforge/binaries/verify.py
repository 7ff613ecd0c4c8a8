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
from torchforge.binaries.devicecode import GpuArch, coverage
from torchforge.errors import AuditFailedError, ToolTimeoutError, UsageError
from torchforge.proc import Command, Runner

PROBE = r"""
import json, sys
report = {"python": sys.executable, "modules": {}}
for name in ("torch", "torchvision", "torchaudio"):
    try:
        module = __import__(name)
        local = __import__(name + ".version", fromlist=["__version__"]).__version__
        report["modules"][name] = {"file": module.__file__, "version": local}
    except Exception as exc:
        report["modules"][name] = {"error": f"{type(exc).__name__}: {exc}"}
try:
    import torch
    report["cuda_build"] = torch.version.cuda
    report["available"] = bool(torch.cuda.is_available())
    if report["available"]:
        report["capability"] = list(torch.cuda.get_device_capability(0))
        report["device"] = torch.cuda.get_device_name(0)
        report["arch_list"] = list(torch.cuda.get_arch_list())
        report["sum"] = float(torch.ones(4, device="cuda").sum().item())
        report["cudnn"] = torch.backends.cudnn.version()
        if "torchvision" in sys.modules:
            import torchvision
            boxes = torch.tensor([[0.0, 0.0, 1.0, 1.0]], device="cuda")
            report["nms"] = torchvision.ops.nms(boxes, torch.ones(1, device="cuda"), 0.5).tolist()
except Exception as exc:
    report["error"] = f"{type(exc).__name__}: {exc}"
with open("/proc/self/maps") as maps:
    report["maps"] = sorted({line.split()[-1] for line in maps if ".so" in line.split()[-1]})
print("TORCHFORGE-PROBE " + json.dumps(report))
"""

# Importing torch with CUDA takes seconds to a minute on a cold cache; a probe still running after this hangs.
PROBE_TIMEOUT_S = 600.0

# Driver libraries: installed with the driver, never in an environment (rpath.toml [system]).
DRIVER = re.compile(r"^(libcuda\.so|libnvidia-|libcudadebugger)")


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


def gpu_present() -> bool:
    return Path("/proc/driver/nvidia/version").exists() or Path("/dev/nvidiactl").exists()


def _site_packages(prefix: Path) -> Path:
    found = sorted(prefix.glob("lib/python3*/site-packages"))
    if not found:
        raise UsageError(f"{prefix} has no lib/python3*/site-packages", "give the prefix of a conda environment")
    return found[0]


def probe(prefix: Path, python: Path | None, runner: Runner, timeout_s: float = PROBE_TIMEOUT_S) -> dict[str, object]:
    if not (prefix / "conda-meta").is_dir():
        raise UsageError(f"{prefix} is not a conda environment (no conda-meta)", "give an environment's prefix")
    exe = _interpreter(prefix, python)
    path = os.pathsep.join(filter(None, [str(_site_packages(prefix)), os.environ.get("PYTHONPATH", "")]))
    try:
        result = runner.run(Command(argv=(str(exe), "-c", PROBE), env={"PYTHONPATH": path}), check=False,
                            timeout=timeout_s)
    except ToolTimeoutError:
        raise AuditFailedError(f"the probe in {exe} did not finish within {timeout_s:g} s and was stopped "
                               "(importing torch, torchvision or torchaudio hung)",
                               "run `PYTHONPATH=<its site-packages> python -c 'import torch'` in the environment to "
                               "see where it hangs, or give more time with --timeout") from None
    line = next((ln for ln in result.output.splitlines() if ln.startswith("TORCHFORGE-PROBE ")), None)
    if line is None:
        raise AuditFailedError(f"the probe did not run in {exe}: {result.output.strip()[-500:]}",
                               "check that the interpreter starts and matches the environment's Python")
    return json.loads(line.removeprefix("TORCHFORGE-PROBE "))


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
    """Conda package names in the prefix (conda-meta/NAME-VERSION-BUILD.json)."""
    names = set()
    for record in (prefix / "conda-meta").glob("*.json"):
        names.add(json.loads(record.read_text("utf-8")).get("name", ""))
    return names


def _cuda_library(name: str) -> bool:
    prefixes = tuple(p for c in catalog().components.values() for p in c.libraries)
    return name.startswith(prefixes) and not DRIVER.match(name)


def checks(prefix: Path, report: dict[str, object], want: str, gpu_arch: GpuArch | None = None,
           runner: Runner | None = None) -> list[Check]:
    """`gpu_arch`: the arch every installed package's CUDA code must run on (none checked without one)."""
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
    if gpu_arch is not None:
        found.extend(device_code_checks(prefix, gpu_arch, runner or Runner()))
    if "error" in report:
        found.append(Check("the probe ran without an error", False, str(report["error"])))
    return found


def device_code_checks(prefix: Path, gpu: GpuArch, runner: Runner) -> list[Check]:
    """One check per installed package with CUDA device code: each of its libraries holds code for the GPU."""
    found = []
    for package in coverage(prefix, gpu, runner):
        detail = (f"no SASS or PTX for {gpu.name} in " + ", ".join(package.lacking) if package.lacking else
                  f"{package.libraries} {'library' if package.libraries == 1 else 'libraries'} with device code, "
                  f"each runs on {gpu.name}")
        found.append(Check(f"{package.package}: CUDA code for the GPU ({gpu.name}, from {gpu.source})",
                           not package.lacking, detail))
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
