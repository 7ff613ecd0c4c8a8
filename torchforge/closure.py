"""Requirements brought along (issue 38's dependency closure, its bring-along half): a run requirement of a
channel's pytorch, or of an extension the build makes, that no channel of the build provides is planned as a conda package repacked from a wheel that
satisfies it, into the output channel, before anything builds; the wheel's own requirements likewise, to closure.
Only what no channel provides and no wheel can be had for is left, for torchforge.provided to refuse.

The wheels come from pip (`pip download --no-deps --only-binary=:all:` for the build's Python and platform,
through the one runner): from the folders of `--wheels DIR` alone (pip's --find-links, no index, pip's own
configuration set aside), or without one from pip's own index (PyPI or as pip is configured). They are kept in
the repack's wheel folder (~/.cache/torchforge/wheels/closure), and the packages are made the way `repack`
makes its own (torchforge.binaries.stack), so a rerun from the same wheel reuses the package in the channel.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from torchforge import fileops, provided
from torchforge.binaries import wheels as wheel_files
from torchforge.binaries.catalog import pypi_to_conda
from torchforge.binaries.fetch import error_lines, pip_command, target_args
from torchforge.binaries.plan import PackagePlan, conda_depends
from torchforge.errors import UsageError
from torchforge.flavours.base import PlannedRecipe
from torchforge.proc import Command, Runner

BROUGHT_ID = "brought-along"
BROUGHT_KIND = "requirement"
SUBDIR = "linux-64"  # where repack writes its packages; a pytorch of another subdir brings nothing along


@dataclass(frozen=True)
class WheelSource:
    """Where the wheels come from: `folders` alone (--wheels), or pip's own index where there are none."""

    folders: tuple[Path, ...]
    keep: Path  # where the downloaded wheels are kept between runs

    def where(self) -> str:
        if self.folders:
            return "wheels: " + ", ".join(f"{f} (pip --find-links, no index)" for f in self.folders)
        return "wheels: pip's index (PyPI, or as pip's own configuration says)"


def default_source(folders: Sequence[str]) -> WheelSource:
    """--wheels DIR (each a folder: pip only warns that it ignores one that is not), kept in the user cache."""
    for folder in folders:
        if not Path(folder).is_dir():
            raise UsageError(f"--wheels {folder} is not a folder", "name a folder holding the wheels (*.whl)")
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return WheelSource(tuple(Path(f) for f in folders), Path(cache) / "torchforge" / "wheels" / "closure")


def pip_spec(spec: str) -> str | None:
    """A conda requirement (`networkx >=2.5.1`) as a PEP 508 one under its PyPI name; None where its version part
    has no PEP 440 form (a conda `|`)."""
    name, *rest = spec.split()
    reverse = {conda: pypi for pypi, conda in pypi_to_conda().names.items()}
    parts = []
    for item in (rest[0].split(",") if rest else ()):
        if "|" in item:
            return None
        # a bare conda version is a prefix match (`1.2` is 1.2.*)
        parts.append(item if item[:1] in "<>=!~" else f"=={item}" if item.endswith("*") else f"=={item}.*")
    return f"{reverse.get(name, name)}{','.join(parts)}"


def _pip_download(requirement: str, python: str, source: WheelSource, dest: Path) -> Command:
    """pip download of one wheel: from the --wheels folders alone (no index, this machine's pip configuration set
    aside), or from pip's own index where there are none."""
    links = ["--no-index", *(arg for folder in source.folders for arg in ("--find-links", str(folder)))] \
        if source.folders else []
    return pip_command("download", *links, "--no-deps", *target_args(python), "--dest", str(dest), requirement,
                       isolated=bool(source.folders))


def fetch_wheel(requirement: str, python: str, source: WheelSource, runner: Runner) -> Path | str:
    """The wheel pip takes for `requirement`, kept in `source.keep`; or pip's reason for none."""
    fileops.ensure_dir(source.keep, "wheel folder")
    with fileops.scratch(source.keep, "closure") as work:
        done = runner.run(_pip_download(requirement, python, source, work), check=False)
        got = sorted(work.glob("*.whl"))
        if done.returncode != 0 or len(got) != 1:
            return "; ".join(error_lines(done.output))[:300] or f"pip exited {done.returncode}"
        kept = source.keep / got[0].name
        os.replace(got[0], kept)
    return kept


def package_of(wheel: Path, python: str) -> PackagePlan:
    """A wheel of any project as a conda package, the way repack makes triton's (binaries.plan._plain_plan): the
    name from data/pypi_to_conda.toml, its depends from Requires-Dist, build `whl_pyX.Y_0`. Python-pinned even
    for a py3-none-any wheel: the files go to lib/pythonX.Y/site-packages, so the package is right for that
    Python only (a noarch: python package would need the installer to relocate them)."""
    read = wheel_files.read(wheel, any_project=True)
    name = pypi_to_conda().names.get(read.project, read.project)
    return PackagePlan(read, name, read.version, f"whl_py{python}_0", 0, python, conda_depends(read.requires, python))


@dataclass(frozen=True)
class Closure:
    brought: tuple[PackagePlan, ...]  # in the order they were found: each after the package that needs it
    missing: tuple[provided.Unprovided, ...]  # what no channel provides and no wheel was had for


def bring_along(wants: Sequence[tuple[tuple[str, ...], str]], channels: tuple[str, ...], python: str, subdir: str,
                source: WheelSource, runner: Runner, planned: frozenset[str] = frozenset()) -> Closure:
    """Every requirement no channel provides of each (depends, the package that needs them) of `wants`, brought
    along from a wheel, and theirs, to closure; a name of `planned` (a package the plan makes) is not looked for."""
    brought: dict[str, PackagePlan] = {}
    missing: list[provided.Unprovided] = []
    todo = [u for depends, needed_by in wants for u in provided.unprovided(depends, needed_by, channels)
            if u.spec.split()[0] not in planned]
    while todo:
        want = todo.pop(0)
        name = want.spec.split()[0]
        if name in brought:
            clash = _unmet(want, brought[name], source)
            missing += [clash] if clash else []
            continue
        if any(m.spec.split()[0] == name for m in missing):
            continue
        requirement = pip_spec(want.spec) if subdir == SUBDIR else None
        got = fetch_wheel(requirement, python, source, runner) if requirement else \
            f"no PEP 440 form of {want.spec!r}" if subdir == SUBDIR else f"wheels are repacked for {SUBDIR} only"
        if isinstance(got, str):
            missing.append(provided.Unprovided(want.spec, want.needed_by,
                                               (*want.looked_in, f"{source.where()}: {got}")))
            continue
        package = package_of(got, python)
        if canonicalize_name(package.name) != canonicalize_name(name):
            missing.append(provided.Unprovided(want.spec, want.needed_by, (*want.looked_in, (
                f"{source.where()}: {got.name} is {package.name}, not {name} (data/pypi_to_conda.toml)"))))
            continue
        brought[name] = package
        stem = package.filename.removesuffix(".conda")
        todo += [u for u in provided.unprovided(package.depends, stem, channels)
                 if u.spec.split()[0] not in brought and u.spec.split()[0] not in planned]
    return Closure(tuple(brought.values()), tuple(missing))


def _unmet(want: provided.Unprovided, brought: PackagePlan, source: WheelSource) -> provided.Unprovided | None:
    """`want` of a name brought along for another package already, where that version does not satisfy it."""
    requirement = pip_spec(want.spec)
    if requirement is not None and Requirement(requirement).specifier.contains(brought.version, prereleases=True):
        return None
    return provided.Unprovided(want.spec, want.needed_by, (*want.looked_in, (
        f"{source.where()}: {brought.wheel.path.name} is brought along for another requirement, and {brought.version}"
        f" does not satisfy {want.spec}")))


def brought_recipes(closure: Closure) -> tuple[PlannedRecipe, ...]:
    """The brought-along packages as recipes of the plan, one a package, before the builds that need them: the
    repack makes them (torchforge.binaries.stack), no engine; reused by name once in the output channel."""
    return tuple(PlannedRecipe(f"{BROUGHT_ID}-{p.name}", SUBDIR, (p.filename.removesuffix(".conda"),), "", {}, (),
                               kind=BROUGHT_KIND, python=p.python,
                               note=f"repacked from {p.wheel.path.name}: required, and no channel of the build has it")
                 for p in closure.brought)


def is_brought(recipe_id: str) -> bool:
    return recipe_id.startswith(f"{BROUGHT_ID}-")


def refuse_missing(closure: Closure) -> None:
    """RefusedError for what could not be brought along (torchforge.provided says what, who, where, ways out)."""
    provided.refuse_unprovided(list(closure.missing))
