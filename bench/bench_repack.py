"""`torchforge repack` against the floor, on the same wheels in one run (issue 35).

The floor: unzip every wheel and write one zstd stream (level 10, the repack default, one worker per core) of
its files, nothing else -- what any repack must at least do. The ratio repack / floor is printed with the
number of cores and the load average, since both decide it.

Wheels: `make bench` repacks the CUDA stack the Makefile names (BENCH_STACK_REQUEST=pytorch/cuda/python,
fetched once by torchforge's own fetch into .cache/cu128/wheels), or the wheels in BENCH_STACK_WHEELS (the
H100 run points it at the installed stack rebuilt as wheels); `--quick` (`make bench-quick`, CI) repacks the
torch 2.13.0 CPU wheel and one small NVIDIA component wheel from PyPI. BENCH_REPACK_CHANNEL keeps the
repacked channel there.
"""

from __future__ import annotations

import os
import resource
import shutil
import sys
import time
import zipfile
from dataclasses import replace
from pathlib import Path

from bench import Row
from torchforge.binaries import wheels as wheel_files
from torchforge.binaries.plan import CudaLibs, StackPlan, component_plan
from torchforge.binaries.stack import SWITCH_INTERVAL, plan_wheels, repack_planned
from torchforge.condawriter import CHUNK, zstd
from torchforge.errors import ForgeError
from torchforge.proc import Command, Runner
from torchforge.repack import DEFAULT_ZSTD_LEVEL, zstd_workers

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / ".bench" / "repack"
QUICK_PIP = ("torch==2.13.0", "nvidia-nvtx-cu12==12.8.90")  # a 190 MB CPU wheel and a 90 kB NVIDIA component


def floor_seconds(wheels: list[Path], out: Path) -> tuple[float, float]:
    """Unzip each wheel and write its files as one zstd stream with every core; nothing else. Returns the wall
    and the CPU seconds (all threads)."""
    options = {zstd.CompressionParameter.compression_level: DEFAULT_ZSTD_LEVEL,
               zstd.CompressionParameter.nb_workers: zstd_workers(-1)}
    start, cpu = time.perf_counter(), time.process_time()
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as zf, (out / f"{wheel.name}.zst").open("wb") as dest:
            compressor = zstd.ZstdCompressor(options=options)
            for member in zf.infolist():
                with zf.open(member) as src:
                    while chunk := src.read(CHUNK):
                        dest.write(compressor.compress(chunk))
            dest.write(compressor.flush())
    return time.perf_counter() - start, time.process_time() - cpu


class Timeline:
    """Each step of the repack with the wall time and the CPU time (this process's threads, and its children:
    patchelf) spent since the start: where the time goes, and whether the cores were busy meanwhile."""

    def __init__(self) -> None:
        self.start = self._now()
        self.lines: list[str] = []

    @staticmethod
    def _now() -> tuple[float, float, float]:
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        return time.perf_counter(), time.process_time(), children.ru_utime + children.ru_stime

    def elapsed(self) -> float:
        return self._now()[0] - self.start[0]

    def cpu(self) -> float:
        """CPU seconds of this process's threads and its children (patchelf, the index) since the start."""
        now = self._now()
        return now[1] - self.start[1] + now[2] - self.start[2]

    def step(self, name: str, what: str) -> None:
        wall, cpu, children = (now - then for now, then in zip(self._now(), self.start))
        self.lines.append(f"{wall:7.1f} s  cpu {cpu:7.1f} s  children {children:6.1f} s  {name}: {what}")

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        wall, cpu, children = (now - then for now, then in zip(self._now(), self.start))
        path.write_text("\n".join([*self.lines, f"{wall:7.1f} s  cpu {cpu:7.1f} s  children {children:6.1f} s  end"]) + "\n")


def _repackable(folder: Path) -> list[Path]:
    """The wheels of `folder` that repack turns into packages (pip also brings torch's pure-Python needs)."""
    found = []
    for path in sorted(folder.glob("*.whl")):
        try:
            wheel_files.read(path)
        except ForgeError:
            continue
        found.append(path)
    return found


def _quick_plan(runner: Runner) -> StackPlan:
    folder = WORK / "quick-wheels"
    if not any(folder.glob("nvidia_nvtx*.whl")):
        runner.run(Command(argv=(sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                                 "--quiet", "-d", str(folder), *QUICK_PIP)))
    torch = sorted(folder.glob("torch-*.whl"))
    nvidia = wheel_files.read(sorted(folder.glob("nvidia_nvtx*.whl"))[0])
    # A CPU torch needs no NVIDIA component: the component is planned on its own, as a CUDA stack plans it.
    stack = plan_wheels(torch, CudaLibs.WHEELS)
    python = stack.packages[0].python
    return replace(stack, packages=(*stack.packages, component_plan(nvidia, python, 0)))


def _stack_plan(runner: Runner) -> StackPlan:
    folder = Path(os.environ.get("BENCH_STACK_WHEELS") or ROOT / ".cache" / "cu128" / "wheels")
    if not any(folder.glob("torch-*.whl")):
        from torchforge.binaries import fetch

        pytorch, cuda, python = os.environ.get("BENCH_STACK_REQUEST", "").split("/")
        request = fetch.Request(pytorch, python, cuda, ("torchvision", "torchaudio"), None)
        fetch.download(request, folder, runner)
    return plan_wheels(_repackable(folder), CudaLibs.WHEELS)


def _repack_once(stack: StackPlan, channel: Path, gil_switch: float | None, suffix: str) -> tuple[float, float]:
    """One repack of `stack` into `channel` with the GIL's switch interval `gil_switch` (None: Python's); its wall
    and CPU seconds. The timeline goes to BENCH_TIMELINE (or WORK/timeline.txt), `suffix` added to its stem."""
    timeline = Timeline()
    result = repack_planned(stack, channel, Runner(), on_step=timeline.step, gil_switch=gil_switch)
    seconds, cpu = timeline.elapsed(), timeline.cpu()
    path = Path(os.environ.get("BENCH_TIMELINE") or WORK / "timeline.txt")
    timeline.write(path.with_name(f"{path.stem}{suffix}{path.suffix}"))
    print(f"  GIL switch interval {_interval(gil_switch)}: {seconds:.1f} s")
    for package in sorted(result.packages, key=lambda p: -p.seconds)[:5]:  # the longest builds (they overlap)
        print(f"    {package.archive.name}: {package.size / 1e6:.1f} MB in {package.seconds:.1f} s")
    return seconds, cpu


def _interval(seconds: float | None) -> str:
    return f"{(sys.getswitchinterval() if seconds is None else seconds) * 1e3:g} ms" + (" (Python's)" if seconds is None else "")


def _measure(name: str, stack: StackPlan) -> list[Row]:
    shutil.rmtree(WORK / "out", ignore_errors=True)
    (WORK / "out").mkdir(parents=True)
    wheels = [p.wheel.path for p in stack.packages]
    size = sum(w.stat().st_size for w in wheels)
    load_before = os.getloadavg()
    floor, floor_cpu = floor_seconds(wheels, WORK / "out")
    # The repack as it runs (SWITCH_INTERVAL), then the plain alternative in the same run: Python's interval.
    kept = os.environ.get("BENCH_REPACK_CHANNEL")  # the H100 run installs and verifies what was repacked
    repack, repack_cpu = _repack_once(stack, Path(kept) if kept else WORK / "out" / "chan", SWITCH_INTERVAL, "")
    plain, plain_cpu = _repack_once(stack, WORK / "out" / "chan-plain", None, "-plain")
    load = "/".join(f"{a:.1f}" for a in os.getloadavg())
    shutil.rmtree(WORK / "out", ignore_errors=True)
    note = (f"{len(wheels)} wheels, {size / 1e9:.2f} GB; {os.cpu_count()} cores; load {load_before[0]:.1f} "
            f"before, {load} after (1/5/15 min); target <= 1.5x")
    used = f"GIL switch interval {_interval(SWITCH_INTERVAL)}, tar fed to zstd in {CHUNK >> 20} MiB pieces"
    return [Row(f"repack {name}", "floor: unzip + one zstd-10 stream per wheel, every core", f"{floor:.1f} s",
                f"{floor_cpu:.1f} CPU s; {note}"),
            Row(f"repack {name}", f"torchforge repack (--cuda-libs wheels), same wheels; {used}", f"{repack:.1f} s",
                f"{repack_cpu:.1f} CPU s (with its child processes)"),
            Row(f"repack {name}", "repack / floor", f"{repack / floor:.2f}x",
                f"{os.cpu_count()} cores; CPU seconds {repack_cpu / max(floor_cpu, 1e-3):.2f}x (what a loaded machine shows)"),
            Row(f"repack {name}", f"plain: the same repack with {_interval(None)}", f"{plain:.1f} s",
                f"{plain_cpu:.1f} CPU s; {plain / floor:.2f}x the floor; chosen / plain {repack / plain:.2f}x")]


def run(quick: bool) -> list[Row]:
    runner = Runner()
    if quick:
        return _measure("torch CPU + nvtx", _quick_plan(runner))
    return _measure("CUDA stack", _stack_plan(runner))
