"""`torchforge matrix` and `torchforge render`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from torchforge.commands.options import (
    ArchListOpt, BuildNumberOpt, CudaOpt, DebugOpt, EnvOpt, FeedstockPatchesOpt, FlavourOpt, GccOpt, JetsonOpt, MagmaPatchOpt, MagmaSourceOpt, PatchOpt, WithOpt,
    PlatformOpt, PythonOpt, PytorchOpt, SourceOpt, chosen_flavour, nonempty_path, refuse_with, selection_from_flags, with_names,
)
from torchforge import sequence
from torchforge.flavours import Plan as PlanOfRecipes
from torchforge.flavours import Request
from torchforge.console import err, out, warn
from torchforge.errors import UsageError
from torchforge.flavours import Flavour
from torchforge.render import RecipeFormat, RenderPlan, plan, render_selection, write_folders
from torchforge.resolve import Status

STATUS_STYLE = {Status.OFFICIAL: "green", Status.BUILDABLE: "yellow", Status.REFUSED: "red"}


def print_table(render_plan: RenderPlan) -> None:
    table = Table(title="torchforge variants (flavour official)")
    for column in ("variant", "status", "build string", "magma package", "notes"):
        table.add_column(column, overflow="fold")
    for variant in render_plan.variants:
        notes = "; ".join(variant.refusals) if variant.refusals else f"{len(variant.warnings)} warning(s)" if variant.warnings else ""
        table.add_row(
            variant.id,
            f"[{STATUS_STYLE[variant.status]}]{variant.status.value}[/]",
            variant.build_string or "-",
            f"{variant.magma.name}-{variant.magma.version}-{variant.magma.build_string}" if variant.magma else "-",
            notes,
        )
    out.print(table)


def print_recipe_rows(rows: list[dict[str, object]], flavour: Flavour, as_json: bool) -> None:
    """`matrix` of a flavour that plans recipe folders of several outputs: one row per folder."""
    if as_json:
        out.print_json(json.dumps(rows))
        return
    channels = ", ".join(dict.fromkeys(str(row["channel"]) for row in rows))
    table = Table(title=f"torchforge recipes, flavour {flavour.value} (channel {channels})")
    for column in ("recipe", "outputs", "build number", "pythons", f"magma ({flavour.value})", "notes"):
        table.add_column(column, overflow="fold")
    for row in rows:
        outputs = dict(row["outputs"])  # type: ignore[call-overload]
        warnings = list(row["warnings"])  # type: ignore[call-overload]
        table.add_row(str(row["id"]), ", ".join(f"{name} ({build})" for name, build in outputs.items()),
                      str(row["build_number"]), ",".join(row["pythons"]),  # type: ignore[arg-type]
                      str(row["magma"] or "-"), f"{len(warnings)} warning(s)")
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
        flavour: FlavourOpt = None, with_: WithOpt = None,
    ) -> None:
        """Show every variant of a selection: status (official / buildable / refused), build string, magma package."""
        flavour = chosen_flavour(flavour, pytorch, cuda, python, platform, arch_list, build_number)
        if flavour is not Flavour.OFFICIAL:
            request = Request(pytorch, cuda, python, platform, arch_list, build_number, with_packages=with_names(with_), flavour_flags=(
                ("--debug", debug), ("--jetson", jetson), ("--env", env), ("--gcc", gcc)))
            print_recipe_rows(sequence.matrix(flavour, request), flavour, as_json)
            return
        refuse_with(with_)
        selection = selection_from_flags(pytorch, cuda, python, platform, arch_list, build_number, debug, jetson, env, gcc)
        render_plan = plan(selection)
        if as_json:
            out.print_json(json.dumps(sequence.official_matrix_rows(render_plan)))
        else:
            print_table(render_plan)
        if render_plan.refused:
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
        if feedstock_patches and flavour is not Flavour.CONDA_FORGE:
            raise UsageError("--feedstock-patches applies to --flavour conda-forge only",
                             "add --flavour conda-forge, or leave --feedstock-patches out")
        if flavour is not Flavour.OFFICIAL:
            request = Request(pytorch, cuda, python, platform, arch_list, build_number, source, tuple(patch or ()),
                              feedstock_patches, with_packages=with_names(with_), flavour_flags=(
                                  ("--debug", debug), ("--jetson", jetson), ("--env", env), ("--gcc", gcc),
                                  ("--magma-source", magma_source), ("--magma-patch", magma_patch),
                                  ("--companions", companions)))
            render_plan_folders(sequence.plan(flavour, request, fmt.value), out_dir, force=force)
            return
        refuse_with(with_)
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
