"""`torchforge build`: plan, check, build magma before pytorch, audit and publish into a local channel."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.live import Live
from rich.table import Table
from rich.text import Text

from torchforge.commands.options import (
    ArchListOpt, BuildNumberOpt, CudaOpt, DebugOpt, EnvOpt, ExtensionEnvOpt, ExtensionOpt, FeedstockPatchesOpt, FlavourOpt, ForOpt, GccOpt, JetsonOpt, MagmaPatchOpt, MagmaSourceOpt, PatchOpt, WithOpt,
    ConfigOpt, PlatformOpt, PythonOpt, PytorchOpt, SourceOpt, WheelsOpt, check_channel_args, chosen_flavour, extension_variables, nonempty_path, with_names, WithSourceOpt, with_sources,
)
from torchforge import sequence
from torchforge.commands.stack import StackOpt, refuse_flags
from torchforge.console import err, note, out
from torchforge.diagnose import explain_log
from torchforge.engines import Engine
from torchforge.errors import BuildFailedError, UsageError
from torchforge.fileops import check_dir
from torchforge.flavours import MAGMA_ONLY, Request
from torchforge.pipeline import Action, BuildSettings, Pipeline, Step, StepResult
from torchforge.proc import Runner
from torchforge.closure import is_brought
from torchforge.remotecache import remote_cache

if TYPE_CHECKING:
    from torchforge.binaries.plan import PackagePlan


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


def _memory_result(result: StepResult) -> str:
    """MAX_JOBS and the largest process's peak memory of a build (the log says how the jobs were chosen)."""
    jobs = f"MAX_JOBS {result.jobs}" if result.jobs else ""
    peak = f"{result.peak_rss_kib / 1024**2:.2f} GiB peak" if result.peak_rss_kib else ""
    return ", ".join(part for part in (jobs, peak) if part)


def print_results(results: list[StepResult]) -> None:
    table = Table(title="build results")
    for column in ("package", "result", "time", "jobs / peak memory", "compile cache", "artifact / error"):
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
            table.add_row(stem, status, f"{result.seconds:.0f} s", _memory_result(result) if number == 0 else "",
                          _cache_result(result) if number == 0 else "", detail)
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


def register(app: typer.Typer) -> None:
    @app.command("build")
    def build(
        ctx: typer.Context,
        pytorch: PytorchOpt = None, cuda: CudaOpt = None, python: PythonOpt = None, platform: PlatformOpt = None,
        arch_list: ArchListOpt = None, build_number: BuildNumberOpt = 0, debug: DebugOpt = False,
        jetson: JetsonOpt = None, env: EnvOpt = None, gcc: GccOpt = None, source: SourceOpt = None,
        magma_source: MagmaSourceOpt = None, patch: PatchOpt = None, magma_patch: MagmaPatchOpt = None,
        engine: Annotated[str, typer.Option("--engine", help="auto, conda-build or rattler-build.")] = "auto",
        fmt: Annotated[str, typer.Option("--format", help="conda (packages in a channel) or wheel.")] = "conda",
        channel: Annotated[list[str] | None, typer.Option("--channel", "-c", help="Extra channel URL (repeatable).")] = None,
        out_dir: Annotated[Path | None, typer.Option("--out", parser=nonempty_path, help="Local channel receiving the packages (default: forge-channel).")] = None,
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
        cache_url: Annotated[str | None, typer.Option("--cache-url", envvar="TORCHFORGE_CACHE_URL", show_envvar=False, help="A compile cache server shared by runners (http://HOST/PATH or redis://HOST:PORT; credentials as ${VAR}), beside the local cache.")] = None,
        cache_read_only: Annotated[bool, typer.Option("--cache-read-only", envvar="TORCHFORGE_CACHE_READ_ONLY", show_envvar=False, help="Use the --cache-url server's objects, write none (untrusted pipelines).")] = False,
        flavour: FlavourOpt = None, with_: WithOpt = None, with_source: WithSourceOpt = None,
        extension: ExtensionOpt = None, for_: ForOpt = None,
        feedstock_patches: FeedstockPatchesOpt = False,
        keep_work: Annotated[bool, typer.Option("--keep-work", help="Keep a failed build's work folder (under OUT/.torchforge-kept).")] = False,
        stack: StackOpt = None,
        wheels: WheelsOpt = None, extension_env: ExtensionEnvOpt = None,
    ) -> None:
        """Build magma-cudaXYZ and pytorch packages into a local channel (magma first, reuse what exists); with the
        conda-forge flavour, libtorch, pytorch per Python and the metapackage of each recipe. With --stack, the
        stack file's whole stack (a repacked torch repacked first), then its lock beside the file."""
        if fmt not in ("conda", "wheel"):
            raise UsageError(f"unknown --format {fmt!r}", "use conda or wheel")
        if no_cache and cache is not None:
            raise UsageError("--cache and --no-cache contradict each other", "give one of them")
        if no_cache and cache_url is not None:
            raise UsageError("--cache-url and --no-cache contradict each other", "give one of them")
        cache_url = cache_url or None  # an empty TORCHFORGE_CACHE_URL (a CI's tag pipeline): none
        remote = remote_cache(cache_url, read_only=cache_read_only and cache_url is not None)
        if remote is not None:
            remote.config_line("check")  # each ${VAR} it names is set, before anything runs
        if stack is not None:
            refuse_flags(ctx, stack)
            options = sequence.BuildOptions(
                engine=engine, out=Path("."), jobs=jobs, force=force, keep_going=keep_going, dry_run=dry_run,
                test=not no_test, skip_preflight=skip_preflight, container=container, config=config,
                cache_root=cache, use_cache=not no_cache, keep_work=keep_work,
                cache_url=cache_url, cache_read_only=cache_read_only)
            _build_stack(stack, options, out_dir)
            return
        out_dir = out_dir or Path("forge-channel")
        check_dir(out_dir, "--out")
        check_channel_args(channel)
        flavour_chosen = chosen_flavour(flavour, pytorch, cuda, python, platform, arch_list, build_number,
                                        "--format wheel builds pip wheels" if fmt == "wheel"
                                        else MAGMA_ONLY if magma_only else "", for_spec=for_)
        request = Request(pytorch, cuda, python, platform, arch_list, build_number, source, tuple(patch or ()),
                          feedstock_patches, with_packages=with_names(with_), with_sources=with_sources(with_source),
                          extensions=tuple(extension or ()),
                          extension_env=extension_variables(extension_env), for_pytorch=for_, for_channels=(*(channel or ()), str(out_dir)),
                          wheel_folders=tuple(str(w) for w in wheels or ()),
                          flavour_flags=(
                              ("--debug", debug), ("--jetson", jetson), ("--env", tuple(env or ())), ("--gcc", gcc),
                              ("--magma-source", magma_source), ("--magma-patch", tuple(magma_patch or ())),
                              ("--magma-only", magma_only), ("--format wheel", fmt == "wheel")))
        options = sequence.BuildOptions(
            engine=engine, fmt=fmt, channels=tuple(channel or ()), out=out_dir, jobs=jobs, force=force,
            keep_going=keep_going, dry_run=dry_run, test=not no_test, skip_preflight=skip_preflight,
            container=container, config=config, cache_root=cache, use_cache=not no_cache, keep_work=keep_work,
            cache_url=cache_url, cache_read_only=cache_read_only)
        prepared = sequence.prepare_build(flavour_chosen, request, options)
        _run_plan(list(prepared.steps), prepared.engine, prepared.settings, dry_run, prepared.brought_along)


def _bring_along(brought: tuple[PackagePlan, ...], out_dir: Path, force: bool) -> None:
    """The requirements no channel provides, repacked from their wheels into the output channel (a package
    already there from the same wheel and plan is reused, as `repack` reuses it)."""
    from torchforge.binaries.plan import CudaLibs, StackPlan
    from torchforge.binaries.stack import repack_planned

    result = repack_planned(StackPlan(brought, CudaLibs.CONDA_FORGE, None, brought[0].python), out_dir, Runner(),
                            replace_=force)
    for package in sorted(result.packages, key=lambda p: p.archive.name):
        note(f"brought along: {package.archive} ({'reused' if package.reused else f'{package.seconds:.1f} s'})")


def _run_plan(steps: list[Step], chosen: Engine, settings: BuildSettings, dry_run: bool,
              brought: tuple[PackagePlan, ...] = ()) -> None:
    """Show the plan, run it (or print its commands), show each package's result; a failure exits 6. What the
    plan brings along is repacked first (no engine builds it)."""
    print_plan(steps, settings.channels, settings.compile_cache_root if settings.caching else None)
    if brought and not dry_run:
        _bring_along(brought, settings.out, settings.force)
    steps = [s for s in steps if not is_brought(s.id)]
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


def _build_stack(path: Path, options: sequence.BuildOptions, out_dir: Path | None) -> None:
    """`build --stack`: a repacked torch repacked into the output channel first, the stack's recipes built (a
    flavour's plan, or the extensions for the repacked or channel's pytorch), then the lock beside the file.
    `out_dir` (--out) replaces the file's output channel (a CI job's artifact folder)."""
    from torchforge.commands import stack as stack_command
    from torchforge.stackfile.plan import REPACKED_ID

    inputs = stack_command.read(path, out_dir)
    stack = inputs.stack
    check_dir(stack.out, f"{path}: [channels] out")
    options = dataclasses.replace(options, out=stack.out, channels=stack.channels)
    if inputs.flavour is not None:
        prepared = sequence.prepare_build(inputs.flavour.value, inputs.request, options)
    else:
        if stack.repacked:
            _repack(inputs, dry_run=options.dry_run, replace=options.force)
        prepared = sequence.prepare_plan_build(inputs.request, options,
                                               lambda recipe_format: stack_command.channel_plan(inputs, recipe_format)[0])
    # the repack made those packages already (a dry run said it would): no engine builds them
    steps = [s for s in prepared.steps if s.id != REPACKED_ID]
    _run_plan(steps, prepared.engine, prepared.settings, options.dry_run, prepared.brought_along)
    if not options.dry_run:
        stack_command.write_lock(inputs, [stem for step in prepared.steps for stem in step.stems])


def _repack(inputs: "stack_command.StackInputs", *, dry_run: bool, replace: bool) -> None:
    from torchforge.binaries.stack import repack_planned
    from torchforge.commands import stack as stack_command
    from torchforge.stackfile import requests
    from torchforge.stackfile.plan import wheels_plan

    stack = inputs.stack
    planned = wheels_plan(stack, requests.repack_request(stack), stack_command.wheel_paths(stack))
    if dry_run:
        note(f"would repack {len(planned.packages)} wheel(s) into {stack.out}")
        return
    result = repack_planned(planned, stack.out, Runner(), replace_=replace)
    for package in sorted(result.packages, key=lambda p: p.archive.name):
        out.print(f"{package.archive}  ({'reused' if package.reused else f'{package.seconds:.1f} s'})", markup=False)
