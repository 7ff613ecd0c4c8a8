"""`matrix`, `render`, `doctor` and `build` with `--flavour conda-forge`: the conda-forge flavour's side of the CLI."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from torchforge import data as tables
from torchforge import sourcestate
from torchforge.channels import SiteChannels
from torchforge.commands.options import file_digests
from torchforge.console import err, out, warn
from torchforge.engines import Engine
from torchforge.archcheck import find_cuobjdump
from torchforge.errors import PreflightError, ToolMissingError, UsageError
from torchforge.flavours import Flavour, check, companion_recipes, companions as companion_names, conda_forge
from torchforge.pipeline import PlannedRecipe
from torchforge.preflight import Level, engine_check
from torchforge.recipe import Source, resolve_source
from torchforge.render import RecipeFormat, patch_files, write_folders
from torchforge.variant import check_build_number, check_shared_flags

def recipes_from_flags(pytorch: str | None, cuda: str | None, python: str | None, platform: str | None,
                       arch_list: str | None, build_number: int,
                       official_only: dict[str, object] | None = None) -> tuple[conda_forge.CondaForgeRecipe, ...]:
    """The recipes a command line asks for; a release up to 2.5 is told to use the official flavour, and a flag
    of the official flavour's (`official_only`: {flag: value}) is refused rather than ignored."""
    given = [flag for flag, value in (official_only or {}).items() if value]
    if given:
        raise UsageError(f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} to --flavour official only",
                         "leave it out with --flavour conda-forge, or use --flavour official")
    flags = check_shared_flags(pytorch, cuda, python, platform, arch_list, build_number)
    if pytorch:
        check(Flavour.CONDA_FORGE, pytorch)
    recipes = conda_forge.plan_selection(pytorch, cuda, python, platform, flags.arch_list, build_number)
    for recipe in recipes:  # the engines read the package's number: the feedstock's and the offsets come on top
        check_build_number(build_number, offset=recipe.build_number - build_number,
                           why_offset=f"{recipe.id}: the feedstock's build number and conda-forge's CUDA and MKL "
                                      "offsets")
    return recipes


def _source(recipe: conda_forge.CondaForgeRecipe, source: str | None, patches: list[Path]) -> Source:
    where = resolve_source(source, tables.load().pytorch.defaults.source_url, f"v{recipe.version}")
    return dataclasses.replace(where, patches=tuple(p.name for p in patches))


def _folder(recipe: conda_forge.CondaForgeRecipe, source: Source, patches: list[Path], feedstock_patches: bool,
            fmt: RecipeFormat) -> dict[str, str | bytes]:
    files = conda_forge.recipe_files(recipe, source, feedstock_patches=feedstock_patches, recipe_format=fmt)
    return {**files, **patch_files(patches)}


def with_inputs(recipes: tuple[conda_forge.CondaForgeRecipe, ...], source: str | None, patches: list[Path],
                feedstock_patches: bool) -> tuple[conda_forge.CondaForgeRecipe, ...]:
    """The recipes with what they are built from in their settings (and so in their build strings)."""
    identity = sourcestate.identity(source) if source else None
    return tuple(conda_forge.with_inputs(r, identity, file_digests(patches), feedstock_patches) for r in recipes)


def render(recipes: tuple[conda_forge.CondaForgeRecipe, ...], out_dir: Path, fmt: RecipeFormat, *, force: bool,
           source: str | None, patches: list[Path], feedstock_patches: bool = False,
           companions: str | None = None) -> None:
    extra = companion_plans(recipes, companions, fmt, source, patches, feedstock_patches)
    recipes = with_inputs(recipes, source, patches, feedstock_patches)
    folders = {recipe.id: _folder(recipe, _source(recipe, source, patches), patches, feedstock_patches, fmt)
               for recipe in recipes}
    folders.update({planned.id: dict(planned.files) for planned in extra})
    written = write_folders(folders, out_dir, force=force)
    show_warnings(recipes, feedstock_patches)
    for path in written:
        out.print(str(path))
    err.print(f"rendered {len(written)} conda-forge-flavour recipe folder(s) into {out_dir} "
              f"(channel: {conda_forge.load().flavour.channel})")


def as_json(recipes: tuple[conda_forge.CondaForgeRecipe, ...]) -> list[dict[str, object]]:
    return [{
        "id": r.id, "flavour": "conda-forge", "version": r.version, "platform": r.platform, "cuda": r.cuda or "cpu",
        "arch_list": r.arch_list, "blas": r.blas, "pythons": list(r.pythons), "build_number": r.build_number,
        "outputs": {o.name: o.build_string_with("XY") for o in r.outputs},
        "packages": [p.stem for p in r.planned_outputs()], "feedstock": r.feedstock_commit,
        "channel": conda_forge.load().flavour.channel, "magma": r.magma,
        "feedstock_patches": len(r.feedstock_patches), "warnings": list(r.warnings_for(False)),
    } for r in recipes]


def companions_as_json(planned: list[PlannedRecipe]) -> list[dict[str, object]]:
    return [{"id": p.id, "flavour": "conda-forge", "platform": p.subdir, "cuda": p.accel, "arch_list": p.arch_list,
             "packages": list(p.stems), "pytorch": json.loads(p.settings)["pytorch"]} for p in planned]


def print_matrix(recipes: tuple[conda_forge.CondaForgeRecipe, ...], json_output: bool,
                 companions: str | None = None) -> None:
    extra = companion_plans(recipes, companions, RecipeFormat.RATTLER_BUILD)
    if json_output:
        out.print_json(json.dumps([*as_json(recipes), *companions_as_json(extra)]))
        return
    table = Table(title=f"torchforge recipes, flavour conda-forge (channel {conda_forge.load().flavour.channel})")
    for column in ("recipe", "outputs", "build number", "pythons", "magma (conda-forge)", "notes"):
        table.add_column(column, overflow="fold")
    for r in recipes:
        table.add_row(r.id, ", ".join(f"{o.name} ({o.build_string_with('XY')})" for o in r.outputs), str(r.build_number),
                      ",".join(r.pythons), r.magma or "-", f"{len(r.warnings_for(False))} warning(s)")
    for entry in companions_as_json(extra):
        table.add_row(str(entry["id"]), ", ".join(map(str, entry["packages"])), "-", "-", "-",
                      f"pinned to pytorch {entry['pytorch']}")
    out.print(table)


def doctor(recipes: tuple[conda_forge.CondaForgeRecipe, ...], json_output: bool,
           site: SiteChannels | None = None, console: Console = out, engine: str = "auto",
           companions: str | None = None) -> None:
    """What the conda-forge flavour needs here: an engine for its recipes (conda-build reads meta.yaml, the
    embedded rattler-build engine recipe.yaml) and conda-forge's channel (no pytorch, nvidia or defaults
    channel, and none of the official flavour's companion packages)."""
    channel = conda_forge.load().flavour.channel
    used = (site or SiteChannels()).apply((channel,))
    instead = f" (the site config's for {channel})" if used != (channel,) else ""
    engine_found, _ = engine_check(engine)
    engine_ok = engine_found.status is not Level.FAIL
    checks = [
        {"check": "flavour", "ok": True, "detail": f"conda-forge: {len(recipes)} recipe(s), "
                                                   + ", ".join(r.id for r in recipes)},
        {"check": "channel", "ok": None,
         "detail": f"{', '.join(used)}{instead} (every requirement; no pytorch, nvidia or defaults channel, "
                   "no companion packages)"},
        {"check": "magma", "ok": None, "detail": conda_forge.load().flavour.magma},
        {"check": "engine", "ok": engine_ok, "detail": engine_found.detail},
    ]
    windows = [r for r in recipes if r.platform == conda_forge.WINDOWS]
    if windows:  # torchforge renders them anywhere; conda-build builds them on Windows only
        checks.append({"check": "platform", "ok": None, "detail": "; ".join(
            f"{r.id}: {conda_forge.windows_build_note(dict(r.variant_config)['c_compiler'][0])}" for r in windows)})
    extra = companion_plans(recipes, companions, RecipeFormat.RATTLER_BUILD)
    checks += companion_checks(extra)
    if json_output:
        out.print_json(json.dumps(checks))
    else:
        table = Table(title="torchforge doctor, flavour conda-forge")
        for column in ("check", "result", "detail"):
            table.add_column(column, overflow="fold")
        for check in checks:
            result = "-" if check["ok"] is None else "[green]ok[/]" if check["ok"] else "[red]failed[/]"
            table.add_row(str(check["check"]), result, str(check["detail"]))
        console.print(table)
    arch_check = next((c for c in checks if c["check"] == "cuobjdump"), None)
    if arch_check is not None and not arch_check["ok"]:
        raise PreflightError(str(arch_check["detail"]), "pip install nvidia-cuda-cuobjdump, or put a CUDA toolkit's "
                             "bin on PATH")
    if not engine_ok:
        raise PreflightError(f"--engine {engine} cannot build the conda-forge flavour's recipes here: "
                             f"{engine_found.detail}", engine_found.fix)


def planned_recipes(recipes: tuple[conda_forge.CondaForgeRecipe, ...], engine: Engine, *, source: str | None,
                    patches: list[Path], feedstock_patches: bool, companions: str | None = None) -> list[PlannedRecipe]:
    """What the pipeline builds: each recipe's folder for the engine, every output's planned name, its channel;
    then the `companions` (--with: torchvision,torchaudio) of each pytorch package, pinned to it."""
    extra = companion_plans(recipes, companions, engine.recipe_format, source, patches, feedstock_patches)
    channel = conda_forge.load().flavour.channel
    planned = []
    for recipe in with_inputs(recipes, source, patches, feedstock_patches):
        where = _source(recipe, source, patches)
        planned.append(PlannedRecipe(
            recipe.id, recipe.platform, tuple(p.stem for p in recipe.planned_outputs()), recipe.settings,
            _folder(recipe, where, patches, feedstock_patches, engine.recipe_format), (channel,),
            recipe.cuda or "cpu", where.location if where.kind == "path" else None, recipe.index_fields()))
    return [*planned, *extra]


def companion_plans(recipes: tuple[conda_forge.CondaForgeRecipe, ...], companions: str | None, fmt: RecipeFormat,
                    source: str | None = None, patches: list[Path] | None = None,
                    feedstock_patches: bool = False) -> list[PlannedRecipe]:
    """--with: the companions of every pytorch package the recipes plan (as built from `source` and `patches`)."""
    names = companion_names(companions)
    if not names:
        return []
    built_from = with_inputs(recipes, source, patches or [], feedstock_patches)
    return companion_recipes(built_from, names, fmt.value)  # type: ignore[return-value]


def companion_checks(planned: list[PlannedRecipe]) -> list[dict[str, object]]:
    """--with: what is planned, and (CUDA) the cuobjdump the arch check after each build needs."""
    if not planned:
        return []
    checks: list[dict[str, object]] = [{"check": "--with", "ok": None, "detail": ", ".join(
        f"{p.stems[0]} (pytorch {json.loads(p.settings)['pytorch']})" for p in planned)}]
    if any(p.arch_list for p in planned):
        try:
            checks.append({"check": "cuobjdump", "ok": True, "detail": f"{find_cuobjdump()} (the arch check)"})
        except ToolMissingError as missing:
            checks.append({"check": "cuobjdump", "ok": False, "detail": missing.message})
    return checks


def show_warnings(recipes: tuple[conda_forge.CondaForgeRecipe, ...], feedstock_patches: bool) -> None:
    for recipe in recipes:
        for message in recipe.warnings_for(feedstock_patches):
            warn(f"{recipe.id}: {message}")
