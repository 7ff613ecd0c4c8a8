"""How much memory a build's compile jobs have, and what a build killed for memory leaves for its rerun.

- Memory available: the smallest of MemAvailable (/proc/meminfo) and what the process's memory cgroup still allows
  (cgroup v2 `memory.max - memory.current`, v1 `memory.limit_in_bytes - memory.usage_in_bytes`, for its own group
  and every group above it): a CI container sees the host's MemAvailable but is killed at its own limit.
- Per-job peak: data (preflight.toml [jobs] and [jobs.packages.NAME], each package's figure with its source); the
  sequencer and the pipeline pick the jobs from it (preflight.table.choose_max_jobs).
- Peak memory of a build: the runner's `peak_rss_kib` (the largest process of the engine's tree, from wait4).
- Out of memory: a build whose log carries a signature of failures.toml that means memory (a compiler killed, or
  one that could not allocate), or that exited with 137 (SIGKILL) or 143 (SIGTERM, what CI runners send), is
  recorded under OUT/.cache/memory-kills.json with the jobs it ran; the rerun plans half of them and says so.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from torchforge import fileops

KILLS_FILE = Path(".cache") / "memory-kills.json"
# failures.toml signatures that mean the compilers ran out of memory.
MEMORY_SIGNATURES = ("compiler-killed", "compiler-out-of-memory")
# An engine's exit status when the kernel's OOM killer (SIGKILL, 128 + 9) or a CI runner's memory guard (SIGTERM,
# 128 + 15) ended it: conda-forge's flash-attn builds were seen to end with 143 on aarch64 (issue 42).
KILLED_STATUSES = {137: "SIGKILL (exit 137)", 143: "SIGTERM (exit 143)", -9: "SIGKILL", -15: "SIGTERM"}
_NO_LIMIT = 1 << 60  # cgroup v1 reports "no limit" as a page-rounded 2**63 - 1
_GIB = 1024**3


def read_mem_available_gib(meminfo: Path = Path("/proc/meminfo")) -> float | None:
    """MemAvailable (what can be used without swapping), not MemTotal: a desktop's browser counts."""
    try:
        text = meminfo.read_text(encoding="ascii")
    except OSError:
        return None
    found = re.search(r"^MemAvailable:\s+(\d+)\s+kB", text, re.MULTILINE)
    return int(found.group(1)) / 1024**2 if found else None


def _number(path: Path) -> int | None:
    try:
        text = path.read_text(encoding="ascii").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max" (v2: no limit) reads as None


def _groups(proc_cgroup: Path) -> list[tuple[str, str]]:
    """(hierarchy, path) of each line of /proc/self/cgroup: "" for the v2 hierarchy, "memory" for v1's."""
    try:
        lines = proc_cgroup.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3 and (parts[0] == "0" and parts[1] == "" or "memory" in parts[1].split(",")):
            found.append(("" if parts[0] == "0" else "memory", parts[2]))
    return found


def cgroup_free_gib(proc_cgroup: Path = Path("/proc/self/cgroup"),
                    root: Path = Path("/sys/fs/cgroup")) -> tuple[float, str] | None:
    """What the tightest memory cgroup of this process still allows, and which one that is (None: no limit)."""
    tightest: tuple[float, str] | None = None
    for hierarchy, path in _groups(proc_cgroup):
        base = root / hierarchy if hierarchy else root
        names = ("memory.limit_in_bytes", "memory.usage_in_bytes") if hierarchy else ("memory.max", "memory.current")
        if hierarchy and not (base / names[0]).exists() and (root / names[0]).exists():
            base = root  # v1 controller mounted at the root itself
        folder = base / path.lstrip("/")
        # a container sees its own group as "/" or as a path its mount namespace does not have: its root then
        while True:
            limit, used = _number(folder / names[0]), _number(folder / names[1])
            if limit is not None and limit < _NO_LIMIT and used is not None:
                free = max(0, limit - used) / _GIB
                if tightest is None or free < tightest[0]:
                    tightest = (free, f"cgroup {folder} ({limit / _GIB:.1f} GiB limit)")
            if folder == base or base not in folder.parents:
                break
            folder = folder.parent
    return tightest


@dataclass(frozen=True)
class Memory:
    """The memory the compile jobs may use, and what it was read from."""

    gib: float | None
    basis: str


def available_memory(meminfo: Path = Path("/proc/meminfo"), proc_cgroup: Path = Path("/proc/self/cgroup"),
                     cgroup_root: Path = Path("/sys/fs/cgroup")) -> Memory:
    free = read_mem_available_gib(meminfo)
    limited = cgroup_free_gib(proc_cgroup, cgroup_root)
    if limited is not None and (free is None or limited[0] < free):
        return Memory(limited[0], f"{limited[0]:.1f} GiB free in {limited[1]}")
    return Memory(free, "memory unknown" if free is None else f"{free:.1f} GiB available")


def memory_failure(returncode: int | None, diagnoses: tuple[str, ...]) -> str | None:
    """Why a failed build looks killed for memory (None: it does not): the memory signature its log carries (ids
    of diagnose.explain_log), else the status it was ended with."""
    found = [name for name in MEMORY_SIGNATURES if name in diagnoses]
    if found:
        return f"its log says the compilers ran out of memory ({found[0]})"
    if returncode in KILLED_STATUSES:
        return f"it was ended by {KILLED_STATUSES[returncode]}, the kernel's out-of-memory killer's or a runner's signal"
    return None


@dataclass(frozen=True)
class Kill:
    """A build of a package killed for memory: the jobs it ran, why it counts as memory, its peak."""

    jobs: int
    why: str
    peak_gib: float | None = None


def _kills_path(out: Path) -> Path:
    return out / KILLS_FILE


def recorded_kills(out: Path) -> dict[str, Kill]:
    """The packages whose last build in this output folder was killed for memory (an unreadable record: none)."""
    try:
        raw = json.loads(_kills_path(out).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    kills = {}
    for name, entry in raw.items() if isinstance(raw, dict) else ():
        if isinstance(entry, dict) and isinstance(entry.get("jobs"), int) and entry["jobs"] >= 1:
            peak = entry.get("peak_gib")
            kills[str(name)] = Kill(entry["jobs"], str(entry.get("why", "")),
                                    float(peak) if isinstance(peak, (int, float)) else None)
    return kills


def record_kill(out: Path, package: str, kill: Kill | None) -> None:
    """Record (or, with None, forget) a package's kill for memory: written whole, so a killed run leaves the old
    record or the new one."""
    kills = recorded_kills(out)
    if kill is None and package not in kills:
        return
    if kill is None:
        kills.pop(package)
    else:
        kills[package] = kill
    path = _kills_path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    fileops.atomic_write(path, json.dumps({name: {"jobs": k.jobs, "why": k.why, "peak_gib": k.peak_gib}
                                           for name, k in sorted(kills.items())}, indent=2) + "\n")


def after_kill(jobs: int, kill: Kill | None) -> tuple[int, str]:
    """The jobs of a rerun after a kill for memory: half of those the killed build ran (at least 1, and no more
    than memory and cores allow now), and the sentence that says so."""
    if kill is None:
        return jobs, ""
    if kill.jobs <= 1:
        return 1, f"its last build was killed for memory with MAX_JOBS 1 ({kill.why}): add memory or swap"
    fewer = min(jobs, max(1, kill.jobs // 2))
    return fewer, (f"its last build was killed for memory with MAX_JOBS {kill.jobs} ({kill.why}): "
                   f"this build plans MAX_JOBS {fewer}")


def package_name(stem: str) -> str:
    """The package name of a name-version-build stem (names have dashes, versions and build strings do not)."""
    return stem.rsplit("-", 2)[0] if stem.count("-") >= 2 else stem
