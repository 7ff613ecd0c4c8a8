"""The official flavour's Selection of a command line's flags, and the checks `build` and `doctor` run before a
build of its plan of a request (the plan's neutral needs, through torchforge.sequence.machine_report), without the
network unless asked."""

from __future__ import annotations

from pathlib import Path

from torchforge import sequence
from torchforge.config import SiteConfig
from torchforge.containers import ContainerSettings
from torchforge.flavours import official_selection
from torchforge.flavours.base import Request
from torchforge.preflight.report import Machine, PreflightReport
from torchforge.proc import Runner
from torchforge.flavours.official.variant import Selection


def official_report(pytorch: str, cuda: str, python: str, *, platform: str | None = None, source: str | None = None,
                    out: Path | None = None, site: SiteConfig | None = None, engine: str = "auto",
                    jobs: int | None = None, machine: Machine | None = None, magma_only: bool = False,
                    container: ContainerSettings | None = None, check_channels: bool = False) -> PreflightReport:
    request = Request(pytorch, cuda, python, platform, source=source,
                      flavour_flags=(("--magma-only", True),) if magma_only else ())
    return sequence.machine_report(sequence.plan("official", request, "conda-build"), engine=engine, jobs=jobs,
                                   out=out or Path.cwd(), site=site or SiteConfig(), runner=Runner(),
                                   machine=machine, container=container, check_channels=check_channels)


def selection_from_flags(
    pytorch: str | None,
    cuda: str | None,
    python: str | None,
    platform: str | None,
    arch_list: str | None = None,
    build_number: int = 0,
    debug: bool = False,
    jetson: str | None = None,
    env: list[str] | None = None,
    gcc: str | None = None,
    source: str | None = None,
    magma_source: str | None = None,
    patches: list[Path] | None = None,
    magma_patches: list[Path] | None = None,
) -> Selection:
    return official_selection(Request(
        pytorch, cuda, python, platform, arch_list, build_number, source, tuple(patches or ()), flavour_flags=(
            ("--debug", debug), ("--jetson", jetson), ("--env", tuple(env or ())), ("--gcc", gcc),
            ("--magma-source", magma_source), ("--magma-patch", tuple(magma_patches or ())))))
