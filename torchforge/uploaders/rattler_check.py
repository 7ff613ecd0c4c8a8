"""Post-upload check through py-rattler: the channel lists each file with the sha256 and size that were
sent, and a solve + install from the channel into a scratch prefix succeeds.

This is what a user's `conda install -c <channel> pytorch` exercises, so it is the check that matters.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from torchforge.aio import run_async
from torchforge.errors import UploadFailedError
from torchforge.archives import Archive

if TYPE_CHECKING:
    from rattler import MatchSpec, RepoDataRecord


def _spec(archive: Archive) -> MatchSpec:
    """An exact spec for one archive, as a py-rattler object.

    The gateway and solver parse *strings* strictly, and strict parsing rejects the dot of every official
    pytorch build string (`py3.11_cpu_0`); a MatchSpec object built from the archive's own fields is
    matched as is.
    """
    from rattler import MatchSpec

    return MatchSpec(f"{archive.name}[version='=={archive.version}', build='{archive.build}']")


def _query(channel_url: str, archives: Sequence[Archive], platforms: list[str], cache: Path) -> dict[str, object]:
    """filename -> RepoDataRecord for every archive the channel lists (without dependencies)."""
    from rattler import Gateway

    gateway = Gateway(cache_dir=cache)
    result = run_async(gateway.query([channel_url], platforms, [_spec(a) for a in archives], recursive=False))
    return {rec.file_name: rec for per_spec in result for rec in per_spec}


def check_channel(
    channel_url: str,
    archives: Sequence[Archive],
    *,
    wait_s: float = 0.0,
    poll_s: float = 0.5,
    install: bool = True,
    work: Path | None = None,
) -> list[str]:
    """Verify `archives` in `channel_url`. `wait_s` allows for servers that index in the background (quetz).
    `work` is where the scratch prefix goes (a directory channel passes its own scratch folder, so a killed
    check leaves nothing outside the channel, and the next run removes it). py-rattler runs in a child
    process (torchforge.rattlerchild)."""
    from torchforge.rattlerchild import call

    return call("torchforge.uploaders.rattler_check:_check_here", channel_url, list(archives),  # type: ignore[no-any-return]
                wait_s=wait_s, poll_s=poll_s, install=install, work=work)


def _check_here(
    channel_url: str,
    archives: Sequence[Archive],
    *,
    wait_s: float = 0.0,
    poll_s: float = 0.5,
    install: bool = True,
    work: Path | None = None,
) -> list[str]:
    """`check_channel`'s work, in this process."""
    from rattler import Gateway, Platform, install as rattler_install, solve
    from rattler.exceptions import SolverError

    if not archives:
        return []
    platforms = sorted({a.subdir for a in archives} | {"noarch"})
    lines: list[str] = []
    with tempfile.TemporaryDirectory(prefix="torchforge-verify-", dir=work) as tmp:
        work = Path(tmp)
        deadline = time.monotonic() + wait_s
        attempt = 0
        while True:
            attempt += 1
            # A fresh cache each time: an HTTP channel's repodata must be re-read, not served from the last poll.
            records = _query(channel_url, archives, platforms, work / f"cache-{attempt}")
            missing = [a for a in archives if a.filename not in records]
            if not missing or time.monotonic() >= deadline:
                break
            time.sleep(poll_s)
        if missing:
            raise UploadFailedError(
                f"{channel_url} does not list {', '.join(a.filename for a in missing)} after upload",
                "the server accepted the file but did not index it; check its logs",
            )
        for archive in archives:
            rec = records[archive.filename]
            sha = rec.sha256.hex() if rec.sha256 else None  # type: ignore[attr-defined]
            size = rec.size  # type: ignore[attr-defined]
            if sha != archive.sha256 or (size is not None and size != archive.size):
                raise UploadFailedError(
                    f"{channel_url} lists {archive.filename} with sha256 {sha} size {size}, "
                    f"but {archive.sha256} size {archive.size} was sent",
                    "another upload replaced it, or the transfer was damaged; upload again with --force",
                )
            lines.append(f"listed {archive.subdir}/{archive.filename} sha256 {archive.sha256[:12]}… {archive.size} bytes")
        if not install:
            return lines
        here = str(Platform.current())
        installable = [a for a in archives if a.subdir in (here, "noarch")]
        for archive in archives:
            if archive not in installable:
                lines.append(f"not installed {archive.filename}: built for {archive.subdir}, this machine is {here}")
        if not installable:
            return lines
        gateway = Gateway(cache_dir=work / "cache-solve")
        specs = [_spec(a) for a in installable]
        try:
            solved = run_async(solve([channel_url], specs, gateway=gateway, platforms=[here, "noarch"]))
            how = "solved with dependencies from the channel"
        except SolverError:
            # Real packages depend on python, mkl, ... from other channels: the channel alone cannot satisfy them.
            # Installing the records alone still proves the channel serves intact, installable archives.
            solved = [records[a.filename] for a in installable]  # type: ignore[misc]
            how = f"installed without dependencies: {_from_elsewhere(solved)}"
        prefix = work / "prefix"
        run_async(rattler_install(solved, target_prefix=prefix, cache_dir=work / "pkgs", show_progress=False))
        installed = {p.name for p in (prefix / "conda-meta").glob("*.json")}
        for archive in installable:
            if f"{archive.stem}.json" not in installed:
                raise UploadFailedError(f"installing {archive.filename} from {channel_url} left no conda-meta record")
        lines.append(f"install from {channel_url}: {', '.join(a.stem for a in installable)} ({how})")
    return lines


def _from_elsewhere(solved: Sequence[RepoDataRecord]) -> str:
    """What the archives need that they do not provide one another (python, numpy, ...): the channel is used next to
    the channels that have it."""
    names = {r.name.normalized for r in solved}
    needed = sorted({d.split()[0] for r in solved for d in r.depends} - names)
    needed = [n for n in needed if not n.startswith("__")]
    shown = ", ".join(needed[:6]) + (f" and {len(needed) - 6} more" if len(needed) > 6 else "")
    return f"{shown} come from other channels" if needed else "the solver refused the channel alone"
