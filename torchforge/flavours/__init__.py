"""Recipe flavours: which package shape a PyTorch recipe has.

`official` reproduces the pytorch channel's packages (up to 2.5 the only shape there is; torchforge's hybrid
for 2.6+; torchforge/flavours/official/). `conda-forge` renders conda-forge's shape of a 2.6+ release
(torchforge/flavours/conda_forge/).
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING

from torchforge import data as tables
from torchforge import versions
from torchforge.errors import UsageError
from torchforge.flavours.base import JOBS_VARIABLE, MachineNeeds, MatrixView, Plan, PlannedRecipe, Request

__all__ = ["FLAVOURS", "JOBS_VARIABLE", "MAGMA_ONLY", "Flavour", "MachineNeeds", "MatrixView", "Plan", "PlannedRecipe", "Request",
           "check", "choose", "official_selection", "plugin"]

if TYPE_CHECKING:
    from torchforge.flavours.base import Flavour as FlavourPlugin
    from torchforge.flavours.official.variant import Selection


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
    if release is None:  # the commands refuse it before (sharedflags.check_shared_flags)
        return Flavour.OFFICIAL, f"flavour official: PyTorch {pytorch} is not in torchforge's data"
    if release.conda_official:
        return Flavour.OFFICIAL, f"flavour official: PyTorch {pytorch} published official conda packages"
    from torchforge.flavours import conda_forge

    if pytorch not in conda_forge.load().releases:
        return Flavour.OFFICIAL, (f"flavour official: PyTorch {pytorch} published no official conda package, but the "
                                  "conda-forge flavour has no feedstock facts for it (torchforge/data/conda_forge.toml)")
    return Flavour.CONDA_FORGE, (f"flavour conda-forge: PyTorch {pytorch} published no official conda package "
                                 "(--flavour official renders the 2.5-shaped recipe instead)")


# The registry: flavour name -> the module that holds its plug-in (imported when first asked for: a command line
# of one flavour loads nothing of the other).
FLAVOURS: dict[str, str] = {
    Flavour.OFFICIAL.value: "torchforge.flavours.official.planning",
    Flavour.CONDA_FORGE.value: "torchforge.flavours.conda_forge.planning",
}


def plugin(flavour: Flavour | str) -> FlavourPlugin:
    """The plug-in of a flavour: `plan(request, recipe_format)` and `refusals(request)` (flavours/base.py)."""
    import importlib

    name = Flavour(flavour).value
    return importlib.import_module(FLAVOURS[name]).FLAVOUR  # type: ignore[no-any-return]


def official_selection(request: Request) -> Selection:
    """The official flavour's Selection of a request (its variants before classification): what the commands of
    that flavour's own (ci, repack, wheel builds) start from."""
    from torchforge.flavours.official import selection_of

    return selection_of(request)

