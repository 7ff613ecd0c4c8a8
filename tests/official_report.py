"""The checks `build` and `doctor` run before a build of the official flavour's plan of a request (the plan's
neutral needs, through torchforge.sequence.machine_report), without the network unless asked."""

from __future__ import annotations

from pathlib import Path

from torchforge import sequence
from torchforge.config import SiteConfig
from torchforge.containers import ContainerSettings
from torchforge.flavours.base import Request
from torchforge.preflight.report import Machine, PreflightReport
from torchforge.proc import Runner


def official_report(pytorch: str, cuda: str, python: str, *, platform: str | None = None, source: str | None = None,
                    out: Path | None = None, site: SiteConfig | None = None, engine: str = "auto",
                    jobs: int | None = None, machine: Machine | None = None, magma_only: bool = False,
                    container: ContainerSettings | None = None, check_channels: bool = False) -> PreflightReport:
    request = Request(pytorch, cuda, python, platform, source=source,
                      flavour_flags=(("--magma-only", True),) if magma_only else ())
    return sequence.machine_report(sequence.plan("official", request, "conda-build"), engine=engine, jobs=jobs,
                                   out=out or Path.cwd(), site=site or SiteConfig(), runner=Runner(),
                                   machine=machine, container=container, check_channels=check_channels)
