"""The sequence every build, doctor and dry run follows, read from a flavour's neutral plan (issue 30):
choose the flavour's plug-in, plan, then check the machine for what the plan needs.

The commands call these and print; the flavour's own model never reaches them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from torchforge import config as site_config
from torchforge import containers
from torchforge.buildoptions import (BuildOptions, PreparedBuild, PreparesItsBuild, Rendered, RendersItsFolders,
                                     StandsInForItsRecipes)
from torchforge.config import SiteConfig
from torchforge.console import err, warn
from torchforge.engines.choice import container_engine, select_engine
from torchforge.errors import UsageError
from torchforge.fileops import write_folders
from torchforge.flavours import JOBS_VARIABLE, choose, plugin
from torchforge.extensions.plan import with_extension_rows, with_extensions
from torchforge.flavours.base import MatrixView, Plan, Request
from torchforge.flavours.official import matrix_rows as official_matrix_rows
from torchforge.flavours.official import official_steps
from torchforge.flavours.official import plan_of as official_plan
from torchforge.pipeline import plan_steps
from torchforge.preflight import (Check, Level, PreflightReport, checked_jobs, container_report, report_table,
                                  run_machine_checks, run_needs_checks)
from torchforge.proc import Runner
from torchforge.standin import TEST_EXTRAS, plan_requirements, recipe_requirements


if TYPE_CHECKING:
    from torchforge.ci import CiPlan
    from torchforge.ci_recipes import JobSettings

__all__ = ["BuildOptions", "PreparedBuild", "ci", "doctor", "dry_run_report", "prepare_build", "machine_report", "matrix", "official_matrix_rows", "official_plan", "official_steps", "plan", "refuse_build", "render", "standins"]


def plan(flavour: str, request: Request, recipe_format: str) -> Plan:
    """The flavour's plan of `request`, its recipe folders rendered for an engine reading `recipe_format`, with
    the request's extensions after the pytorch recipes they are built for."""
    return with_extensions(plugin(flavour).plan(request, recipe_format), request, recipe_format)


def refuse_build(flavour: str, request: Request) -> None:
    """A request the flavour renders but torchforge does not build here: a usage error (2) before anything runs."""
    refusal = plugin(flavour).build_refusal(request)
    if refusal is not None:
        raise UsageError(*refusal)


def matrix(flavour: str, request: Request) -> MatrixView:
    """The flavour's `matrix` of `request`: its JSON rows and its table (and the rows of its extensions)."""
    view = plugin(flavour).matrix(request)
    return with_extension_rows(view, plan(flavour, request, "rattler-build")) if request.extensions else view


def machine_report(the_plan: Plan, *, engine: str | None, jobs: int | None, out: Path, site: SiteConfig,
                   extra_channels: tuple[str, ...] = (), runner: Runner | None = None,
                   container: containers.ContainerSettings | None = None) -> PreflightReport:
    """The flavour's own rows, then every machine check of what the plan needs (channels included: network);
    with `container`, the build images of its recipes instead of this machine's engine and toolkit."""
    report = run_machine_checks(the_plan.needs, engine=engine, jobs=jobs, runner=runner or Runner(), out=out,
                                site=site, extra_channels=extra_channels, check_channels=True, container=container,
                                image_targets=image_targets(the_plan))
    facts = tuple(Check(name, Level.OK, detail) for name, detail in the_plan.facts)
    return PreflightReport((*facts, *report.checks), report.max_jobs, report.engine)


def image_targets(the_plan: Plan) -> list[tuple[str, str]]:
    """(accel, cuDNN) of each recipe a build image builds: those of Python packages first (their order is the
    request's), then the others (magma); recipes built beside the others (the official companions) need none."""
    built = [r for r in the_plan.recipes if r.build_flags or r.pythons]
    return [(r.accel, r.cudnn) for r in sorted(built, key=lambda r: not r.pythons)]


def dry_run_report(the_plan: Plan, *, out: Path) -> PreflightReport:
    """What a dry run can already refuse without looking at a tool: the platform, --out, each --source."""
    return run_needs_checks(the_plan.needs, out=out)


def prepare_build(flavour: str, request: Request, options: BuildOptions) -> PreparedBuild:
    """Choose the engine, plan, refuse or warn, check the machine, make the steps: all a build does before it runs.
    A flavour whose checks read more than the plan (the official flavour's variants) prepares its own build."""
    site = site_config.load(options.config)
    chosen = plugin(flavour)
    if isinstance(chosen, PreparesItsBuild):
        return chosen.own_build(request, options, site)
    return _plan_build(flavour, request, options, site)


def _plan_build(flavour: str, request: Request, options: BuildOptions, site: SiteConfig) -> PreparedBuild:
    """A flavour's plan: refused or warned about, the machine checked, then its steps; with --container each recipe
    runs the conda-build of its CUDA's image."""
    jobs = checked_jobs(options.jobs, ())
    refuse_build(flavour, request)
    if options.container:  # the engine is the image's: this machine's is not looked at
        chosen, why = container_engine(options.engine)
    else:
        # without preflight the engine itself is checked; preflight shows a missing conda-build with the rest
        chosen, why = select_engine(options.engine,
                                    require_available=options.skip_preflight and not options.dry_run)
    the_plan = plan(flavour, request, chosen.recipe_format)
    for message in the_plan.warnings:
        warn(message)
    in_images = _image_settings(the_plan, site.images, dry_run=options.dry_run) if options.container else None
    extra_env = _checked_machine(the_plan, None if options.container else options.engine, jobs, options, site)
    if in_images is not None and not options.dry_run and not options.skip_preflight:
        _container_rows(the_plan, in_images)
    err.print(why)
    settings = options.settings(request, site.channels, extra_env=extra_env, container=in_images)
    return PreparedBuild(tuple(plan_steps(the_plan, settings)), chosen, settings)


def _image_settings(the_plan: Plan, images: Mapping[str, containers.Image], *,
                    dry_run: bool) -> containers.ContainerSettings:
    """--container for a plan of any flavour: each recipe's accel and cuDNN pick its image, refused before the
    machine checks and any build, as the official flavour's are."""
    return containers.for_build([(r.accel, r.cudnn) for r in the_plan.recipes], [r.subdir for r in the_plan.recipes],
                                images, dry_run=dry_run, check_cudnn_now=True)


def _container_rows(the_plan: Plan, settings: containers.ContainerSettings) -> None:
    """Preflight's container rows: the tool answers, each recipe's image is here and can build it."""
    report = container_report(settings, [(r.accel, r.cudnn) for r in the_plan.recipes], Runner())
    err.print(report_table(report))
    report.raise_if_failed()


def _checked_machine(the_plan: Plan, engine: str | None, jobs: int | None, options: BuildOptions,
                     site: SiteConfig) -> dict[str, str]:
    """The machine checks of a plan before its build (a dry run: those that need no tool); the build's MAX_JOBS."""
    if options.skip_preflight:
        return {JOBS_VARIABLE: str(jobs)} if jobs else {}
    if options.dry_run:
        plan_report = dry_run_report(the_plan, out=options.out)
        if not plan_report.ok:
            err.print(report_table(plan_report))
        plan_report.raise_if_failed()
        return {JOBS_VARIABLE: str(jobs)} if jobs else {}
    report = machine_report(the_plan, engine=engine, jobs=jobs, out=options.out, site=site,
                            extra_channels=options.channels)
    err.print(report_table(report))
    report.raise_if_failed()
    return {JOBS_VARIABLE: str(jobs or report.max_jobs)} if jobs or report.max_jobs else {}


def doctor(flavour: str, request: Request, options: BuildOptions) -> PreflightReport:
    """`doctor`: every check a build of `request` runs before it compiles (with --container: the images instead of
    this machine's engine and toolkit), read from the flavour's plan; a plan the flavour refuses is refused first."""
    site = site_config.load(options.config)
    # the folders are not looked at here: rendered for conda-build, which renders every platform's
    the_plan = plan(flavour, request, "conda-build")
    env_jobs = the_plan.needs.env_max_jobs
    jobs = checked_jobs(options.jobs, (("MAX_JOBS", env_jobs),) if env_jobs else ())
    in_images = containers.ContainerSettings(containers.probe_tool() or "", site.images) if options.container else None
    report = machine_report(the_plan, engine=options.engine, jobs=jobs, out=options.out, site=site,
                            extra_channels=options.channels, container=in_images)
    return report


def render(flavour: str, request: Request, recipe_format: str, out_dir: Path, *, force: bool) -> Rendered:
    """`render`: the flavour's recipe folders under `out_dir`, written all or none."""
    chosen = plugin(flavour)
    if isinstance(chosen, RendersItsFolders):
        return chosen.own_render(request, recipe_format, out_dir, force=force)
    the_plan = plan(flavour, request, recipe_format)
    written = write_folders({recipe.id: dict(recipe.files) for recipe in the_plan.recipes}, out_dir, force=force)
    channels = ", ".join(dict.fromkeys(url for recipe in the_plan.recipes for url in recipe.channels))
    return Rendered(tuple(written), the_plan.warnings, f"rendered {len(written)} {the_plan.flavour}-flavour recipe "
                    f"folder(s) into {out_dir} (channel: {channels})")


@dataclass(frozen=True)
class StandIns:
    """What `standin-channel` writes stand-ins for: the specs, what they come from, and whether the stand-ins take
    conda-forge's package shapes (cuDNN, NCCL and MAGMA libraries with the real SONAMEs and run_exports)."""

    specs: tuple[str, ...]
    shape: str
    conda_forge: bool


def standins(flavour: str, request: Request) -> StandIns:
    """The requirements of every recipe `build` would build for `request`, refused where build refuses it."""
    chosen = plugin(flavour)
    if isinstance(chosen, StandsInForItsRecipes):
        recipes, shape = chosen.own_standin_recipes(request)
        specs = dict.fromkeys(spec for recipe in recipes for spec in recipe_requirements(recipe))
        return StandIns((*specs, *TEST_EXTRAS), shape, conda_forge=False)
    refusal = chosen.build_refusal(request)
    if refusal is not None:
        raise UsageError(f"{refusal[0]}: there is no build to stand in for", refusal[1])
    the_plan = plan(flavour, request, "rattler-build")
    # a plan's own recipes read conda-forge's packages: their stand-ins take those shapes
    return StandIns(tuple(plan_requirements(the_plan)), f"the {the_plan.flavour} flavour's recipes (recipe.yaml)",
                    conda_forge=True)


def ci(flavour: str, request: Request, settings: JobSettings, *, flavour_given: bool) -> CiPlan:
    """`ci`: the jobs that build the flavour's plan of `request`, refused where build refuses it. The folders are
    rendered for conda-build (the jobs read only the packages' names and build flags, the same for every engine).
    The jobs pin the flavour where it was given or `torchforge build` would choose another for the release."""
    from torchforge import ci_recipes as ci_jobs  # the CI file's modules load only for `ci`

    refuse_build(flavour, request)
    the_plan = plan(flavour, request, "conda-build")
    pinned = flavour_given or choose(None, ci_jobs.resolved(the_plan).release)[0].value != flavour
    return ci_jobs.ci_plan(the_plan, dataclasses.replace(settings, flavour_flags=("--flavour", flavour) if pinned else ()))

