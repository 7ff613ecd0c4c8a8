"""`torchforge ci github|gitlab`: write the CI file that builds a selection, one job per package."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated

import typer

from torchforge import config as site_config
from torchforge import fileops, selfwheel
from torchforge.ci import (
    Provider, check_writable, ci_plan, load_data, render, repository_path, site_args, write_file,
)
from torchforge.commands.options import (
    ArchListOpt, BuildNumberOpt, ConfigOpt, CudaOpt, DebugOpt, EnvOpt, FlavourOpt, JetsonOpt, MagmaSourceOpt, PlatformOpt, PythonOpt,
    PytorchOpt, SourceOpt, check_channel_args, chosen_flavour, nonempty_path, selection_from_flags,
)
from torchforge import sequence
from torchforge.ci_recipes import CiRecipe, RecipeJobSettings, from_planned, recipes_ci_plan
from torchforge.engines.choice import select_engine
from torchforge.console import err, note, out
from torchforge.errors import UsageError
from torchforge.fileops import check_dir
from torchforge.proc import Runner
from torchforge.flavours import Flavour, Request, choose
from torchforge.render import plan
from torchforge.targets import resolve


def regenerate_line(provider: Provider, argv: list[tuple[str, str | None]]) -> str:
    """The command that writes the same file again (flags that were given, in a fixed order)."""
    words = ["torchforge", "ci", provider.value]
    for flag, value in argv:
        words += [flag] if value is None else [flag, value]
    return shlex.join(words)


def _commit_wheel(wheel: Path | None, repository: Path) -> None:
    """This torchforge's wheel into the repository, where every job installs it from its checkout."""
    folder = load_data().tools.torchforge_wheel_dir
    if wheel is not None:
        placed = selfwheel.place(wheel, repository, folder)
    else:
        with fileops.private_scratch("ci-wheel") as scratch:
            placed = selfwheel.place(selfwheel.build(Runner(echo=note), scratch), repository, folder)
    note(f"wrote {placed}: the jobs install this torchforge from it (commit it with the CI file)")


def _check_inputs(requirement: str | None, wheel: Path | None, out_dir: Path, channel: list[str] | None,
                  paths: tuple[tuple[str, str | None, bool], ...]) -> None:
    """The flags checked before anything is planned; `paths`: (flag, value, is a file) of repository paths."""
    if requirement is not None and not requirement.strip():
        raise UsageError("--requirement is empty", "give a git URL at a full commit, or leave it out")
    if requirement is not None and wheel is not None:
        raise UsageError("--requirement and --wheel both say where the jobs get torchforge", "give one of them")
    if wheel is not None:
        selfwheel.check(wheel)
    check_dir(out_dir, "--out")
    check_channel_args(channel)
    for flag, value, file in paths:
        if value is not None:  # every job reads it from its checkout of the repository (--out)
            repository_path(value, flag, out_dir, file=file)


def _recipes(pytorch: str | None, cuda: str | None, python: str | None, platform: str | None, arch_list: str | None,
             build_number: int, source: str | None, official_only: dict[str, object]) -> tuple[CiRecipe, ...]:
    """The recipe folders of a flavour that plans them (conda-forge), as the CI jobs need them."""
    if platform == "win-64":
        raise UsageError("torchforge does not build win-64 recipes of the conda-forge flavour (it builds on linux)",
                         "write the jobs for --platform linux-64 (or linux-aarch64), or use --flavour official")
    request = Request(pytorch, cuda, python, platform, arch_list, build_number, source,
                      flavour_flags=tuple(official_only.items()))
    # The packages' names are the same for every engine; only the folder's files differ, and the jobs render them.
    engine, _ = select_engine("rattler-build", require_available=False)
    return from_planned(sequence.plan(Flavour.CONDA_FORGE, request, engine.recipe_format).recipes)


def register(app: typer.Typer) -> None:
    @app.command("ci")
    def ci(
        provider: Annotated[Provider, typer.Argument(help="Which CI system's file to write.")],
        out_dir: Annotated[Path, typer.Option("--out", parser=nonempty_path, help="Repository root that receives .github/workflows/torchforge.yml or .gitlab-ci.yml.")],
        pytorch: PytorchOpt = None, cuda: CudaOpt = None, python: PythonOpt = None, platform: PlatformOpt = None,
        arch_list: ArchListOpt = None, build_number: BuildNumberOpt = 0, debug: DebugOpt = False,
        jetson: JetsonOpt = None, env: EnvOpt = None, source: SourceOpt = None, magma_source: MagmaSourceOpt = None,
        runner: Annotated[str | None, typer.Option(
            "--runner", help="Runner label(s) of every job, joined with '+', e.g. self-hosted+linux+gpu "
                             "(default: self-hosted runners of the platform).")] = None,
        runner_map: Annotated[str | None, typer.Option(
            "--runner-map", help="Runner label(s) per CUDA version, e.g. 11.8=gpu-a,12.4=self-hosted+gpu-b; "
                                 "unmapped versions use --runner.")] = None,
        gpu_runner: Annotated[str | None, typer.Option(
            "--gpu-runner", help="Runner label(s) of the CUDA variants' test jobs, joined with '+' (default: torchforge.toml "
                                 "[ci] gpu_runner, else a self-hosted runner labelled gpu).")] = None,
        test_script: Annotated[str | None, typer.Option(
            "--test-script", help="A Python file in the repository each test job runs with the fresh environment's Python "
                                  "(given --version X.Y.Z, and --cuda for a CUDA variant) instead of torchforge's smoke check.")] = None,
        upload_to: Annotated[str | None, typer.Option(
            "--upload-to", help="Add a last job that uploads to this target (URL or channels/ name).")] = None,
        requirement: Annotated[str | None, typer.Option(
            "--requirement", help="Where each job installs torchforge from: a git URL at a full commit or a wheel URL "
                                  "with #sha256= (default: this torchforge's wheel, committed under .torchforge/).")] = None,
        wheel: Annotated[Path | None, typer.Option(
            "--wheel", help="This torchforge's wheel, to commit beside the file (default: built from its source tree).")] = None,
        skip_preflight: Annotated[bool, typer.Option(
            "--skip-preflight", help="Build jobs run `torchforge build --skip-preflight` (for an image whose toolkit the "
                                     "checks refuse, e.g. one without cuBLAS for a source that needs none).")] = False,
        force: Annotated[bool, typer.Option("--force", help="Replace a file there that torchforge did not write.")] = False,
        channel: Annotated[list[str] | None, typer.Option(
            "--channel", "-c", help="Extra channel URL for every build job (repeatable), as for build.")] = None,
        config: ConfigOpt = None,
        flavour: FlavourOpt = None,
    ) -> None:
        """Write a GitHub Actions workflow or GitLab CI pipeline that builds the selection, one job per package."""
        _check_inputs(requirement, wheel, out_dir, channel, (("--test-script", test_script, True), ("--source", source, False),
                      ("--magma-source", magma_source, False), ("--config", None if config is None else str(config), True)))
        chosen = chosen_flavour(flavour, pytorch, cuda, python, platform, arch_list, build_number)
        if chosen is Flavour.CONDA_FORGE:
            recipes = _recipes(pytorch, cuda, python, platform, arch_list, build_number, source,
                               {"--debug": debug, "--jetson": jetson, "--env": env, "--magma-source": magma_source})
            request = (recipes[0].version, ",".join(dict.fromkeys(r.accel for r in recipes)),
                       ",".join(dict.fromkeys(p for r in recipes for p in r.python_versions)), recipes[0].subdir)
        else:
            selection = selection_from_flags(pytorch, cuda, python, platform, arch_list, build_number, debug, jetson,
                                             env, None, source, magma_source)
            request = (selection.pytorch, ",".join(selection.accels), ",".join(selection.pythons), selection.platform)
        # the jobs build exactly this flavour, whatever `torchforge build`'s default for the release
        pinned = ("--flavour", chosen.value) if flavour is not None or choose(None, request[0])[0] is not chosen else ()
        for pair in env or [] if provider is Provider.GITHUB else []:
            if "${{" in pair:  # GitHub evaluates ${{ }} in every `run:` before any shell quoting applies
                raise UsageError(f"--env {pair}: GitHub Actions would evaluate its ${{{{ }}}} expression",
                                 "give the value without ${{, or write the variable into the workflow yourself")
        # Resolve the target now: a typo fails here, not hours into a CI run.
        target = resolve(upload_to) if upload_to is not None else None
        given: list[tuple[str, str | None]] = list(zip(("--pytorch", "--cuda", "--py", "--platform"), request))
        optional: list[tuple[str, str | None, bool]] = [
            ("--arch-list", arch_list, arch_list is not None), ("--build-number", str(build_number), build_number != 0),
            ("--debug", None, debug), ("--jetson", jetson, jetson is not None), ("--source", source, source is not None),
            ("--magma-source", magma_source, magma_source is not None), ("--gpu-runner", gpu_runner, gpu_runner is not None),
            ("--test-script", test_script, test_script is not None), ("--skip-preflight", None, skip_preflight),
            ("--runner", runner, runner is not None), ("--runner-map", runner_map, runner_map is not None),
            ("--upload-to", upload_to, upload_to is not None), ("--requirement", requirement, requirement is not None),
            ("--flavour", chosen.value, bool(pinned)),
        ]
        given += [(flag, value) for flag, value, present in optional if present]
        given += [("--env", pair) for pair in env or []]
        given += [("--channel", url) for url in channel or []]
        if config is not None:
            given.append(("--config", str(config)))
        given.append(("--out", "."))
        site = site_config.load(config and out_dir / config)
        extra_args = pinned + site_args(channel or (), str(config) if config else None) + \
            (("--skip-preflight",) if skip_preflight else ())
        if chosen is Flavour.CONDA_FORGE:
            request_args = ((*(("--arch-list", arch_list) if arch_list else ()),
                             *(("--build-number", str(build_number)) if build_number else ()),
                             *(("--source", source) if source else ())))
            ci = recipes_ci_plan(recipes, RecipeJobSettings(
                provider, request_args, extra_args, runner, runner_map, gpu_runner, target, requirement,
                regenerate_line(provider, given), site, test_script))
        else:
            ci = ci_plan(plan(selection), provider, runner=runner, runner_map=runner_map, upload_to=target,
                         requirement=requirement, regenerate=regenerate_line(provider, given), site=site,
                         extra_args=extra_args, gpu_runner=gpu_runner, test_script=test_script, magma_source=magma_source)
        text = render(ci, provider)
        if requirement is None:  # the wheel first: a file written without it would install nothing
            check_writable(out_dir, provider, force=force)
            _commit_wheel(wheel, out_dir)
        path = write_file(text, out_dir, provider, force=force)
        out.print(str(path))
        kinds = ", ".join(f"{sum(job.kind == kind for job in ci.jobs)} {kind}" for kind in ci.build_stages)
        err.print(f"wrote {provider.value} CI with {kinds} and {len(ci.tests)} test job(s)"
                  + (f" and an upload to {ci.upload.target}" if ci.upload else "") + f" into {path}")
