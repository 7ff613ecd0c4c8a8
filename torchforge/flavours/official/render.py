"""Render the official flavour's resolved variants into recipe folders: pure rendering to {filename: content},
then an atomic write. The templates, their Jinja environment and the recipe formats are torchforge.templates'.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from torchforge import __version__, platforms
from torchforge.fileops import write_folders  # noqa: F401 (moved to fileops: every flavour writes folders)
from torchforge.flavours.official.companions import CompanionPlan, companions_for
from torchforge.errors import RefusedError
from torchforge.flavours.official.recipe import RecipeContext, magma_context, pytorch_context
from torchforge.flavours.official.resolve import classify
from torchforge.flavours.official.resolved import MagmaPlan, Status, Variant
from torchforge.templates import RecipeFormat, environment, patch_files, templates_dir
from torchforge.flavours.official.variant import Selection


def _render(template: str, context: RecipeContext, **extra: object) -> str:
    fields = {f.name: getattr(context, f.name) for f in dataclasses.fields(context)}
    fields.update(is_windows=context.is_windows, has_source_edits=context.has_source_edits,
                  numpy_variant=context.numpy_variant, **extra)
    return environment().get_template(template).render(**fields)


def render_files(context: RecipeContext, fmt: RecipeFormat) -> dict[str, str]:
    """The files of one recipe folder (text), for one format."""
    script = platforms.get(context.platform).script
    files: dict[str, str] = {script: _render(f"{context.kind}/{script}.j2", context)}
    if fmt is RecipeFormat.CONDA_BUILD:
        files["meta.yaml"] = _render(f"{context.kind}/meta.yaml.j2", context)
        files["conda_build_config.yaml"] = _render("common/conda_build_config.yaml.j2", context)
    else:
        files["recipe.yaml"] = _render(f"{context.kind}/recipe.yaml.j2", context, script_file=script)
    if context.source_edits:
        files["source_edits.json"] = json.dumps(
            [dataclasses.asdict(edit) if dataclasses.is_dataclass(edit) else edit.model_dump() for edit in context.source_edits],
            indent=2,
        ) + "\n"
        files["source_edits.py"] = (templates_dir() / "common" / "source_edits.py").read_text(encoding="utf-8")
    return files


def companion_files(companion: CompanionPlan, fmt: RecipeFormat) -> dict[str, str]:
    """The recipe of one metapackage (no build script: it installs no files)."""
    fields = {f.name: getattr(companion, f.name) for f in dataclasses.fields(companion)}
    fields.update(noarch=companion.noarch, summary=companion.summary,
                  header=f"Rendered by torchforge {__version__} for {companion.id}. Re-render instead of editing.")
    name = "meta.yaml" if fmt is RecipeFormat.CONDA_BUILD else "recipe.yaml"
    return {name: environment().get_template(f"companion/{name}.j2").render(**fields)}


@dataclass(frozen=True)
class RenderPlan:
    """Every variant of a selection, classified, with the MAGMA packages they need (once per CUDA)."""

    variants: tuple[Variant, ...]
    magma: tuple[MagmaPlan, ...]
    companions: tuple[CompanionPlan, ...] = ()  # pytorch-mutex, cpuonly, pytorch-cuda the variants need

    @property
    def refused(self) -> tuple[Variant, ...]:
        return tuple(v for v in self.variants if v.status is Status.REFUSED)

    def require_buildable(self) -> None:
        if self.refused:
            lines = [f"{v.id}: {reason}" for v in self.refused for reason in v.refusals]
            raise RefusedError(
                f"{len(self.refused)} of {len(self.variants)} variant(s) cannot be built, nothing was written:\n  - "
                + "\n  - ".join(lines),
                "change the selection as each reason says; `torchforge matrix` shows the status of every variant",
            )


def plan(selection: Selection) -> RenderPlan:
    variants = tuple(classify(request) for request in selection.requests())
    magma: dict[str, MagmaPlan] = {}
    for variant in variants:
        if variant.magma is not None:
            magma.setdefault(variant.magma.id, variant.magma)
    return RenderPlan(variants, tuple(magma.values()), companions_for(variants))


def folder_files(context: RecipeContext, fmt: RecipeFormat, patches: Sequence[Path]) -> dict[str, str | bytes]:
    """One recipe folder: its rendered files and the patches it applies. Builds (flavours/official/planning.py:plan_of)
    and the goldens (recipe_folders) take their folders from here."""
    return {**render_files(context, fmt), **patch_files(list(patches))}


def recipe_folders(render_plan: RenderPlan, fmt: RecipeFormat, patches: Sequence[Path] = (),
                   magma_patches: Sequence[Path] = (), *, companions: bool = False) -> dict[str, dict[str, str | bytes]]:
    """{folder name: {file name: content}} for every buildable variant and MAGMA package, MAGMA first (with
    `companions`, the pytorch-mutex / cpuonly / pytorch-cuda recipes before them).

    `patches` go into the pytorch recipes only, `magma_patches` into the magma-cudaXYZ recipes only."""
    render_plan.require_buildable()
    folders: dict[str, dict[str, str | bytes]] = {}
    if companions:
        for companion in render_plan.companions:
            folders[companion.id] = dict(companion_files(companion, fmt))
    magma_names = tuple(p.name for p in magma_patches)
    for magma in render_plan.magma:
        folders[magma.id] = folder_files(magma_context(magma, magma_names), fmt, magma_patches)
    names = tuple(p.name for p in patches)
    for variant in render_plan.variants:
        folders[variant.id] = folder_files(pytorch_context(variant, names), fmt, patches)
    return folders




def render_selection(selection: Selection, out: Path, fmt: RecipeFormat, *, force: bool = False,
                     patches: Iterable[Path] = (), magma_patches: Iterable[Path] = (),
                     companions: bool = False) -> tuple[RenderPlan, list[Path]]:
    render_plan = plan(selection)
    folders = recipe_folders(render_plan, fmt, tuple(patches), tuple(magma_patches), companions=companions)
    return render_plan, write_folders(folders, out, force=force)
