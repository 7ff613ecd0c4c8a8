"""`torchforge matrix` and `torchforge render`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from torchforge.commands.options import (
    ArchListOpt, BuildNumberOpt, CudaOpt, DebugOpt, EnvOpt, FeedstockPatchesOpt, FlavourOpt, GccOpt, JetsonOpt, MagmaPatchOpt, MagmaSourceOpt, PatchOpt, WithOpt,
    PlatformOpt, PythonOpt, PytorchOpt, SourceOpt, chosen_flavour, nonempty_path, refuse_with, selection_from_flags,
)
from torchforge.commands import flavour as flavour_commands
from torchforge.console import err, out, warn
from torchforge.errors import UsageError
from torchforge.flavours import Flavour
from torchforge.render import RecipeFormat, RenderPlan, plan, render_selection
from torchforge.resolve import Status

STATUS_STYLE = {Status.OFFICIAL: "green", Status.BUILDABLE: "yellow", Status.REFUSED: "red"}


def plan_as_json(render_plan: RenderPlan) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for magma in render_plan.magma:
        rows.append({
            "id": magma.id, "package": magma.name, "status": magma.status.value, "version": magma.version,
            "build_string": magma.build_string, "cuda": magma.cuda, "gencode": list(magma.gencode),
            "warnings": list(magma.warnings),
        })
    for companion in render_plan.companions:
        rows.append({
            "id": companion.id, "package": companion.name, "version": companion.version,
            "status": (Status.OFFICIAL if companion.official else Status.BUILDABLE).value,
            "build_string": companion.build_string, "subdir": companion.subdir, "run": list(companion.run),
            "warnings": list(companion.warnings),
        })
    for variant in render_plan.variants:
        request = variant.request
        rows.append({
            "id": variant.id, "package": "pytorch", "status": variant.status.value, "version": request.pytorch,
            "build_string": variant.build_string, "cuda": request.accel, "python": request.python,
            "platform": request.platform, "arch_list": variant.arch_list, "cudnn": variant.cudnn,
            "magma": variant.magma.name if variant.magma else None, "jetson": variant.jetson,
            "refusals": list(variant.refusals), "warnings": list(variant.warnings),
        })
    return rows


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
        if flavour is Flavour.CONDA_FORGE:
            recipes = flavour_commands.recipes_from_flags(
                pytorch, cuda, python, platform, arch_list, build_number,
                {"--debug": debug, "--jetson": jetson, "--env": env, "--gcc": gcc})
            flavour_commands.print_matrix(recipes, as_json, with_)
            return
        refuse_with(with_)
        selection = selection_from_flags(pytorch, cuda, python, platform, arch_list, build_number, debug, jetson, env, gcc)
        render_plan = plan(selection)
        if as_json:
            out.print_json(json.dumps(plan_as_json(render_plan)))
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
        if flavour is Flavour.CONDA_FORGE:
            recipes = flavour_commands.recipes_from_flags(
                pytorch, cuda, python, platform, arch_list, build_number,
                {"--debug": debug, "--jetson": jetson, "--env": env, "--gcc": gcc, "--magma-source": magma_source,
                 "--magma-patch": magma_patch, "--companions": companions})
            flavour_commands.render(recipes, out_dir, fmt, force=force, source=source, patches=patch or [],
                                    feedstock_patches=feedstock_patches, companions=with_)
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
