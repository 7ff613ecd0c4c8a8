"""The tests' solves, installs and MatchSpec readings with py-rattler, run in the product's own child process
(torchforge.rattlerchild), never in the pytest process.

py-rattler crashes now and then at interpreter shutdown (docs/upstream-reports.md), which is why torchforge runs
it in a child that ends with os._exit; a pytest worker that imported it would crash the same way at its own exit.
What comes back is plain data (`Record`, strings): unpickling a py-rattler object here would import it here.
tests/test_suite_rules.py keeps test modules from importing rattler themselves.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchforge.rattlerchild import call

PLATFORMS = ("linux-64", "noarch")


@dataclass(frozen=True)
class Record:
    """What the tests read of a solved package record."""

    name: str
    version: str
    build: str
    build_number: int
    file_name: str
    depends: tuple[str, ...]
    sha256: str | None
    size: int | None


@dataclass(frozen=True)
class Spec:
    """A MatchSpec as py-rattler reads it: its canonical text and its package name."""

    text: str
    name: str


class Unsolvable(Exception):
    """The solver found no solution (py-rattler's SolverError, with its message)."""


def _channels(channels: Sequence[Path | str]) -> list[str]:
    return [c if isinstance(c, str) else str(c) for c in channels]


def solve(channels: Sequence[Path | str], specs: Sequence[str], *, virtual: Mapping[str, str] | None = None,
          cache: Path | None = None, platforms: Sequence[str] = PLATFORMS) -> list[Record]:
    """Solve `specs` from `channels` (folders or URLs) with exactly the virtual packages `virtual` ({"__cuda":
    "12.8"}, build string 0). Raises Unsolvable when there is no solution."""
    return _checked(call("tests.rattler_in_child:_work", "solve", _channels(channels), list(specs),
                         dict(virtual or {}), cache, list(platforms), None))


def solve_and_install(channels: Sequence[Path | str], specs: Sequence[str], prefix: Path, *,
                      virtual: Mapping[str, str] | None = None, cache: Path | None = None,
                      platforms: Sequence[str] = PLATFORMS) -> list[Record]:
    """`solve`, then install the solution into `prefix` (package cache `cache`, or one beside the prefix)."""
    return _checked(call("tests.rattler_in_child:_work", "install", _channels(channels), list(specs),
                         dict(virtual or {}), cache, list(platforms), prefix))


def install_without_dependencies(channel: Path, name: str, build: str, prefix: Path, cache: Path) -> Record:
    """Install the one `name` record of build `build` from `channel`'s linux-64 index, without its dependencies
    (what an offline channel of only that package can give)."""
    return call("tests.rattler_in_child:_install_record", channel, name, build, prefix, cache)  # type: ignore[no-any-return]


def channel_records(channel: Path, subdir: str = "linux-64") -> list[Record]:
    """Every record `channel`'s `subdir` index lists."""
    return call("tests.rattler_in_child:_listed", channel, subdir, [])[0]  # type: ignore[no-any-return]


def specs_without_a_match(channel: Path, specs: Sequence[str], subdir: str = "linux-64") -> list[str]:
    """The specs that no record of `channel`'s `subdir` index matches (MatchSpec.matches)."""
    return call("tests.rattler_in_child:_listed", channel, subdir, list(specs))[1]  # type: ignore[no-any-return]


def parse_specs(texts: Sequence[str]) -> dict[str, Spec]:
    """Every text read as a MatchSpec, in one child."""
    return call("tests.rattler_in_child:_parse", list(texts))  # type: ignore[no-any-return]


def _checked(outcome: tuple[str, Any]) -> list[Record]:
    kind, value = outcome
    if kind == "unsolvable":
        raise Unsolvable(value)
    return value  # type: ignore[no-any-return]


# ------------------------------------------------------------------------ in the child (torchforge.rattlerchild)

def _record(record: Any) -> Record:
    return Record(record.name.normalized, str(record.version), str(record.build), record.build_number,
                  record.file_name, tuple(record.depends), record.sha256.hex() if record.sha256 else None, record.size)


def _work(action: str, channels: list[str], specs: list[str], virtual: dict[str, str], cache: Path | None,
          platforms: list[str], prefix: Path | None) -> tuple[str, Any]:
    import asyncio

    import rattler
    from rattler.exceptions import SolverError

    packages = [rattler.GenericVirtualPackage(rattler.PackageName(n), rattler.Version(v), rattler.BuildString("0"))
                for n, v in virtual.items()]
    gateway = rattler.Gateway(cache_dir=cache / "repodata") if cache is not None else rattler.Gateway()
    try:
        # MatchSpec objects: the solver's own parsing of a string is strict and refuses the dot of an official
        # build string (py3.11_cpu_0); MatchSpec() reads it as conda does.
        records = asyncio.run(rattler.solve([rattler.Channel(c) for c in channels], [rattler.MatchSpec(s) for s in specs],
                                            gateway=gateway, platforms=platforms, virtual_packages=packages))
    except SolverError as exc:
        return ("unsolvable", str(exc))
    if action == "install":
        assert prefix is not None
        packages_cache = cache / "pkgs" if cache is not None else prefix.parent / f"{prefix.name}-pkgs"
        asyncio.run(rattler.install(records, target_prefix=prefix, cache_dir=packages_cache, show_progress=False))
    return ("ok", [_record(r) for r in records])


def _install_record(channel: Path, name: str, build: str, prefix: Path, cache: Path) -> Record:
    import asyncio

    import rattler

    repo = rattler.SparseRepoData(rattler.Channel(str(channel)), "linux-64", channel / "linux-64" / "repodata.json")
    records = [r for r in repo.load_records(rattler.PackageName(name)) if str(r.build) == build]
    if len(records) != 1:
        raise ValueError(f"{len(records)} records of {name} with build {build} in {channel}")
    asyncio.run(rattler.install(records, target_prefix=prefix, cache_dir=cache, show_progress=False))
    return _record(records[0])


def _listed(channel: Path, subdir: str, specs: list[str]) -> tuple[list[Record], list[str]]:
    import rattler

    repodata = rattler.SparseRepoData(rattler.Channel(str(channel)), subdir, channel / subdir / "repodata.json")
    records = [r for name in repodata.package_names() for r in repodata.load_records(rattler.PackageName(name))]
    unmatched = [s for s in specs if not any(rattler.MatchSpec(s).matches(r) for r in records)]
    return [_record(r) for r in records], unmatched


def _parse(texts: list[str]) -> dict[str, Spec]:
    from rattler import MatchSpec

    parsed = {}
    for text in texts:
        spec = MatchSpec(text)
        parsed[text] = Spec(str(spec), spec.name.normalized)
    return parsed
