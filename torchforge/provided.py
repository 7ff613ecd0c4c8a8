"""Which channel provides a requirement (issue 38's dependency closure, its refusal half): a run requirement of a
stack package that none of the stack's channels provides, and that torchforge.closure cannot bring along from a
wheel, is refused before the first build, naming the requirement, who needs it and the ways out, instead of a
solver's "Failed to resolve dependencies" hours later.

A local channel provides the names its repodata.json holds. conda-forge provides the names of
torchforge/data/conda_forge_names.toml (read from feedstock snapshots, each cited; no machine here reaches
conda-forge); a name not there is "not on conda-forge as far as the record knows". Any other remote channel
is not read offline: where one is among the channels, nothing is refused (it may well have the name).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from torchforge import localchannel
from torchforge.data import data_text, parse_table_as
from torchforge.datamodels import FrozenModel
from torchforge.errors import RefusedError

WHERE = "torchforge/data/conda_forge_names.toml"
CONDA_FORGE = ("https://conda.anaconda.org/conda-forge", "conda-forge")
NOT_RECORDED = "not on conda-forge as far as the record knows"


class Meta(FrozenModel):
    feedstocks: tuple[str, ...]


class NamesTable(FrozenModel):
    schema_: int = 1
    meta: Meta
    names: dict[str, str]  # conda name -> REPO@COMMIT:FILE:LINE of the recipe line that makes it


@cache
def load() -> NamesTable:
    return parse_table_as(NamesTable, data_text("conda_forge_names"), WHERE,
                          "rebuild it with `make conda-forge-names`")


def _local_names(channel: Path) -> set[str]:
    names: set[str] = set()
    for index in channel.glob("*/repodata.json"):
        data = json.loads(index.read_text())
        names |= {str(r.get("name")) for key in ("packages", "packages.conda") for r in data.get(key, {}).values()}
    return names


@dataclass(frozen=True)
class Unprovided:
    spec: str  # the requirement as its package records it
    needed_by: str  # the package file that requires it
    looked_in: tuple[str, ...]  # each channel and what it said


def unprovided(depends: tuple[str, ...], needed_by: str, channels: tuple[str, ...]) -> list[Unprovided]:
    """The requirements of `depends` that no channel of `channels` provides ([] where a channel cannot be read)."""
    local: list[tuple[str, set[str]]] = []
    conda_forge = False
    for url in dict.fromkeys(channels):
        folder = localchannel.folder_of(url)
        if folder is not None:
            local.append((str(folder), _local_names(folder) if folder.is_dir() else set()))
        elif url.rstrip("/") in CONDA_FORGE:
            conda_forge = True
        else:
            return []
    found = []
    for spec in depends:
        name = spec.split()[0]
        if name in ("python", "__glibc", "__cuda") or name.startswith("__"):
            continue
        if any(name in names for _, names in local) or (conda_forge and name in load().names):
            continue
        looked = tuple(f"{where}: no {name}" for where, _ in local) + \
            ((f"conda-forge: {NOT_RECORDED} ({WHERE})",) if conda_forge else ())
        found.append(Unprovided(spec, needed_by, looked))
    return found


def refuse_unprovided(missing: list[Unprovided]) -> None:
    """RefusedError naming each requirement no channel provides, who needs it, where it was looked for."""
    if missing:
        raise RefusedError(
            "requirements no channel of the build provides:\n  - " + "\n  - ".join(
                f"{m.spec} (required by {m.needed_by}; {'; '.join(m.looked_in) or 'no channel'})" for m in missing),
            "add a channel that has them (--channel FOLDER or URL), or put their packages into --out; or give a "
            "folder holding a wheel that satisfies each (--wheels DIR: it is repacked into --out before anything "
            "builds); a name conda-forge has under another name needs that name in the requiring package (for a "
            "wheel's requirement: torchforge/data/pypi_to_conda.toml maps PyPI names to conda names)")
