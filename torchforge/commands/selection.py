"""`torchforge matrix` and `torchforge render`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from torchforge.commands.options import (
    ArchListOpt, BuildNumberOpt, CudaOpt, DebugOpt, EnvOpt, ExtensionOpt, FeedstockPatchesOpt, FlavourOpt, GccOpt, JetsonOpt, MagmaPatchOpt, MagmaSourceOpt, PatchOpt, WithOpt,
    PlatformOpt, PythonOpt, PytorchOpt, SourceOpt, chosen_flavour, nonempty_path, with_names,
)
from torchforge import sequence
from torchforge.console import err, out, warn
from torchforge.flavours import MatrixView, Request
from torchforge.render import RecipeFormat


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
        pytorch: PytorchOpt = None, cuda: CudaOpt = None, python: PythonOpt = None, platform: PlatformOpt = None,
        arch_list: ArchListOpt = None, build_number: BuildNumberOpt = 0, debug: DebugOpt = False,
        jetson: JetsonOpt = None, env: EnvOpt = None, gcc: GccOpt = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print the variants as JSON.")] = False,
        flavour: FlavourOpt = None, with_: WithOpt = None, extension: ExtensionOpt = None,
    ) -> None:
        """Show every variant of a selection: status (official / buildable / refused), build string, magma package."""
        flavour = chosen_flavour(flavour, pytorch, cuda, python, platform, arch_list, build_number)
        request = Request(pytorch, cuda, python, platform, arch_list, build_number, with_packages=with_names(with_),
                          extensions=tuple(extension or ()), flavour_flags=(
            ("--debug", debug), ("--jetson", jetson), ("--env", tuple(env or ())), ("--gcc", gcc)))
        view = sequence.matrix(flavour, request)
        print_matrix(view, as_json)
        if view.refused:
            raise typer.Exit(code=4)

    @app.command("render")
    def render(
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
        feedstock_patches: FeedstockPatchesOpt = False,
    ) -> None:
        """Render conda-build or rattler-build recipe folders for magma-cudaXYZ and pytorch variants."""
        flavour = chosen_flavour(flavour, pytorch, cuda, python, platform, arch_list, build_number)
        request = Request(pytorch, cuda, python, platform, arch_list, build_number, source, tuple(patch or ()),
                          feedstock_patches, with_packages=with_names(with_), flavour_flags=(
                              ("--debug", debug), ("--jetson", jetson), ("--env", tuple(env or ())), ("--gcc", gcc),
                              ("--magma-source", magma_source), ("--magma-patch", tuple(magma_patch or ())),
                              ("--companions", companions)))
        rendered = sequence.render(flavour, request, fmt.value, out_dir, force=force)
        for message in rendered.warnings:
            warn(message)
        for path in rendered.written:
            out.print(str(path))
        err.print(rendered.summary)
