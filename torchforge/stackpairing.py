"""Which torchvision and torchaudio release goes with a pytorch release (torchforge/data/stack_pairing.toml).

The table is read from each release's PyPI wheel (scripts/stack_pairing.py). For a pytorch X.Y.Z the pairing is
the newest release whose exact pin names X.Y.Z, else the newest whose lower bound only (`loose`) admits it:
torchaudio 2.11 serves every pytorch from 2.11 on.
"""

from __future__ import annotations

from functools import cache
from typing import Literal

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from torchforge.data import data_text, parse_table_as
from torchforge.datamodels import FrozenModel
from torchforge.errors import RefusedError

WHERE = "torchforge/data/stack_pairing.toml"
Companion = Literal["torchvision", "torchaudio"]


class PairingRow(FrozenModel):
    version: str
    found: bool
    requires: str | None = None  # the torch requirement, e.g. "torch==2.6.0" or "torch>=2.11"
    pytorch: str | None = None  # X.Y of its lower bound
    loose: bool = False
    wheel_requires: str | None = None
    run_requires: tuple[str, ...] = ()  # its other Requires-Dist without a marker, as conda specs (numpy, pillow)
    source: str | None = None
    reason: str | None = None  # why a row is not found

    def admits(self, pytorch: str) -> bool:
        if not self.found or self.requires is None:
            return False
        return Version(pytorch) in SpecifierSet(self.requires.removeprefix("torch"))


class PairingTable(FrozenModel):
    schema_: int = 1
    torchvision: tuple[PairingRow, ...]
    torchaudio: tuple[PairingRow, ...]


@cache
def table() -> PairingTable:
    return parse_table_as(PairingTable, data_text("stack_pairing"), WHERE,
                          "regenerate it with scripts/stack_pairing.py --write")


def companion_release(package: Companion, pytorch: str) -> PairingRow:
    """The `package` release built for pytorch `pytorch` (X.Y.Z); RefusedError when none is known."""
    rows = [row for row in getattr(table(), package) if row.admits(pytorch)]
    exact = [row for row in rows if not row.loose]
    chosen = max(exact or rows, key=lambda row: Version(row.version), default=None)
    if chosen is None:
        known = sorted({row.pytorch for row in getattr(table(), package) if row.pytorch}, key=Version)
        raise RefusedError(f"no {package} release is known for pytorch {pytorch} ({WHERE} pairs {package} with "
                           f"pytorch {', '.join(known)})",
                           f"pick a pytorch release the table covers, or leave {package} out of --with")
    return chosen
