"""`install --stack`: exactly the lock's files into a new prefix with py-rattler, no solve.

Each locked file is looked up in its channel's index by name, version and build; a channel that no longer holds
the file, or holds it with another sha256 (in its index, or on disk for a local channel), is refused before
anything is linked."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from torchforge.errors import UsageError
from torchforge.fileops import path_of_file_url, sha256_file
from torchforge.prefix import check_overrides, install_by, install_records
from torchforge.stackfile.lock import Environment

REBUILD = "rebuild the stack (`torchforge build --stack`) to lock what the channels hold now"


def install_locked(env: Environment, prefix: Path) -> list[str]:
    """Install the environment's locked files into `prefix` (new or empty); `name-version-build` of each."""
    check_overrides()
    locked = [package.model_dump() for package in env.packages]
    return install_by("torchforge.stackfile.install:_install_here", prefix, locked)


def _install_here(locked: list[dict[str, Any]], prefix: Path, work: Path) -> list[str]:
    """In the child (torchforge.rattlerchild): each locked file's record from its channel, checked, installed."""
    import rattler

    from torchforge.aio import run_async

    gateway = rattler.Gateway(cache_dir=work / "repodata")
    wanted: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for package in locked:
        wanted[(package["channel"], package["subdir"])].append(package)
    records = []
    for (channel, subdir), packages in wanted.items():
        found = run_async(gateway.query([rattler.Channel(channel)], [rattler.Platform(subdir)],
                                        [rattler.MatchSpec(f"{p['name']} =={p['version']} {p['build']}")
                                         for p in packages], recursive=False))
        by_file = {str(r.file_name): r for group in found for r in group}
        records += [_checked(by_file.get(p["file"]), p) for p in packages]
    return install_records(rattler, records, prefix, work)


def _checked(record: Any, package: dict[str, Any]) -> Any:
    where = f"{package['channel']}/{package['subdir']}"
    if record is None:
        raise UsageError(f"{where} no longer holds {package['file']}, which the lock names; nothing was installed",
                         REBUILD)
    listed = record.sha256.hex() if record.sha256 else ""
    local = path_of_file_url(str(record.url))
    actual = sha256_file(local) if local is not None and local.is_file() else listed
    for what, sha in (("its index lists", listed), ("the file has", actual)):
        if sha != package["sha256"]:
            raise UsageError(f"{where}/{package['file']}: {what} sha256 {sha or '(none)'}, the lock {package['sha256']}"
                             "; nothing was installed", REBUILD)
    return record
