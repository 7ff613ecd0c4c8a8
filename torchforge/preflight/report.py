"""What a preflight reports: each check's level, detail and fix, the report (printed as one table, raised
as a PreflightError when a check failed), the machine it ran on (cores, memory, platform) and the context the
checks add to.
"""

from __future__ import annotations

import os
import platform as host_platform
import sys
from dataclasses import dataclass, field
from enum import Enum

from rich.table import Table

from torchforge.buildmemory import available_memory
from torchforge.errors import ForgeError, PreflightError
from torchforge.proc import Command, Runner
from torchforge.flavours.base import MachineNeeds


class Level(str, Enum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"


@dataclass(frozen=True)
class Check:
    name: str
    status: Level
    detail: str
    fix: str | None = None

    def as_dict(self) -> dict[str, object]:
        return {"name": self.name, "status": self.status.value, "detail": self.detail, "fix": self.fix}


@dataclass(frozen=True)
class PreflightReport:
    checks: tuple[Check, ...]
    max_jobs: int
    engine: str  # the engine the checks were made for ("auto" resolved)

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def failures(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if c.status is Level.FAIL)

    def check(self, name: str) -> Check:
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(name)

    def raise_if_failed(self) -> None:
        if self.failures:
            names = ", ".join(c.name for c in self.failures)
            raise PreflightError(
                f"preflight: {len(self.failures)} of {len(self.checks)} checks failed ({names})",
                "fix each failed check as its row says (`torchforge doctor` re-checks); `torchforge build --skip-preflight` builds anyway",
            )

    def as_dict(self) -> dict[str, object]:
        return {"ok": self.ok, "engine": self.engine, "max_jobs": self.max_jobs,
                "checks": [c.as_dict() for c in self.checks]}


_STYLE = {Level.OK: "green", Level.WARN: "yellow", Level.FAIL: "bold red"}


def report_table(report: PreflightReport) -> Table:
    """The report as a rich table (the caller prints it)."""
    table = Table(title=f"torchforge preflight (engine {report.engine}, MAX_JOBS {report.max_jobs})")
    for column in ("check", "status", "detail", "what would work"):
        table.add_column(column, overflow="fold")
    for c in report.checks:
        table.add_row(c.name, f"[{_STYLE[c.status]}]{c.status.value}[/]", c.detail, c.fix or "")
    return table


@dataclass(frozen=True)
class Machine:
    cores: int
    mem_available_gib: float | None  # None where /proc/meminfo is unavailable
    platform: str | None  # conda subdir of this machine, None if not one torchforge builds for
    memory_basis: str = ""  # what mem_available_gib was read from (MemAvailable, or a cgroup's limit)


def _host_subdir() -> str | None:
    machine = host_platform.machine().lower()
    if sys.platform.startswith("linux"):
        return {"x86_64": "linux-64", "amd64": "linux-64", "aarch64": "linux-aarch64", "arm64": "linux-aarch64"}.get(machine)
    if sys.platform == "win32" and machine in ("amd64", "x86_64"):
        return "win-64"
    if sys.platform == "darwin":
        return {"x86_64": "osx-64", "arm64": "osx-arm64"}.get(machine)
    return None


def probe_machine() -> Machine:
    try:
        cores = len(os.sched_getaffinity(0))  # respects taskset/cgroup CPU pinning, unlike os.cpu_count
    except AttributeError:
        cores = os.cpu_count() or 1
    memory = available_memory()
    return Machine(cores, memory.gib, _host_subdir(), memory.basis)


@dataclass
class Context:
    """One preflight's checks so far, and what they read: the plan's neutral needs of this machine."""

    runner: Runner
    machine: Machine
    needs: MachineNeeds
    checks: list[Check] = field(default_factory=list)

    @property
    def cuda_versions(self) -> list[str]:
        return list(self.needs.cuda_versions)

    @property
    def platforms(self) -> list[str]:
        return list(self.needs.platforms)

    def add(self, name: str, status: Level, detail: str, fix: str | None = None) -> None:
        self.checks.append(Check(name, status, detail, fix))

    def run(self, *argv: str) -> tuple[int, str] | None:
        """(returncode, output), or None when the program cannot be started."""
        try:
            result = self.runner.run(Command(argv=argv), check=False, timeout=120)
        except ForgeError:
            return None
        return result.returncode, result.output
