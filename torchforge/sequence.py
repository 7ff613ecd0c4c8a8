"""The sequence every build, doctor and dry run follows, read from a flavour's neutral plan (issue 30):
choose the flavour's plug-in, plan, then check the machine for what the plan needs.

The commands call these and print; the flavour's own model never reaches them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from torchforge import config as site_config
from torchforge import closure, containers, havepytorch, provided
from torchforge.buildoptions import BuildOptions, PreparedBuild, Rendered
from torchforge.channels import build_channels
from torchforge.config import SiteConfig
from torchforge.console import err, note, warn
from torchforge.engines.choice import container_engine, plan_engine, select_engine
from torchforge.errors import UsageError
from torchforge.fileops import write_folders
from torchforge.flavours import JOBS_VARIABLE, choose, plugin
from torchforge.extensions.plan import run_requirements, with_extension_rows, with_extensions
from torchforge.flavours.base import MatrixView, Plan, PlannedRecipe, PytorchBuild, Request
from torchforge.flavours.official import matrix_rows as official_matrix_rows
from torchforge.flavours.official import official_steps
from torchforge.flavours.official import plan_of as official_plan
from torchforge.pipeline import Action, BuildSettings, Step, plan_steps
from torchforge.preflight import run_machine_checks, run_needs_checks
from torchforge.preflight.images import container_report
from torchforge.preflight.report import Check, Level, Machine, PreflightReport, report_table
from torchforge.preflight.table import checked_jobs
from torchforge.proc import Runner
from torchforge.standin import plan_requirements


if TYPE_CHECKING:
    from torchforge.ci import CiPlan
    from torchforge.ci.recipes import JobSettings

__all__ = ["BuildOptions", "PreparedBuild", "channel_plan", "ci", "prepare_plan_build", "doctor", "dry_run_report", "prepare_build", "machine_report", "matrix", "official_matrix_rows", "official_plan", "official_steps", "plan", "plan_doctor", "render_plan", "refuse_build", "render", "standins"]


def plan(flavour: str, request: Request, recipe_format: str) -> Plan:
    """The flavour's plan of `request`, its recipe folders rendered for an engine reading `recipe_format`, with
    the request's extensions after the pytorch recipes they are built for; for a pytorch a channel has (--for, or
    the one of --out), its companions and extensions and no pytorch recipe."""
    have = havepytorch.given(request)
    if have is None:
        refuse_stray_wheels(request)
        return with_extensions(plugin(flavour).plan(request, recipe_format), request, recipe_format)
    pytorch, where = have
    the_plan = plugin(flavour).plan_for(pytorch, request, recipe_format)
    # what the builds install it with must be there: its run requirements from the channels the builds read, or
    # brought along from their wheels (and theirs), before anything builds; only what cannot be had is refused
    channels = (*request.for_channels, *(url for r in the_plan.recipes for url in r.channels))
    found = closure.bring_along(((pytorch.depends, pytorch.stem),), channels, pytorch.python, pytorch.subdir,
                                closure.default_source(request.wheel_folders),
                                Runner(echo=note))  # planning reads the wheels: shown, even in a dry run
    closure.refuse_missing(found)
    fact = ("pytorch", f"{pytorch.stem}: {where}; no pytorch source build is planned"
            + (f" (arch list {pytorch.arch_list}, read from its libraries)" if pytorch.arch_list else ""))
    brought = closure.brought_recipes(found)
    the_plan = dataclasses.replace(the_plan, recipes=(*brought, *the_plan.recipes), facts=(fact, *the_plan.facts),
                                   brought_along=found.brought)
    return with_extensions(the_plan, request, recipe_format)


def refuse_stray_wheels(request: Request) -> None:
    """--wheels for a plan that builds its own pytorch and no extension: a usage error, not a flag silently
    ignored."""
    if request.wheel_folders and not request.extensions:
        raise UsageError("--wheels brings along the requirements of a pytorch a channel has or of an extension, and "
                         "the request names neither",
                         "give --for SPEC (or --out holding one pytorch, with --extension or --with), or --extension "
                         "SPEC, or leave --wheels out")


def builds_a_given_pytorch(request: Request) -> bool:
    """Whether `request` is for a pytorch a channel has: the flavours' own build, render and stand-in paths, which
    read their own model, do not apply."""
    return havepytorch.given(request) is not None


def refuse_build(flavour: str, request: Request) -> None:
    """A request the flavour renders but torchforge does not build here: a usage error (2) before anything runs."""
    refusal = plugin(flavour).build_refusal(request)
    if refusal is not None:
        raise UsageError(*refusal)


def matrix(flavour: str, request: Request) -> MatrixView:
    """The flavour's `matrix` of `request`: its JSON rows and its table (and the rows of its extensions)."""
    if builds_a_given_pytorch(request):
        return given_matrix(plan(flavour, request, "rattler-build"))
    refuse_stray_wheels(request)
    view = plugin(flavour).matrix(request)
    return with_extension_rows(view, plan(flavour, request, "rattler-build")) if request.extensions else view


def given_matrix(the_plan: Plan) -> MatrixView:
    """`matrix` for a pytorch a channel has: its row (in the channel, not built), then its companions' and its
    extensions' rows."""
    pytorch = the_plan.given_pytorch
    assert pytorch is not None
    rows: list[dict[str, object]] = [{"id": pytorch.stem, "kind": "pytorch", "status": "in channel",
                                      "version": pytorch.version, "build_string": pytorch.build,
                                      "subdir": pytorch.subdir, "python": pytorch.python, "cuda": pytorch.cuda or "cpu",
                                      "arch_list": pytorch.arch_list, "file": pytorch.stem}]
    rows += [{"id": r.id, "kind": r.kind, "status": "planned", "build_string": r.stems[0].rsplit("-", 1)[-1],
              "subdir": r.subdir, "python": r.python, "cuda": r.accel, "arch_list": r.arch_list,
              "file": r.stems[0], "pytorch": pytorch.stem} for r in the_plan.recipes if r.kind != "extension"]
    view = MatrixView(tuple(rows), f"torchforge plan for {pytorch.stem} (flavour {the_plan.flavour})",
                      ("recipe", "kind", "build string", "notes"),
                      tuple((str(r["id"]), str(r["kind"]), str(r["build_string"]),
                             "in the channel: not built" if r["status"] == "in channel" else f"for {pytorch.stem}")
                            for r in rows))
    return with_extension_rows(view, the_plan)


def machine_report(the_plan: Plan, *, engine: str | None, jobs: int | None, out: Path, site: SiteConfig,
                   extra_channels: tuple[str, ...] = (), runner: Runner | None = None,
                   container: containers.ContainerSettings | None = None, machine: Machine | None = None,
                   check_channels: bool = True) -> PreflightReport:
    """The flavour's own rows, then every machine check of what the plan needs (`check_channels`: that its channels
    answer and its requirements solve: network); with `container`, the build images of its recipes instead of this
    machine's engine and toolkit; `machine`: the cores, memory and platform planned for (default: this one's)."""
    report = run_machine_checks(the_plan.needs, engine=engine, jobs=jobs, runner=runner or Runner(), out=out,
                                machine=machine, site=site, extra_channels=extra_channels,
                                check_channels=check_channels, container=container,
                                image_targets=image_targets(the_plan))
    facts = tuple(Check(name, Level.OK, detail) for name, detail in the_plan.facts)
    return PreflightReport((*facts, *report.checks), report.max_jobs, report.engine)


def _in_images(the_plan: Plan) -> list[PlannedRecipe]:
    """The recipes a build image builds: those of Python packages first (their order is the request's), then the
    others (magma); recipes built beside the others (the official companions, noarch) need none of their own."""
    return sorted((r for r in the_plan.recipes if r.build_flags or r.pythons), key=lambda r: not r.pythons)


def image_targets(the_plan: Plan) -> list[tuple[str, str]]:
    """(accel, cuDNN) of each recipe a build image builds."""
    return [(r.accel, r.cudnn) for r in _in_images(the_plan)]


def dry_run_report(the_plan: Plan, *, out: Path) -> PreflightReport:
    """What a dry run can already refuse without looking at a tool: the platform, --out, each --source."""
    return run_needs_checks(the_plan.needs, out=out)


def prepare_build(flavour: str, request: Request, options: BuildOptions) -> PreparedBuild:
    """Choose the engine, plan, refuse or warn, check the machine, make the steps: all a build does before it runs,
    one way for every flavour."""
    return _plan_build(flavour, request, options, site_config.load(options.config))


def channel_plan(request: Request, recipe_format: str, channel: Path) -> Plan:
    """The plan of a stack whose pytorch no flavour builds (repacked, or already in a channel): the request's
    extensions for the pytorch of `channel`."""
    return with_extensions(Plan("channel", ()), request, recipe_format, channel)


def prepare_plan_build(request: Request, options: BuildOptions, planner: Callable[[str], Plan]) -> PreparedBuild:
    """`prepare_build` of a plan no flavour makes (a stack's, for a repacked pytorch or one in a channel):
    `planner` plans it for the chosen engine's recipe format."""
    return _plan_build("", request, options, site_config.load(options.config), planner=planner)


def _plan_build(flavour: str, request: Request, options: BuildOptions, site: SiteConfig,
                planner: Callable[[str], Plan] | None = None) -> PreparedBuild:
    """A flavour's plan (or `planner`'s): refused or warned about, the machine checked, then its steps; with
    --container each recipe runs the conda-build of its CUDA's image; a plan of pip wheels, pip in this Python."""
    if planner is None:
        refuse_build(flavour, request)
    # the recipes are rendered for the conda engine (the image's with --container); an --engine this machine lacks
    # is refused here without preflight, else by preflight with every other problem (a dry run prints commands)
    conda = container_engine(options.engine) if options.container else \
        select_engine(options.engine, require_available=False)
    the_plan = (planner or (lambda recipe_format: plan(flavour, request, recipe_format)))(conda[0].recipe_format)
    chosen, why = plan_engine(the_plan.engine, conda, container=options.container, dry_run=options.dry_run)
    if the_plan.engine is None and not options.container and options.skip_preflight and not options.dry_run:
        select_engine(options.engine)
    env_jobs = the_plan.needs.env_max_jobs
    jobs = checked_jobs(options.jobs, (("MAX_JOBS", env_jobs),) if env_jobs else ())
    for message in the_plan.warnings:
        warn(message)
    err.print(why)
    if site.path is not None:
        err.print(f"channels and images from {site.path}")
    in_images = _image_settings(the_plan, site.images, dry_run=options.dry_run) if options.container else None
    extra_env = _checked_machine(the_plan, None if options.container else the_plan.engine or options.engine, jobs,
                                 options, site)
    if in_images is not None and not options.dry_run and not options.skip_preflight:
        _container_rows(the_plan, in_images)
    settings = options.settings(request, site.channels, extra_env=extra_env, container=in_images)
    if the_plan.engine is not None:  # pip wheels: repaired into OUT/wheels
        settings = settings.for_wheels()
    steps = plan_steps(the_plan, settings)
    if not options.dry_run:
        widened = with_extension_requirements(the_plan, steps, settings, request)
        if widened is not the_plan:  # what it brings along comes first: the steps again, with those
            the_plan, steps = widened, plan_steps(widened, settings)
    return PreparedBuild(tuple(steps), chosen, settings, the_plan.brought_along)


def with_extension_requirements(the_plan: Plan, steps: Sequence[Step], settings: BuildSettings,
                                request: Request) -> Plan:
    """The plan with the run requirements of each extension it builds that no channel of that build provides,
    brought along (their wheels' requirements too), or refused, before anything builds. The sdist is fetched and
    its metadata read for that here, once, as its build reads them (a dry run does neither: its rows say so)."""
    building = {step.id for step in steps if step.action is Action.BUILD}
    planned = frozenset({stem.rsplit("-", 2)[0] for r in the_plan.recipes for stem in r.stems}
                        | {p.name for p in the_plan.brought_along})
    groups: dict[tuple[str, str, tuple[str, ...]], list[tuple[tuple[str, ...], str]]] = {}
    for recipe in the_plan.recipes:
        run = run_requirements(recipe) if recipe.id in building else None
        if run:
            channels = build_channels(settings.out, settings.channels, settings.site_channels.apply(recipe.channels))
            groups.setdefault((recipe.python or "", recipe.subdir, channels), []).append((run, recipe.stems[0]))
    found: list[closure.Closure] = []
    for (python, subdir, channels), wants in groups.items():
        earlier = frozenset(p.name for c in found for p in c.brought)
        found.append(closure.bring_along(wants, channels, python, subdir, closure.default_source(request.wheel_folders),
                                         Runner(echo=note), planned | earlier))
    closure.refuse_missing(closure.Closure((), tuple(m for c in found for m in c.missing)))
    brought = tuple(p for c in found for p in c.brought)
    if not brought:
        return the_plan
    return dataclasses.replace(the_plan, recipes=(*closure.brought_recipes(closure.Closure(brought, ())),
                                                  *the_plan.recipes), brought_along=(*the_plan.brought_along, *brought))


def _image_settings(the_plan: Plan, images: Mapping[str, containers.Image], *,
                    dry_run: bool) -> containers.ContainerSettings:
    """--container for a plan of any flavour: each recipe's accel and cuDNN pick its image, refused before the
    machine checks and any build, as the official flavour's are."""
    return containers.for_build(image_targets(the_plan), [r.subdir for r in _in_images(the_plan)], images,
                                dry_run=dry_run, check_cudnn_now=True)


def _container_rows(the_plan: Plan, settings: containers.ContainerSettings) -> None:
    """Preflight's container rows: the tool answers, each recipe's image is here and can build it."""
    report = container_report(settings, image_targets(the_plan), Runner())
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
    # the folders are not looked at here: rendered for conda-build, which renders every platform's
    return plan_doctor(plan(flavour, request, "conda-build"), options)


def plan_doctor(the_plan: Plan, options: BuildOptions) -> PreflightReport:
    """`doctor` of a plan made already (a flavour's, or `channel_plan`'s)."""
    site = site_config.load(options.config)
    env_jobs = the_plan.needs.env_max_jobs
    jobs = checked_jobs(options.jobs, (("MAX_JOBS", env_jobs),) if env_jobs else ())
    in_images = containers.ContainerSettings(containers.probe_tool() or "", site.images) if options.container else None
    report = machine_report(the_plan, engine=options.engine, jobs=jobs, out=options.out, site=site,
                            extra_channels=options.channels, container=in_images)
    return report


def render(flavour: str, request: Request, recipe_format: str, out_dir: Path, *, force: bool) -> Rendered:
    """`render`: the flavour's recipe folders under `out_dir`, written all or none."""
    return render_plan(plan(flavour, request, recipe_format), out_dir, force=force)


def render_plan(the_plan: Plan, out_dir: Path, *, force: bool) -> Rendered:
    """The recipe folders of a plan made already, written all or none (a recipe no engine builds, such as a
    stack's repacked packages, has none)."""
    rendered = [recipe for recipe in the_plan.recipes if recipe.files and recipe.rendered]
    written = write_folders({recipe.id: dict(recipe.files) for recipe in rendered}, out_dir, force=force)
    channels = ", ".join(dict.fromkeys(url for recipe in rendered for url in recipe.channels))
    return Rendered(tuple(written), the_plan.warnings, f"rendered {len(written)} {the_plan.flavour}-flavour recipe "
                    f"folder(s) into {out_dir}" + (f" (channel: {channels})" if channels else ""))


@dataclass(frozen=True)
class StandIns:
    """What `standin-channel` writes stand-ins for: the specs, what they come from, and whether the stand-ins take
    conda-forge's package shapes (a plan whose recipes read conda-forge's packages: Plan.conda_forge_packages)."""

    specs: tuple[str, ...]
    shape: str
    conda_forge: bool
    python: str = ""  # the Python X.Y its extensions' stand-ins are for ("": --py's first, or this machine's)
    cuda: bool = False  # a CUDA pytorch: its extensions' recipes install ninja


def standins(flavour: str, request: Request) -> StandIns:
    """The requirements of every recipe `build` would build for `request` (as rattler-build renders its folders),
    refused where build refuses it."""
    refusal = plugin(flavour).build_refusal(request)
    if refusal is not None:
        raise UsageError(f"{refusal[0]}: there is no build to stand in for", refusal[1])
    have = havepytorch.given(request)
    if have is not None:
        return given_standins(flavour, request, *have)
    the_plan = plan(flavour, request, "rattler-build")
    return StandIns(tuple(plan_requirements(the_plan)), f"the {the_plan.flavour} flavour's recipes (recipe.yaml)",
                    the_plan.conda_forge_packages, (request.python or "").split(",")[0],
                    bool(request.cuda and request.cuda != "cpu"))


def given_standins(flavour: str, request: Request, pytorch: PytorchBuild, where: str) -> StandIns:
    """For a pytorch a channel has (--for): its run requirements that no --channel provides (what `build` would
    bring along from wheels instead), and the requirements of its companions' recipes (--with); nothing is
    fetched. The extensions' are the caller's (commands/tryout.extension_standins)."""
    the_plan = plugin(flavour).plan_for(pytorch, request, "rattler-build")
    missing = [u.spec for u in provided.unprovided(pytorch.depends, pytorch.stem, request.for_channels)]
    python = next((s for s in pytorch.depends if s.split()[0] == "python"), f"python {pytorch.python}.*")
    # the recipes' pins of this very pytorch (host `pytorch ==V BUILD`, run `pytorch ==V`) are its channel's file:
    # a stand-in of that name would be one more pytorch for the solver to choose
    recipes = [spec for spec in plan_requirements(the_plan) if spec.split()[0] != "pytorch"]
    return StandIns(tuple(dict.fromkeys([python, *missing, *recipes])),
                    f"{pytorch.stem} ({where}) and its recipes", the_plan.conda_forge_packages, pytorch.python,
                    pytorch.cuda is not None)


def ci(flavour: str, request: Request, settings: JobSettings, *, flavour_given: bool) -> CiPlan:
    """`ci`: the jobs that build the flavour's plan of `request`, refused where build refuses it. The folders are
    rendered for conda-build (the jobs read only the packages' names and build flags, the same for every engine).
    The jobs pin the flavour where it was given or `torchforge build` would choose another for the release."""
    from torchforge.ci import recipes as ci_jobs  # the CI file's modules load only for `ci`

    refuse_build(flavour, request)
    the_plan = plan(flavour, request, "conda-build")
    pinned = flavour_given or choose(None, ci_jobs.resolved(the_plan).release)[0].value != flavour
    return ci_jobs.ci_plan(the_plan, dataclasses.replace(settings, flavour_flags=("--flavour", flavour) if pinned else ()))

