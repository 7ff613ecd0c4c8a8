"""`torchforge matrix` and `torchforge render`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from torchforge.commands.options import (
    ArchListOpt, BuildNumberOpt, ForChannelOpt, ForOpt, CudaOpt, DebugOpt, EnvOpt, ExtensionEnvOpt, ExtensionOpt, FeedstockPatchesOpt, FlavourOpt, GccOpt, JetsonOpt, MagmaPatchOpt, MagmaSourceOpt, PatchOpt, WithOpt,
    PlatformOpt, PythonOpt, PytorchOpt, SourceOpt, WheelsOpt, chosen_flavour, extension_variables, nonempty_path, with_names, WithSourceOpt, with_sources,
)
from torchforge import sequence
from torchforge.buildoptions import Rendered
from torchforge.commands.stack import StackOpt, channel_plan, plan_view, refuse_flags
from torchforge.commands.stack import read as read_stack
from torchforge.console import err, out, warn
from torchforge.flavours import Flavour, MatrixView, Request
from torchforge.templates import RecipeFormat


def print_matrix(view: MatrixView, as_json: bool) -> None:
    """`matrix`: the flavour's rows as JSON, or its table."""
    if as_json:
        out.print_json(json.dumps(list(view.rows)))
        return
    table = Table(title=view.title)
    for column in view.columns:
        table.add_column(column, overflow="fold")
    for cells in view.cells:
        table.add_row(*cells)
    out.print(table)


def register(app: typer.Typer) -> None:
    @app.command("matrix")
    def matrix(
        ctx: typer.Context,
        pytorch: PytorchOpt = None, cuda: CudaOpt = None, python: PythonOpt = None, platform: PlatformOpt = None,
        arch_list: ArchListOpt = None, build_number: BuildNumberOpt = 0, debug: DebugOpt = False,
        jetson: JetsonOpt = None, env: EnvOpt = None, gcc: GccOpt = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print the variants as JSON.")] = False,
        flavour: FlavourOpt = None, with_: WithOpt = None, extension: ExtensionOpt = None, for_: ForOpt = None,
        channel: ForChannelOpt = None, stack: StackOpt = None, wheels: WheelsOpt = None,
        extension_env: ExtensionEnvOpt = None, with_source: WithSourceOpt = None,
    ) -> None:
        """Show every variant of a selection: status (official / buildable / refused), build string, magma package."""
        if stack is not None:
            refuse_flags(ctx, stack)
            inputs = read_stack(stack)
            view = (sequence.matrix(inputs.flavour.value, inputs.request) if inputs.flavour is not None
                    else plan_view(channel_plan(inputs, "rattler-build")[0]))
            print_matrix(view, as_json)
            if view.refused:
                raise typer.Exit(code=4)
            return
        flavour = chosen_flavour(flavour, pytorch, cuda, python, platform, arch_list, build_number, for_spec=for_)
        request = Request(pytorch, cuda, python, platform, arch_list, build_number, with_packages=with_names(with_),
                          with_sources=with_sources(with_source), extensions=tuple(extension or ()), extension_env=extension_variables(extension_env),
                          for_pytorch=for_, for_channels=tuple(channel or ()),
                          wheel_folders=tuple(str(w) for w in wheels or ()), flavour_flags=(
            ("--debug", debug), ("--jetson", jetson), ("--env", tuple(env or ())), ("--gcc", gcc)))
        view = sequence.matrix(flavour, request)
        print_matrix(view, as_json)
        if view.refused:
            raise typer.Exit(code=4)

    @app.command("render")
    def render(
        ctx: typer.Context,
        out_dir: Annotated[Path, typer.Option("--out", parser=nonempty_path, help="Folder that receives one recipe folder per package.")] = Path("recipes"),
        fmt: Annotated[RecipeFormat, typer.Option("--format", help="Recipe format.")] = RecipeFormat.CONDA_BUILD,
        force: Annotated[bool, typer.Option("--force", help="Replace recipe folders that already exist.")] = False,
        pytorch: PytorchOpt = None, cuda: CudaOpt = None, python: PythonOpt = None, platform: PlatformOpt = None,
        arch_list: ArchListOpt = None, build_number: BuildNumberOpt = 0, debug: DebugOpt = False,
        jetson: JetsonOpt = None, env: EnvOpt = None, gcc: GccOpt = None, source: SourceOpt = None,
        magma_source: MagmaSourceOpt = None, patch: PatchOpt = None, magma_patch: MagmaPatchOpt = None,
        companions: Annotated[bool, typer.Option(
            "--companions", help="Also render the pytorch-mutex, cpuonly and pytorch-cuda packages the variants need.")] = False,
        flavour: FlavourOpt = None, with_: WithOpt = None,
        feedstock_patches: FeedstockPatchesOpt = False, for_: ForOpt = None, channel: ForChannelOpt = None,
        stack: StackOpt = None, wheels: WheelsOpt = None, with_source: WithSourceOpt = None,
    ) -> None:
        """Render conda-build or rattler-build recipe folders for magma-cudaXYZ and pytorch variants (with --stack:
        the recipes of the stack file's plan)."""
        if stack is not None:
            refuse_flags(ctx, stack)
            inputs = read_stack(stack)
            rendered = (sequence.render(inputs.flavour.value, inputs.request, fmt.value, out_dir, force=force)
                        if inputs.flavour is not None else
                        sequence.render_plan(channel_plan(inputs, fmt.value)[0], out_dir, force=force))
        else:
            rendered = _render_flags(out_dir, fmt, force, pytorch, cuda, python, platform, arch_list, build_number,
                                     debug, jetson, env, gcc, source, magma_source, patch, magma_patch, companions,
                                     flavour, with_, feedstock_patches, for_, channel, wheels,
                                     with_sources(with_source))
        for message in rendered.warnings:
            warn(message)
        for path in rendered.written:
            out.print(str(path))
        err.print(rendered.summary)


def _render_flags(out_dir: Path, fmt: RecipeFormat, force: bool, pytorch: str | None, cuda: str | None,
                  python: str | None, platform: str | None, arch_list: str | None, build_number: int, debug: bool,
                  jetson: str | None, env: list[str] | None, gcc: str | None, source: str | None,
                  magma_source: str | None, patch: list[Path] | None, magma_patch: list[Path] | None,
                  companions: bool, flavour: Flavour | None, with_: str | None, feedstock_patches: bool,
                  for_: str | None, channel: list[str] | None, wheels: list[Path] | None,
                  companion_sources: tuple[tuple[str, str], ...] = ()) -> Rendered:
    chosen = chosen_flavour(flavour, pytorch, cuda, python, platform, arch_list, build_number, for_spec=for_)
    request = Request(pytorch, cuda, python, platform, arch_list, build_number, source, tuple(patch or ()),
                      feedstock_patches, with_packages=with_names(with_), with_sources=companion_sources, for_pytorch=for_,
                      for_channels=tuple(channel or ()), wheel_folders=tuple(str(w) for w in wheels or ()),
                      flavour_flags=(
                          ("--debug", debug), ("--jetson", jetson), ("--env", tuple(env or ())), ("--gcc", gcc),
                          ("--magma-source", magma_source), ("--magma-patch", tuple(magma_patch or ())),
                          ("--companions", companions)))
    return sequence.render(chosen, request, fmt.value, out_dir, force=force)
