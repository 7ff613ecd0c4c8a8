"""`torchforge doctor`: the build's preflight on its own: every problem with this machine at once, with fixes."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Annotated

import typer

from torchforge.commands.options import (
    ArchListOpt, BuildNumberOpt, ConfigOpt, CudaOpt, DebugOpt, EnvOpt, ExtensionEnvOpt, ExtensionOpt, FlavourOpt, ForOpt, GccOpt, JetsonOpt, PlatformOpt, PythonOpt, PytorchOpt,
    SourceOpt, WheelsOpt, WithOpt, check_channel_args, chosen_flavour, extension_variables, nonempty_path, with_names, WithSourceOpt, with_sources,
)
from torchforge import sequence
from torchforge.commands.stack import StackOpt, refuse_flags
from torchforge.console import out
from torchforge.fileops import check_dir
from torchforge.flavours import MAGMA_ONLY, Request
from torchforge.preflight.report import PreflightReport, report_table


def register(app: typer.Typer) -> None:
    @app.command("doctor")
    def doctor(
        ctx: typer.Context,
        pytorch: PytorchOpt = None, cuda: CudaOpt = None, python: PythonOpt = None, platform: PlatformOpt = None,
        arch_list: ArchListOpt = None, build_number: BuildNumberOpt = 0, debug: DebugOpt = False,
        jetson: JetsonOpt = None, env: EnvOpt = None, gcc: GccOpt = None, source: SourceOpt = None,
        engine: Annotated[str, typer.Option("--engine", help="auto, conda-build or rattler-build.")] = "auto",
        jobs: Annotated[int | None, typer.Option("--jobs", min=1, help="MAX_JOBS to check instead of the memory-based choice.")] = None,
        out_dir: Annotated[Path | None, typer.Option("--out", parser=nonempty_path, help="Output channel folder (its disk is checked; default: forge-channel).")] = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print the checks as JSON.")] = False,
        channel: Annotated[list[str] | None, typer.Option("--channel", "-c", help="Extra channel URL (repeatable), as for build.")] = None,
        container: Annotated[bool, typer.Option("--container", help="Check for builds inside the CUDA images instead of this machine's toolkit.")] = False,
        config: ConfigOpt = None,
        magma_only: Annotated[bool, typer.Option("--magma-only", help="Check only what the magma-cudaXYZ packages need (no cuDNN).")] = False,
        flavour: FlavourOpt = None, with_: WithOpt = None, with_source: WithSourceOpt = None,
        extension: ExtensionOpt = None, for_: ForOpt = None,
        stack: StackOpt = None, wheels: WheelsOpt = None, extension_env: ExtensionEnvOpt = None,
    ) -> None:
        """Check this machine for a build of the selection: engine, nvcc, host compiler, cuBLAS/cuSPARSE/cuDNN, tools, disk,
        MAX_JOBS, source, driver, that every channel answers and that each variant's build and host requirements solve
        from them.

        Prints every check, then exits 9 if any failed (warnings do not fail).
        """
        if stack is not None:
            refuse_flags(ctx, stack, also=("out_dir",))
            _show(_stack_doctor(stack, sequence.BuildOptions(engine=engine, jobs=jobs, container=container,
                                                             config=config)), as_json)
            return
        out_dir = out_dir or Path("forge-channel")
        flavour = chosen_flavour(flavour, pytorch, cuda, python, platform, arch_list, build_number,
                                 MAGMA_ONLY if magma_only else "", for_spec=for_)
        check_dir(out_dir, "--out")
        channels = check_channel_args(channel)
        request = Request(pytorch, cuda, python, platform, arch_list, build_number, source, with_packages=with_names(with_),
                          with_sources=with_sources(with_source),
                          extensions=tuple(extension or ()), extension_env=extension_variables(extension_env), for_pytorch=for_,
                          for_channels=(*channels, str(out_dir)), wheel_folders=tuple(str(w) for w in wheels or ()),
                          flavour_flags=(
            ("--debug", debug), ("--jetson", jetson), ("--env", tuple(env or ())), ("--gcc", gcc),
            ("--container", container), ("--magma-only", magma_only)))
        options = sequence.BuildOptions(engine=engine, channels=channels, out=out_dir, jobs=jobs, container=container,
                                        config=config)
        _show(sequence.doctor(flavour, request, options), as_json)


def _show(report: PreflightReport, as_json: bool) -> None:
    """Every check, then exit 9 if one failed (a selection the flavour refuses exited 4 before: nothing to check)."""
    if as_json:
        out.print_json(json.dumps(report.as_dict()))
    else:
        out.print(report_table(report))
    report.raise_if_failed()


def _stack_doctor(path: Path, options: sequence.BuildOptions) -> PreflightReport:
    """doctor --stack: the checks of the stack's build (its output channel, the channels it installs next to)."""
    from torchforge.commands import stack as stack_command

    inputs = stack_command.read(path)
    options = dataclasses.replace(options, out=inputs.stack.out, channels=inputs.stack.channels)
    if inputs.flavour is not None:
        return sequence.doctor(inputs.flavour.value, inputs.request, options)
    return sequence.plan_doctor(stack_command.channel_plan(inputs, "conda-build")[0], options)
