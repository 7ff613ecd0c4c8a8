"""`torchforge build`: plan, check, build magma before pytorch, audit and publish into a local channel."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated

import typer
from rich.live import Live
from rich.table import Table
from rich.text import Text

from torchforge.commands.options import (
    ArchListOpt, BuildNumberOpt, CudaOpt, DebugOpt, EnvOpt, FeedstockPatchesOpt, FlavourOpt, GccOpt, JetsonOpt, MagmaPatchOpt, MagmaSourceOpt, PatchOpt,
    ConfigOpt, PlatformOpt, PythonOpt, PytorchOpt, SourceOpt, check_channel_args, chosen_flavour, nonempty_path, selection_from_flags,
)
from torchforge import config as site_config
from torchforge import containers
from torchforge.console import err, note, out, warn
from torchforge.diagnose import explain_log
from torchforge.engines import Engine
from torchforge.engines.choice import select_engine
from torchforge.engines.pip_wheel import PipWheelEngine
from torchforge.errors import BuildFailedError, ToolMissingError, UsageError
from torchforge import sequence
from torchforge.flavours import JOBS_VARIABLE, Request
from torchforge.flavours import Plan as PlanOfRecipes
from torchforge.flavours import MAGMA_ONLY, Flavour
from torchforge.preflight import checked_jobs, container_report, report_table, run_plan_checks, run_preflight
from torchforge.pipeline import Action, BuildSettings, Pipeline, Step, StepResult, plan_steps
from torchforge.fileops import check_dir
from torchforge.proc import Runner
from torchforge.render import RenderPlan, plan
from torchforge.resolve import bundled_cudnn
from torchforge.wheelbuild import check_wheel_request, plan_wheel_steps, wheel_settings


def _cache_plan(step: Step) -> str:
    if step.cache_key is None:
        return "-" if step.action is Action.BUILD else ""
    if step.cache_first is None:
        return f"fills {step.cache_key}"
    return f"reuses the objects of {step.cache_first}"


def print_plan(steps: list[Step], extra: tuple[str, ...] = (), cache_root: Path | None = None) -> None:
    table = Table(title="build plan (in order)")
    for column in ("#", "package", "action", "why / needs", "channels (after the output channel)", "compile cache"):
        table.add_column(column, overflow="fold")
    for number, step in enumerate(steps, 1):
        action = "[green]reuse[/]" if step.action is Action.REUSE else "[cyan]build[/]"
        table.add_row(str(number), "\n".join(step.stems), action, step.reason or ", ".join(step.needs),
                      "\n".join((*extra, *step.channels)) or "-", _cache_plan(step))
    err.print(table)
    if cache_root is not None and any(step.cache_key for step in steps):
        err.print(f"compile cache (ccache): {cache_root}/<key>; --no-cache builds every variant from scratch")


def _cache_result(result: StepResult) -> str:
    if result.cache is None:
        return ""
    text = result.cache.summary()
    reference = (result.cold_seconds, "the cold build") if result.cold_seconds else (result.first_seconds, "the first Python")
    if reference[0]:
        text += f"; {result.seconds:.0f} s = {100 * result.seconds / reference[0]:.0f} % of {reference[1]}"
        text += f" ({reference[0]:.0f} s; {reference[0] - result.seconds:.0f} s saved)"
    return text


def print_results(results: list[StepResult]) -> None:
    table = Table(title="build results")
    for column in ("package", "result", "time", "compile cache", "artifact / error"):
        table.add_column(column, overflow="fold")
    for result in results:
        status = "[green]ok[/]" if result.ok else "[red]failed[/]"
        # a step of several outputs (one recipe) shows one row per package; they share its time and outcome
        artifacts = result.artifacts or ((result.artifact,) if result.artifact else ())
        for number, stem in enumerate(result.step.stems):
            if number < len(artifacts):
                detail = str(artifacts[number])
            elif number:
                detail = "(same build)"
            else:
                detail = result.step.reason if result.ok else result.error.splitlines()[0]
            table.add_row(stem, status, f"{result.seconds:.0f} s", _cache_result(result) if number == 0 else "", detail)
    out.print(table)


def _explain(result: StepResult) -> None:
    """Show the tail of a failed log, and what known failure signatures in it mean."""
    if result.error:
        err.print(Text(result.error))
    if result.log is None or not result.log.exists():
        return
    for diagnosis in explain_log(result.log):
        err.print(f"[bold]known failure[/bold] (line {diagnosis.line}): {diagnosis.title}", markup=True)
        err.print(f"  fix: {diagnosis.fix}", markup=False)


def _container_engine(engine: str) -> tuple[Engine, str]:
    """The engine inside the images: conda-build, which they carry, as the official builds used it there."""
    if engine == "rattler-build":
        raise UsageError("--container runs conda-build inside the build images; the embedded rattler-build engine lives "
                         "in torchforge's own Python, which the images do not have",
                         "drop --engine rattler-build (auto and conda-build both work with --container)")
    chosen, _ = select_engine("conda-build", require_available=False)
    return chosen, "using conda-build inside the build image (--container)"


def _wheel_engine(container: bool, magma_only: bool, render_plan: RenderPlan, source: str | None, *,
                  require_available: bool) -> tuple[Engine, str]:
    """--format wheel's engine: pip in this interpreter (no build image has it, and a wheel holds no magma); a
    request it cannot build is refused before the machine is looked at."""
    if container or magma_only:
        raise UsageError(f"{'--container' if container else '--magma-only'} applies to conda packages, not to "
                         "--format wheel (pip builds the wheel in this interpreter)",
                         "leave it out, or build conda packages (--format conda)")
    check_wheel_request(render_plan, source)
    chosen = PipWheelEngine()
    if require_available and not chosen.available():
        raise ToolMissingError(f"{sys.executable} has no pip to build wheels with", f"{sys.executable} -m ensurepip")
    return chosen, f"using pip wheel with {sys.executable} (--format wheel)"


def _image_settings(the_plan: PlanOfRecipes, images: Mapping[str, containers.Image], *,
                    dry_run: bool) -> containers.ContainerSettings:
    """--container for a plan of any flavour: each recipe's accel and cuDNN pick its image, refused before the
    machine checks and any build, as the official flavour's are."""
    return containers.for_build([(r.accel, r.cudnn) for r in the_plan.recipes], [r.subdir for r in the_plan.recipes],
                                images, dry_run=dry_run, check_cudnn_now=True)


def _container_rows(the_plan: PlanOfRecipes, settings: containers.ContainerSettings) -> None:
    """Preflight's container rows: the tool answers, each recipe's image is here and can build it."""
    report = container_report(settings, [(r.accel, r.cudnn) for r in the_plan.recipes], Runner())
    err.print(report_table(report))
    report.raise_if_failed()


def register(app: typer.Typer) -> None:
    @app.command("build")
    def build(
        pytorch: PytorchOpt = None, cuda: CudaOpt = None, python: PythonOpt = None, platform: PlatformOpt = None,
        arch_list: ArchListOpt = None, build_number: BuildNumberOpt = 0, debug: DebugOpt = False,
        jetson: JetsonOpt = None, env: EnvOpt = None, gcc: GccOpt = None, source: SourceOpt = None,
        magma_source: MagmaSourceOpt = None, patch: PatchOpt = None, magma_patch: MagmaPatchOpt = None,
        engine: Annotated[str, typer.Option("--engine", help="auto, conda-build or rattler-build.")] = "auto",
        fmt: Annotated[str, typer.Option("--format", help="conda (packages in a channel) or wheel.")] = "conda",
        channel: Annotated[list[str] | None, typer.Option("--channel", "-c", help="Extra channel URL (repeatable).")] = None,
        out_dir: Annotated[Path, typer.Option("--out", parser=nonempty_path, help="Local channel receiving the packages.")] = Path("forge-channel"),
        jobs: Annotated[int | None, typer.Option("--jobs", min=1, help="MAX_JOBS for the compilers (default: from memory and cores).")] = None,
        keep_going: Annotated[bool, typer.Option("--keep-going", help="Continue past a failed variant.")] = False,
        force: Annotated[bool, typer.Option("--force", help="Rebuild packages already in the channel.")] = False,
        dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan and exact commands; build nothing.")] = False,
        no_test: Annotated[bool, typer.Option("--no-test", help="Skip the recipes' test sections.")] = False,
        magma_only: Annotated[bool, typer.Option("--magma-only", help="Build only the magma-cudaXYZ packages.")] = False,
        skip_preflight: Annotated[bool, typer.Option("--skip-preflight", help="Do not check the machine first.")] = False,
        container: Annotated[bool, typer.Option("--container", help="Run each build in its CUDA version's image (docker or podman).")] = False,
        config: ConfigOpt = None,
        cache: Annotated[Path | None, typer.Option("--cache", help="Compile cache folder shared by the Pythons of a plan (default: OUT/.cache/compile).")] = None,
        no_cache: Annotated[bool, typer.Option("--no-cache", help="No compile cache: every variant compiles from scratch.")] = False,
        flavour: FlavourOpt = None,
        feedstock_patches: FeedstockPatchesOpt = False,
        keep_work: Annotated[bool, typer.Option("--keep-work", help="Keep a failed build's work folder (under OUT/.torchforge-kept).")] = False,
    ) -> None:
        """Build magma-cudaXYZ and pytorch packages into a local channel (magma first, reuse what exists); with the
        conda-forge flavour, libtorch, pytorch per Python and the metapackage of each recipe."""
        if fmt not in ("conda", "wheel"):
            raise UsageError(f"unknown --format {fmt!r}", "use conda or wheel")
        if no_cache and cache is not None:
            raise UsageError("--cache and --no-cache contradict each other", "give one of them")
        check_dir(out_dir, "--out")
        check_channel_args(channel)
        flavour_chosen = chosen_flavour(flavour, pytorch, cuda, python, platform, arch_list, build_number,
                                        "--format wheel builds pip wheels" if fmt == "wheel"
                                        else MAGMA_ONLY if magma_only else "")
        if flavour_chosen is not Flavour.OFFICIAL:
            request = Request(pytorch, cuda, python, platform, arch_list, build_number, source, tuple(patch or ()),
                              feedstock_patches, flavour_flags=(
                                  ("--debug", debug), ("--jetson", jetson), ("--env", env), ("--gcc", gcc),
                                  ("--magma-source", magma_source), ("--magma-patch", magma_patch),
                                  ("--magma-only", magma_only), ("--format wheel", fmt == "wheel")))
            settings = BuildSettings(out=out_dir, channels=tuple(channel or ()), force=force, keep_going=keep_going,
                                     test=not no_test, patches=tuple(patch or ()), use_cache=not no_cache,
                                     cache_root=cache, keep_work=keep_work)
            _build_plan(flavour_chosen, request, engine, checked_jobs(jobs, ()), settings, site_config.load(config),
                        container=container, dry_run=dry_run, skip_preflight=skip_preflight)
            return
        if feedstock_patches:
            raise UsageError("--feedstock-patches applies to --flavour conda-forge only",
                             "add --flavour conda-forge, or leave --feedstock-patches out")
        selection = selection_from_flags(pytorch, cuda, python, platform, arch_list, build_number, debug, jetson,
                                         env, gcc, source, magma_source, patch, magma_patch)
        jobs = checked_jobs(jobs, selection.options.extra_env)
        render_plan = plan(selection)
        # Refused before the engine or the machine is looked at: the same exit (4) as every other command,
        # with or without --dry-run.
        render_plan.require_buildable()
        for variant in () if magma_only else render_plan.variants:  # --magma-only builds no pytorch
            for message in variant.warnings:
                warn(f"{variant.id}: {message}")
        for magma in render_plan.magma:
            for message in magma.warnings:
                warn(f"{magma.id}: {message}")
        site = site_config.load(config)
        container_settings = None
        if fmt == "wheel":
            chosen, why = _wheel_engine(container, magma_only, render_plan, source, require_available=not dry_run)
        elif container:
            chosen, why = _container_engine(engine)
            # Without preflight its cuDNN check still runs: an image with another cuDNN cannot build the plan
            # (build.sh stops after the whole compile), which is about the plan, not about this machine.
            container_settings = containers.for_build(
                [(v.request.accel, "" if magma_only else bundled_cudnn(v)) for v in render_plan.variants],
                [selection.platform], site.images, dry_run=dry_run, check_cudnn_now=dry_run or skip_preflight)
        else:
            chosen, why = select_engine(engine, require_available=not dry_run)
        err.print(why)
        if site.path is not None:
            err.print(f"channels and images from {site.path}")
        extra_env: dict[str, str] = {}
        if dry_run and not skip_preflight:
            # No tool is looked at, but what a dry run can know already fails it as the real build would.
            plan_report = run_plan_checks(render_plan, source=source, out=out_dir, magma_only=magma_only)
            if not plan_report.ok:
                err.print(report_table(plan_report))
            plan_report.raise_if_failed()
        if not skip_preflight and not dry_run:
            # Check the machine before a multi-hour build: every problem at once, each with its fix.
            report = run_preflight(render_plan, engine=chosen.name, source=source, jobs=jobs, runner=Runner(),
                                   out=out_dir, site=site, extra_channels=tuple(channel or ()),
                                   container=container_settings, check_channels=fmt == "conda", magma_only=magma_only)
            err.print(report_table(report))
            report.raise_if_failed()
            if report.max_jobs:
                extra_env["MAX_JOBS"] = str(report.max_jobs)
        if jobs:
            extra_env["MAX_JOBS"] = str(jobs)
        settings = BuildSettings(
            out=out_dir, channels=tuple(channel or ()), force=force, keep_going=keep_going, test=not no_test,
            magma_only=magma_only, patches=tuple(patch or ()), magma_patches=tuple(magma_patch or ()),
            extra_env=extra_env, site_channels=site.channels, container=container_settings,
            use_cache=not no_cache, cache_root=cache, keep_work=keep_work,
        )
        if fmt == "wheel":
            settings = wheel_settings(settings)
        _run_plan(plan_wheel_steps(render_plan, settings, source, jobs=jobs) if fmt == "wheel"
                  else sequence.official_steps(render_plan, chosen, settings), chosen, settings, dry_run)


def _build_plan(flavour: Flavour, request: Request, engine: str, jobs: int | None, settings: BuildSettings,
                site: site_config.SiteConfig, *, container: bool, dry_run: bool, skip_preflight: bool) -> None:
    """A flavour's plan: refused or warned about, the machine checked, then its steps run (or printed); with
    `container` each recipe runs the conda-build of its CUDA's image."""
    sequence.refuse_build(flavour, request)
    if container:  # the engine is the image's: this machine's is not looked at
        chosen, why = _container_engine(engine)
    else:
        # without preflight the engine itself is checked; preflight shows a missing conda-build with the rest
        chosen, why = select_engine(engine, require_available=skip_preflight and not dry_run)
    the_plan = sequence.plan(flavour, request, chosen.recipe_format)
    for message in the_plan.warnings:
        warn(message)
    in_images = _image_settings(the_plan, site.images, dry_run=dry_run) if container else None
    extra_env = _checked_machine(the_plan, None if container else engine, jobs, settings.out, site, settings.channels,
                                 dry_run=dry_run, skip_preflight=skip_preflight)
    if in_images is not None and not dry_run and not skip_preflight:
        _container_rows(the_plan, in_images)
    err.print(why)
    settings = dataclasses.replace(settings, site_channels=site.channels, extra_env=extra_env, container=in_images)
    _run_plan(plan_steps(the_plan, settings), chosen, settings, dry_run)


def _checked_machine(the_plan: PlanOfRecipes, engine: str | None, jobs: int | None, out: Path, site: site_config.SiteConfig,
                     channels: tuple[str, ...], *, dry_run: bool, skip_preflight: bool) -> dict[str, str]:
    """The machine checks of a plan before its build (a dry run: those that need no tool); the build's MAX_JOBS."""
    if skip_preflight:
        return {JOBS_VARIABLE: str(jobs)} if jobs else {}
    if dry_run:
        plan_report = sequence.dry_run_report(the_plan, out=out)
        if not plan_report.ok:
            err.print(report_table(plan_report))
        plan_report.raise_if_failed()
        return {JOBS_VARIABLE: str(jobs)} if jobs else {}
    report = sequence.machine_report(the_plan, engine=engine, jobs=jobs, out=out, site=site, extra_channels=channels)
    err.print(report_table(report))
    report.raise_if_failed()
    return {JOBS_VARIABLE: str(jobs or report.max_jobs)} if jobs or report.max_jobs else {}


def _run_plan(steps: list[Step], chosen: Engine, settings: BuildSettings, dry_run: bool) -> None:
    """Show the plan, run it (or print its commands), show each package's result; a failure exits 6."""
    print_plan(steps, settings.channels, settings.compile_cache_root if settings.caching else None)
    runner = Runner(dry_run=dry_run, echo=note if dry_run else None)
    status = Text("")
    with Live(status, console=err, transient=True, refresh_per_second=4, redirect_stdout=False) as live:
        def on_line(line: str) -> None:
            live.update(Text(line[-200:], style="dim"))

        pipeline = Pipeline(chosen, runner, settings, on_event=note, on_line=None if dry_run else on_line)
        results = pipeline.run(steps)
    if dry_run:
        return
    print_results(results)
    failed = [r for r in results if not r.ok]
    for result in failed:
        _explain(result)
    if failed:
        # counted in packages: a recipe step of several outputs fails (or is skipped) with all of them
        not_attempted = sum(len(s.stems) for s in steps[len(results):])  # the plan stops at the first failure
        raise BuildFailedError(
            f"{sum(len(r.step.stems) for r in failed)} of {sum(len(s.stems) for s in steps)} planned package(s) failed"
            + (f", {not_attempted} not attempted after it" if not_attempted else ""),
            "read the log tail above; rerun the same command to resume (finished packages are skipped)"
            + ("; --keep-going attempts the others past a failure" if not_attempted else ""),
        )
