"""Recipe flavours: which package shape a PyTorch recipe has.

`official` reproduces the pytorch channel's packages (up to 2.5 the only shape there is; torchforge's hybrid
for 2.6+). `conda-forge` renders conda-forge's shape of a 2.6+ release (torchforge/flavours/conda_forge.py).
"""

from __future__ import annotations

from enum import Enum

from torchforge import versions
from torchforge.errors import UsageError


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
