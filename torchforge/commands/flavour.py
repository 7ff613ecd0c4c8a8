"""`matrix`, `render` and `doctor` with `--flavour conda-forge`: the conda-forge flavour's side of the CLI."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from rich.table import Table

from torchforge import data as tables
from torchforge.console import err, out, warn
from torchforge.errors import PreflightError, UsageError
from torchforge.flavours import Flavour, check, conda_forge
from torchforge.recipe import resolve_source
from torchforge.render import RecipeFormat, patch_files, write_folders

def recipes_from_flags(pytorch: str | None, cuda: str | None, python: str | None, platform: str | None,
                       arch_list: str | None, build_number: int,
                       official_only: dict[str, object] | None = None) -> tuple[conda_forge.CondaForgeRecipe, ...]:
    """The recipes a command line asks for; a release up to 2.5 is told to use the official flavour, and a flag
    of the official flavour's (`official_only`: {flag: value}) is refused rather than ignored."""
    given = [flag for flag, value in (official_only or {}).items() if value]
    if given:
        raise UsageError(f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} to --flavour official only",
                         "leave it out with --flavour conda-forge, or use --flavour official")
    if pytorch:
        check(Flavour.CONDA_FORGE, pytorch)
    return conda_forge.plan_selection(pytorch, cuda, python, platform, arch_list, build_number)


def render(recipes: tuple[conda_forge.CondaForgeRecipe, ...], out_dir: Path, fmt: RecipeFormat, *, force: bool,
           source: str | None, patches: list[Path], feedstock_patches: bool = False) -> None:
    if fmt is not RecipeFormat.CONDA_BUILD:
        raise UsageError("--flavour conda-forge renders conda-build recipes only", "leave --format out")
    folders: dict[str, dict[str, str | bytes]] = {}
    for recipe in recipes:
        where = resolve_source(source, tables.load().pytorch.defaults.source_url, f"v{recipe.version}")
        files = conda_forge.recipe_files(recipe, dataclasses.replace(where, patches=tuple(p.name for p in patches)),
                                         feedstock_patches=feedstock_patches)
        folders[recipe.id] = {**files, **patch_files(patches)}
    written = write_folders(folders, out_dir, force=force)
    for recipe in recipes:
        for message in recipe.warnings_for(feedstock_patches):
            warn(f"{recipe.id}: {message}")
    for path in written:
        out.print(str(path))
    err.print(f"rendered {len(written)} conda-forge-flavour recipe folder(s) into {out_dir} "
              f"(channel: {conda_forge.load().flavour.channel})")


def _shown(build_string: str) -> str:
    """A build string as users read it: conda-build fills in the Python per package (py312)."""
    return build_string.replace("{{ CONDA_PY }}", "XY")


def as_json(recipes: tuple[conda_forge.CondaForgeRecipe, ...]) -> list[dict[str, object]]:
    return [{
        "id": r.id, "flavour": "conda-forge", "version": r.version, "platform": r.platform, "cuda": r.cuda or "cpu",
        "arch_list": r.arch_list, "blas": r.blas, "pythons": list(r.pythons), "build_number": r.build_number,
        "outputs": {o.name: _shown(o.build_string) for o in r.outputs}, "feedstock": r.feedstock_commit,
        "channel": conda_forge.load().flavour.channel, "magma": r.magma,
        "feedstock_patches": len(r.feedstock_patches), "warnings": list(r.warnings_for(False)),
    } for r in recipes]


def print_matrix(recipes: tuple[conda_forge.CondaForgeRecipe, ...], json_output: bool) -> None:
    if json_output:
        out.print_json(json.dumps(as_json(recipes)))
        return
    table = Table(title=f"torchforge recipes, flavour conda-forge (channel {conda_forge.load().flavour.channel})")
    for column in ("recipe", "outputs", "build number", "pythons", "magma (conda-forge)", "notes"):
        table.add_column(column, overflow="fold")
    for r in recipes:
        table.add_row(r.id, ", ".join(f"{o.name} ({_shown(o.build_string)})" for o in r.outputs), str(r.build_number),
                      ",".join(r.pythons), r.magma or "-", f"{len(r.warnings_for(False))} warning(s)")
    out.print(table)


def doctor(recipes: tuple[conda_forge.CondaForgeRecipe, ...], json_output: bool) -> None:
    """What the conda-forge flavour needs here: conda-build (it renders meta.yaml only) and conda-forge's channel."""
    from torchforge.engines import conda_build

    probe = conda_build.probe()
    checks = [
        {"check": "flavour", "ok": True, "detail": f"conda-forge: {len(recipes)} recipe(s), "
                                                   + ", ".join(r.id for r in recipes)},
        {"check": "channel", "ok": None, "detail": conda_forge.load().flavour.channel + " (every requirement)"},
        {"check": "magma", "ok": None, "detail": conda_forge.load().flavour.magma},
        {"check": "conda-build", "ok": probe.usable,
         "detail": f"conda-build {probe.version}" if probe.usable else probe.reason},
    ]
    windows = [r for r in recipes if r.platform == conda_forge.WINDOWS]
    if windows:  # torchforge renders them anywhere; conda-build builds them on Windows only
        checks.append({"check": "platform", "ok": None, "detail": "; ".join(
            f"{r.id}: {conda_forge.windows_build_note(dict(r.variant_config)['c_compiler'][0])}" for r in windows)})
    if json_output:
        out.print_json(json.dumps(checks))
    else:
        table = Table(title="torchforge doctor, flavour conda-forge")
        for column in ("check", "result", "detail"):
            table.add_column(column, overflow="fold")
        for check in checks:
            result = "-" if check["ok"] is None else "[green]ok[/]" if check["ok"] else "[red]failed[/]"
            table.add_row(str(check["check"]), result, str(check["detail"]))
        out.print(table)
    if not probe.usable:
        raise PreflightError(f"conda-build is needed to build the conda-forge flavour's recipes: {probe.reason}",
                             "install conda-build into a conda on PATH (`conda install -n base conda-build`)")
