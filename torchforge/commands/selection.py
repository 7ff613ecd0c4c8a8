"""`torchforge matrix` and `torchforge render`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from torchforge.commands.options import (
    ArchListOpt, BuildNumberOpt, CudaOpt, DebugOpt, EnvOpt, FeedstockPatchesOpt, FlavourOpt, GccOpt, JetsonOpt, MagmaPatchOpt, MagmaSourceOpt, PatchOpt,
    PlatformOpt, PythonOpt, PytorchOpt, SourceOpt, chosen_flavour, nonempty_path, selection_from_flags,
)
from torchforge import sequence
from torchforge.flavours import Plan as PlanOfRecipes
from torchforge.flavours import MatrixView, Request
from torchforge.console import err, out, warn
from torchforge.errors import UsageError
from torchforge.flavours import Flavour
from torchforge.render import RecipeFormat, RenderPlan, plan, render_selection, write_folders

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


def render_plan_folders(the_plan: PlanOfRecipes, out_dir: Path, *, force: bool) -> None:
    """`render` of a neutral plan: its recipe folders, written all or none, then what was written."""
    written = write_folders({recipe.id: dict(recipe.files) for recipe in the_plan.recipes}, out_dir, force=force)
    for message in the_plan.warnings:
        warn(message)
    for path in written:
        out.print(str(path))
    channels = ", ".join(dict.fromkeys(url for recipe in the_plan.recipes for url in recipe.channels))
    err.print(f"rendered {len(written)} {the_plan.flavour}-flavour recipe folder(s) into {out_dir} "
              f"(channel: {channels})")


def register(app: typer.Typer) -> None:
    @app.command("matrix")
    def matrix(
        pytorch: PytorchOpt = None, cuda: CudaOpt = None, python: PythonOpt = None, platform: PlatformOpt = None,
        arch_list: ArchListOpt = None, build_number: BuildNumberOpt = 0, debug: DebugOpt = False,
        jetson: JetsonOpt = None, env: EnvOpt = None, gcc: GccOpt = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print the variants as JSON.")] = False,
        flavour: FlavourOpt = None,
    ) -> None:
        """Show every variant of a selection: status (official / buildable / refused), build string, magma package."""
        flavour = chosen_flavour(flavour, pytorch, cuda, python, platform, arch_list, build_number)
        request = Request(pytorch, cuda, python, platform, arch_list, build_number, flavour_flags=(
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
        flavour: FlavourOpt = None,
        feedstock_patches: FeedstockPatchesOpt = False,
    ) -> None:
        """Render conda-build or rattler-build recipe folders for magma-cudaXYZ and pytorch variants."""
        flavour = chosen_flavour(flavour, pytorch, cuda, python, platform, arch_list, build_number)
        if feedstock_patches and flavour is not Flavour.CONDA_FORGE:
            raise UsageError("--feedstock-patches applies to --flavour conda-forge only",
                             "add --flavour conda-forge, or leave --feedstock-patches out")
        if flavour is not Flavour.OFFICIAL:
            request = Request(pytorch, cuda, python, platform, arch_list, build_number, source, tuple(patch or ()),
                              feedstock_patches, flavour_flags=(
                                  ("--debug", debug), ("--jetson", jetson), ("--env", env), ("--gcc", gcc),
                                  ("--magma-source", magma_source), ("--magma-patch", magma_patch),
                                  ("--companions", companions)))
            render_plan_folders(sequence.plan(flavour, request, fmt.value), out_dir, force=force)
            return
        selection = selection_from_flags(pytorch, cuda, python, platform, arch_list, build_number, debug, jetson, env,
                                         gcc, source, magma_source, patch, magma_patch)
        render_plan, written = render_selection(selection, out_dir, fmt, force=force, patches=patch or [],
                                                magma_patches=magma_patch or [], companions=companions)
        for variant in render_plan.variants:
            for message in variant.warnings:
                warn(f"{variant.id}: {message}")
        for magma in render_plan.magma:
            for message in magma.warnings:
                warn(f"{magma.id}: {message}")
        for path in written:
            out.print(str(path))
        err.print(f"rendered {len(written)} {fmt.value} recipe folder(s) into {out_dir}")
