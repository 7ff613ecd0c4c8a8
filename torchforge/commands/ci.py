"""`torchforge ci github|gitlab`: write the CI file that builds a selection, one job per recipe (sequence.ci)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from torchforge import config as site_config
from torchforge import fileops, selfwheel
from torchforge.ci import CiPlan, CiRemoteCache, Provider, check_writable, load_data, repository_path, site_args, write_file
from torchforge.ci.render import render
from torchforge.extensions.sdist import names_a_path
from torchforge.commands.options import (
    ArchListOpt, BuildNumberOpt, ConfigOpt, CudaOpt, DebugOpt, EnvOpt, ExtensionEnvOpt, ExtensionOpt, FlavourOpt, ForOpt, JetsonOpt, MagmaSourceOpt,
    PlatformOpt,
    PythonOpt, PytorchOpt, SourceOpt, WheelsOpt, WithOpt, check_channel_args, chosen_flavour, extension_variables, nonempty_path, with_names, WithSourceOpt, with_sources,
)
from torchforge import sequence
from torchforge.commands.stack import StackOpt, refuse_flags
from torchforge.ci.recipes import JobSettings
from torchforge.console import err, note, out
from torchforge.errors import UsageError
from torchforge.fileops import check_dir
from torchforge.proc import Runner
from torchforge.remotecache import remote_cache
from torchforge.flavours import Request
from torchforge.targets import resolve


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


RunnerOpt = Annotated[str | None, typer.Option(
    "--runner", help="Runner label(s) of every job, joined with '+', e.g. self-hosted+linux+gpu "
                     "(default: self-hosted runners of the platform).")]
RunnerMapOpt = Annotated[str | None, typer.Option(
    "--runner-map", help="Runner label(s) per CUDA version, e.g. 11.8=gpu-a,12.4=self-hosted+gpu-b; "
                         "unmapped versions use --runner.")]
GpuRunnerOpt = Annotated[str | None, typer.Option(
    "--gpu-runner", help="Runner label(s) of the CUDA variants' test jobs, joined with '+' (default: torchforge.toml "
                         "[ci] gpu_runner, else a self-hosted runner labelled gpu).")]
TestScriptOpt = Annotated[str | None, typer.Option(
    "--test-script", help="A Python file in the repository each test job runs with the fresh environment's Python "
                          "(given --version X.Y.Z, and --cuda for a CUDA variant) instead of torchforge's smoke check.")]
UploadToOpt = Annotated[str | None, typer.Option(
    "--upload-to", help="Add a last job that uploads to this target (URL or channels/ name).")]
RequirementOpt = Annotated[str | None, typer.Option(
    "--requirement", help="Where each job installs torchforge from: a git URL at a full commit or a wheel URL "
                          "with #sha256= (default: this torchforge's wheel, committed under .torchforge/).")]
WheelOpt = Annotated[Path | None, typer.Option(
    "--wheel", help="This torchforge's wheel, to commit beside the file (default: built from its source tree).")]
SkipPreflightOpt = Annotated[bool, typer.Option(
    "--skip-preflight", help="Build jobs run `torchforge build --skip-preflight` (for an image whose toolkit the "
                             "checks refuse, e.g. one without cuBLAS for a source that needs none).")]
ForceOpt = Annotated[bool, typer.Option("--force", help="Replace a file there that torchforge did not write.")]
ChannelOpt = Annotated[list[str] | None, typer.Option(
    "--channel", "-c", help="Extra channel URL for every build job (repeatable), as for build.")]
OutOpt = Annotated[Path, typer.Option(
    "--out", parser=nonempty_path, help="Repository root that receives .github/workflows/torchforge.yml or .gitlab-ci.yml.")]


def _check_env(provider: Provider, env: list[str] | None) -> None:
    for pair in env or [] if provider is Provider.GITHUB else []:
        if "${{" in pair:  # GitHub evaluates ${{ }} in every `run:` before any shell quoting applies
            raise UsageError(f"--env {pair}: GitHub Actions would evaluate its ${{{{ }}}} expression",
                             "give the value without ${{, or write the variable into the workflow yourself")


def _given(optional: list[tuple[str, str | None, bool]]) -> tuple[tuple[str, str | None], ...]:
    return tuple((flag, value) for flag, value, present in optional if present)


def _write(provider: Provider, ci: CiPlan, out_dir: Path, *, requirement: str | None, wheel: Path | None,
           force: bool) -> None:
    """The file (and, without --requirement, this torchforge's wheel first) and what was written."""
    text = render(ci, provider)
    if requirement is None:  # the wheel first: a file written without it would install nothing
        check_writable(out_dir, provider, force=force)
        _commit_wheel(wheel, out_dir)
    path = write_file(text, out_dir, provider, force=force)
    out.print(str(path))
    kinds = ", ".join(f"{sum(job.kind == kind for job in ci.jobs)} {kind}" for kind in ci.build_stages)
    err.print(f"wrote {provider.value} CI with {kinds} and {len(ci.tests)} test job(s)"
              + (f" and an upload to {ci.upload.target}" if ci.upload else "") + f" into {path}")


def ci_remote_cache(url: str | None, *, releases: bool) -> CiRemoteCache | None:
    """`ci --cache-url`: checked as `build --cache-url` is (no password in it), with the secrets it names."""
    if url is None:
        if not releases:
            raise UsageError("--no-remote-cache-for-releases needs --cache-url", "give the cache server's URL, or leave both out")
        return None
    checked = remote_cache(url)
    assert checked is not None
    return CiRemoteCache(url, checked.references, releases)


def register(app: typer.Typer) -> None:
    @app.command("ci")
    def ci(
        ctx: typer.Context,
        provider: Annotated[Provider, typer.Argument(help="Which CI system's file to write.")], out_dir: OutOpt,
        pytorch: PytorchOpt = None, cuda: CudaOpt = None, python: PythonOpt = None, platform: PlatformOpt = None,
        arch_list: ArchListOpt = None, build_number: BuildNumberOpt = 0, debug: DebugOpt = False,
        jetson: JetsonOpt = None, env: EnvOpt = None, source: SourceOpt = None, magma_source: MagmaSourceOpt = None,
        runner: RunnerOpt = None, runner_map: RunnerMapOpt = None, gpu_runner: GpuRunnerOpt = None,
        test_script: TestScriptOpt = None, upload_to: UploadToOpt = None, requirement: RequirementOpt = None,
        wheel: WheelOpt = None, skip_preflight: SkipPreflightOpt = False, force: ForceOpt = False,
        channel: ChannelOpt = None, config: ConfigOpt = None, flavour: FlavourOpt = None, with_: WithOpt = None,
        with_source: WithSourceOpt = None, extension: ExtensionOpt = None, for_: ForOpt = None, stack: StackOpt = None,
        extension_env: ExtensionEnvOpt = None, wheels: WheelsOpt = None,
        cache_url: Annotated[str | None, typer.Option("--cache-url", help="A compile cache server every build job uses beside its CI cache (credentials as ${VAR}: CI secrets); read-only on untrusted pipelines.")] = None,
        no_remote_cache_for_releases: Annotated[bool, typer.Option("--no-remote-cache-for-releases", help="Tag pipelines (releases) build without the --cache-url server.")] = False,
    ) -> None:
        """Write a GitHub Actions workflow or GitLab CI pipeline that builds the selection, one job per package
        (with --stack: the stack file's whole stack; a repacked torch's stack is one `build --stack` job)."""
        if stack is not None:
            refuse_flags(ctx, stack)
            _check_inputs(requirement, wheel, out_dir, None, (("--test-script", test_script, True),
                          ("--config", None if config is None else str(config), True)))
            settings = JobSettings(provider, (), (), runner, runner_map, gpu_runner, None, requirement,
                                   site_config.load(config and out_dir / config), test_script)
            _write(provider, _stack_ci(stack, out_dir, settings, upload_to, config,
                                       (("--gpu-runner", gpu_runner), ("--test-script", test_script),
                                        ("--runner", runner), ("--runner-map", runner_map),
                                        ("--upload-to", upload_to), ("--requirement", requirement))),
                   out_dir, requirement=requirement, wheel=wheel, force=force)
            return
        _check_inputs(requirement, wheel, out_dir, channel, (("--test-script", test_script, True), ("--source", source, False),
                      ("--magma-source", magma_source, False), ("--config", None if config is None else str(config), True),
                      # a local sdist or source folder is read by the jobs from their checkout, as --source is
                      *(("--extension", spec, False) for spec in extension or () if names_a_path(spec)),
                      *(("--with-source", given, False) for _, given in with_sources(with_source)),
                      # the wheel folders too: each build job brings its requirements along from its checkout
                      *(("--wheels", str(folder), False) for folder in wheels or ())))
        chosen = chosen_flavour(flavour, pytorch, cuda, python, platform, arch_list, build_number, for_spec=for_)
        request = Request(pytorch, cuda, python, platform, arch_list, build_number, source,
                          with_packages=with_names(with_), with_sources=with_sources(with_source),
                          extensions=tuple(extension or ()),
                          extension_env=extension_variables(extension_env), for_pytorch=for_,
                          for_channels=tuple(channel or ()),
                          wheel_folders=tuple(str(out_dir / folder) for folder in wheels or ()), flavour_flags=(
                              ("--debug", debug), ("--jetson", jetson), ("--env", tuple(env or ())),
                              ("--magma-source", magma_source)))
        _check_env(provider, env)
        # Resolve the target now: a typo fails here, not hours into a CI run.
        target = resolve(upload_to) if upload_to is not None else None
        given = _given([
            ("--arch-list", arch_list, arch_list is not None), ("--build-number", str(build_number), build_number != 0),
            ("--debug", None, debug), ("--jetson", jetson, jetson is not None), ("--source", source, source is not None),
            ("--magma-source", magma_source, magma_source is not None), ("--gpu-runner", gpu_runner, gpu_runner is not None),
            ("--test-script", test_script, test_script is not None), ("--skip-preflight", None, skip_preflight),
            ("--runner", runner, runner is not None), ("--runner-map", runner_map, runner_map is not None),
            ("--upload-to", upload_to, upload_to is not None), ("--requirement", requirement, requirement is not None),
            ("--with", ",".join(request.with_packages), bool(request.with_packages)),
            *(("--with-source", text, True) for text in with_source or ()),
            *(("--extension", spec, True) for spec in request.extensions),
            *(("--extension-env", text, True) for text in extension_env or ()),
            ("--cache-url", cache_url, cache_url is not None),
            ("--no-remote-cache-for-releases", None, no_remote_cache_for_releases)])
        given_after = (*(("--env", pair) for pair in env or []), *(("--channel", url) for url in channel or []),
                       *((("--config", str(config)),) if config is not None else ()), ("--out", "."))
        site_flags = site_args(channel or (), str(config) if config else None) + \
            tuple(arg for folder in wheels or () for arg in ("--wheels", str(folder))) + \
            (("--skip-preflight",) if skip_preflight else ())
        ci = sequence.ci(chosen.value, request, JobSettings(
            provider, (), site_flags, runner, runner_map, gpu_runner, target, requirement,
            site_config.load(config and out_dir / config), test_script, given, given_after,
            ci_remote_cache(cache_url, releases=not no_remote_cache_for_releases)),
            flavour_given=flavour is not None)
        _write(provider, ci, out_dir, requirement=requirement, wheel=wheel, force=force)


def _stack_ci(path: Path, out_dir: Path, settings: JobSettings, upload_to: str | None, config: Path | None,
              optional: tuple[tuple[str, str | None], ...]) -> CiPlan:
    """ci --stack: the jobs of the stack's plan. A flavour's plan has its jobs as the flags make them (with the
    file's channels); a repacked or channel pytorch's stack is built by one `torchforge build --stack FILE` job,
    tested per package and Python (CUDA ones on the GPU runners), the upload after every test."""
    import dataclasses

    from torchforge.ci.recipes import ci_plan, regenerate_line
    from torchforge.commands import stack as stack_command

    inputs = stack_command.read(path)
    stack = inputs.stack
    in_repository = repository_path(_relative(stack.path, out_dir), "--stack", out_dir, file=True)
    for wheel in stack.wheels:  # the build job repacks them from its checkout
        repository_path(_relative(wheel, out_dir), f"{stack.path}: [pytorch] wheels", out_dir, file=True)
    for folder in stack.requirement_wheels:  # and brings requirements along from these
        repository_path(_relative(folder, out_dir), f"{stack.path}: [channels] wheels", out_dir, file=False)
    upload = upload_to or stack.model.channels.upload
    config_flags = (("--config", str(config)),) if config is not None else ()
    settings = dataclasses.replace(
        settings, upload_to=resolve(upload) if upload is not None else None,
        given=(("--stack", in_repository), *((flag, value) for flag, value in optional if value is not None)),
        given_after=(*config_flags, ("--out", ".")))
    if inputs.flavour is not None:
        settings = dataclasses.replace(settings, site_flags=site_args(stack.channels, config and str(config)))
        ci = sequence.ci(inputs.flavour.value, inputs.request, settings,
                         flavour_given=inputs.stack.model.pytorch.flavour is not None)
    else:
        settings = dataclasses.replace(settings, site_flags=site_args((), config and str(config)))
        ci = ci_plan(stack_command.channel_plan(inputs, "conda-build", ("--stack", in_repository))[0], settings)
    # the file written again by `ci --stack`, not by the flags the plan resolved
    return dataclasses.replace(ci, regenerate=regenerate_line(settings.provider, (*settings.given,
                                                                                  *settings.given_after)))


def _relative(path: Path, root: Path) -> str:
    """The stack file's path in the repository `root` (it must be committed there, for every job to read it)."""
    try:
        return path.absolute().relative_to(root.absolute()).as_posix()
    except ValueError:
        return str(path)  # repository_path says why that cannot work
