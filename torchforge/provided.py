"""Which channel provides a requirement (issue 38's dependency closure, its refusal half): a run requirement of a
stack package that none of the stack's channels provides, and that torchforge.closure cannot bring along from a
wheel, is refused before the first build, naming the requirement, who needs it and the ways out, instead of a
solver's "Failed to resolve dependencies" hours later.

A local channel provides the packages its repodata.json holds: a requirement with a version (or build) part is
provided only where a record matches it by conda's rules (rattler's MatchSpec, in a child process). conda-forge provides the names of
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


def _local_versions(channel: Path) -> dict[str, set[str]]:
    """Each name of a local channel's index (every subdir's), with the versions it holds."""
    versions: dict[str, set[str]] = {}
    for index in channel.glob("*/repodata.json"):
        data = json.loads(index.read_text())
        for key in ("packages", "packages.conda"):
            for record in data.get(key, {}).values():
                versions.setdefault(str(record.get("name")), set()).add(str(record.get("version")))
    return versions


def _matching(wants: list[tuple[str, list[Path]]]) -> list[bool]:
    """Whether a record of the repodata.json files matches each spec, by conda's match-spec rules as rattler reads
    them (in a child process: torchforge.rattlerchild)."""
    from torchforge.rattlerchild import call

    return call("torchforge.provided:_matching_here", wants) if wants else []  # type: ignore[no-any-return]


def _matching_here(wants: list[tuple[str, list[Path]]]) -> list[bool]:
    from rattler import Channel, ChannelConfig, MatchSpec, PackageName, SparseRepoData

    loaded: dict[Path, SparseRepoData] = {}
    answers = []
    for spec, indexes in wants:
        try:
            match = MatchSpec(spec)
        except Exception:  # rattler's parse error: not refused for a spec torchforge cannot read  # noqa: BLE001
            answers.append(True)
            continue
        found = False
        for index in indexes:
            if index not in loaded:
                loaded[index] = SparseRepoData(Channel("local", ChannelConfig()), index.parent.name, str(index))
            records = loaded[index].load_records(PackageName(spec.split()[0]))
            found = found or any(match.matches(record) for record in records)
        answers.append(found)
    return answers


@dataclass(frozen=True)
class Unprovided:
    spec: str  # the requirement as its package records it
    needed_by: str  # the package file that requires it
    looked_in: tuple[str, ...]  # each channel and what it said


def unprovided(depends: tuple[str, ...], needed_by: str, channels: tuple[str, ...]) -> list[Unprovided]:
    """The requirements of `depends` that no channel of `channels` provides ([] where a channel cannot be read)."""
    local: list[tuple[Path, dict[str, set[str]]]] = []
    conda_forge = False
    for url in dict.fromkeys(channels):
        folder = localchannel.folder_of(url)
        if folder is not None:
            local.append((folder, _local_versions(folder) if folder.is_dir() else {}))
        elif url.rstrip("/") in CONDA_FORGE:
            conda_forge = True
        else:
            return []
    found, versioned = [], []
    for spec in depends:
        name = spec.split()[0]
        if name in ("python", "__glibc", "__cuda") or name.startswith("__") or (conda_forge and name in load().names):
            continue  # conda-forge's record holds names, not versions: a name it has is taken as provided
        having = [(folder, versions[name]) for folder, versions in local if name in versions]
        if having and len(spec.split()) > 1:
            versioned.append((spec, having))
        elif not having:
            looked = tuple(f"{folder}: no {name}" for folder, _ in local) + \
                ((f"conda-forge: {NOT_RECORDED} ({WHERE})",) if conda_forge else ())
            found.append(Unprovided(spec, needed_by, looked))
    matched = _matching([(spec, sorted(i for folder, _ in having for i in folder.glob("*/repodata.json")))
                         for spec, having in versioned])
    for (spec, having), ok in zip(versioned, matched):
        if not ok:
            found.append(Unprovided(spec, needed_by, tuple(
                f"{folder}: {spec.split()[0]} {', '.join(sorted(versions))}, none matching {spec}"
                for folder, versions in having) + ((f"conda-forge: {NOT_RECORDED} ({WHERE})",) if conda_forge else ())))
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
