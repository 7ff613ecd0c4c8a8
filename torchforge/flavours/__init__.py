"""Recipe flavours: which package shape a PyTorch recipe has.

`official` reproduces the pytorch channel's packages (up to 2.5 the only shape there is; torchforge's hybrid
for 2.6+). `conda-forge` renders conda-forge's shape of a 2.6+ release (torchforge/flavours/conda_forge.py).
"""

from __future__ import annotations

from enum import Enum

from torchforge import data as tables
from torchforge import versions
from torchforge.errors import UsageError


# Why a command with --magma-only is the official flavour's whatever the release (conda-forge's links libmagma).
MAGMA_ONLY = "--magma-only builds the official flavour's magma-cudaXYZ"


class Flavour(str, Enum):
    OFFICIAL = "official"
    CONDA_FORGE = "conda-forge"


def check(flavour: Flavour, pytorch: str) -> Flavour:
    """The flavour, once it is known to exist for the release: conda-forge's shape starts at 2.6."""
    if flavour is Flavour.CONDA_FORGE:
        from torchforge.flavours import conda_forge

        known = conda_forge.load().releases
        if pytorch not in known:
            older = versions.parse(pytorch) < versions.parse(min(known, key=versions.parse))
            raise UsageError(
                f"--flavour conda-forge has no facts for PyTorch {pytorch}"
                + (": releases up to 2.5 had official conda packages, which --flavour official reproduces" if older else ""),
                "use --flavour official" if older else
                f"pick one of the releases the flavour knows: {', '.join(known)}",
            )
    return flavour


def choose(flavour: Flavour | None, pytorch: str | None, official_because: str = "") -> tuple[Flavour, str]:
    """The flavour of a command line and why: --flavour if given, else official where the command asks for one of
    its packages (`official_because`: e.g. "--magma-only builds magma-cudaXYZ"), else conda-forge for a release that
    published no official conda package (2.6+, where the flavour has the feedstock's facts), else official."""
    if flavour is not None:
        return check(flavour, pytorch) if pytorch else flavour, f"flavour {flavour.value} (--flavour)"
    if official_because:
        return Flavour.OFFICIAL, f"flavour official: {official_because}"
    if pytorch is None:
        return Flavour.OFFICIAL, ("flavour official: no --pytorch given, so the release is chosen among the official "
                                  "flavour's (give --pytorch 2.6 or newer, or --flavour conda-forge, for conda-forge's shape)")
    release = tables.load().pytorch.releases.get(versions.minor(pytorch))
    if release is None:  # the commands refuse it before (variant.check_shared_flags)
        return Flavour.OFFICIAL, f"flavour official: PyTorch {pytorch} is not in torchforge's data"
    if release.conda_official:
        return Flavour.OFFICIAL, f"flavour official: PyTorch {pytorch} published official conda packages"
    from torchforge.flavours import conda_forge

    if pytorch not in conda_forge.load().releases:
        return Flavour.OFFICIAL, (f"flavour official: PyTorch {pytorch} published no official conda package, but the "
                                  "conda-forge flavour has no feedstock facts for it (torchforge/data/conda_forge.toml)")
    return Flavour.CONDA_FORGE, (f"flavour conda-forge: PyTorch {pytorch} published no official conda package "
                                 "(--flavour official renders the 2.5-shaped recipe instead)")


# `--with`: the packages built after pytorch, for the exact pytorch packages of the plan (issue 32).
COMPANIONS = ("torchvision", "torchaudio")


def companions(names: str | None) -> tuple[str, ...]:
    """The companions `--with` names (comma-separated, in order, once each); an unknown name is a usage error."""
    chosen = tuple(dict.fromkeys(name.strip() for name in (names or "").split(",") if name.strip()))
    unknown = [name for name in chosen if name not in COMPANIONS]
    if unknown:
        raise UsageError(f"--with names {', '.join(map(repr, unknown))}, which torchforge does not build",
                         f"--with takes {', '.join(COMPANIONS)} (comma-separated)")
    return chosen


def companion_recipes(recipes: tuple[object, ...], names: tuple[str, ...], recipe_format: str) -> list[object]:
    """The conda-forge flavour's companion recipes (PlannedRecipe) for every pytorch package the `recipes`
    (CondaForgeRecipe, with their inputs) plan: one per pytorch file and companion, pinned to that file."""
    from torchforge.flavours import conda_forge, conda_forge_stack

    planned = []
    for recipe in recipes:
        assert isinstance(recipe, conda_forge.CondaForgeRecipe)
        for output in (o for o in recipe.planned_outputs() if o.name == "pytorch" and o.python):
            build = conda_forge_stack.PytorchBuild(output.version, output.build_string, output.subdir, output.python,
                                                   recipe.cuda, recipe.arch_list if recipe.cuda else None)
            planned += [conda_forge_stack.planned_recipe(conda_forge_stack.plan(name, build), recipe_format,  # type: ignore[arg-type]
                                                         conda_forge.load().flavour.channel) for name in names]
    return planned
