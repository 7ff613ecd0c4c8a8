"""The sequence every build, doctor and dry run follows, read from a flavour's neutral plan (issue 30):
choose the flavour's plug-in, plan, then check the machine for what the plan needs.

The commands call these and print; the flavour's own model never reaches them.
"""

from __future__ import annotations

from pathlib import Path

from torchforge.config import SiteConfig
from torchforge.errors import UsageError
from torchforge.flavours import plugin
from torchforge.flavours.base import Plan, Request
from torchforge.flavours.official import matrix_rows as official_matrix_rows
from torchforge.flavours.official import official_steps
from torchforge.flavours.official import plan_of as official_plan
from torchforge.preflight import Check, Level, PreflightReport, run_machine_checks, run_needs_checks
from torchforge.proc import Runner


__all__ = ["dry_run_report", "machine_report", "matrix", "official_matrix_rows", "official_plan", "official_steps", "plan", "refuse_build"]


def plan(flavour: str, request: Request, recipe_format: str) -> Plan:
    """The flavour's plan of `request`, its recipe folders rendered for an engine reading `recipe_format`."""
    return plugin(flavour).plan(request, recipe_format)


def refuse_build(flavour: str, request: Request) -> None:
    """A request the flavour renders but torchforge does not build here: a usage error (2) before anything runs."""
    refusal = plugin(flavour).build_refusal(request)
    if refusal is not None:
        raise UsageError(*refusal)


def matrix(flavour: str, request: Request) -> list[dict[str, object]]:
    """The flavour's `matrix --json` rows of `request`."""
    return plugin(flavour).matrix(request)


def machine_report(the_plan: Plan, *, engine: str | None, jobs: int | None, out: Path, site: SiteConfig,
                   extra_channels: tuple[str, ...] = (), runner: Runner | None = None) -> PreflightReport:
    """The flavour's own rows, then every machine check of what the plan needs (channels included: network)."""
    report = run_machine_checks(the_plan.needs, engine=engine, jobs=jobs, runner=runner or Runner(), out=out,
                                site=site, extra_channels=extra_channels, check_channels=True)
    facts = tuple(Check(name, Level.OK, detail) for name, detail in the_plan.facts)
    return PreflightReport((*facts, *report.checks), report.max_jobs, report.engine)


def dry_run_report(the_plan: Plan, *, out: Path) -> PreflightReport:
    """What a dry run can already refuse without looking at a tool: the platform, --out, each --source."""
    return run_needs_checks(the_plan.needs, out=out)
