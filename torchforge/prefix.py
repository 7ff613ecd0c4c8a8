"""Install packages from channels into a new prefix with py-rattler's solver (what `conda create -p PREFIX -c
CHANNEL SPEC` does), for trying a channel on a machine without conda, mamba or pixi."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from torchforge import fileops
from torchforge.aio import run_async
from torchforge.errors import UsageError


def channel_url(channel: str) -> str:
    """A channel as given on the command line: a URL, or a local folder (made absolute, so the prefix's
    records name it wherever the command ran)."""
    if "://" in channel:
        return channel
    folder = Path(channel)
    if not (folder / "noarch" / "repodata.json").is_file() and not any(folder.glob("*/repodata.json")):
        raise UsageError(f"{channel} is not a channel folder (no <subdir>/repodata.json in it)",
                         "give a folder torchforge build, repack or standin-channel wrote, or a channel URL")
    return str(folder.resolve())


def install(specs: Sequence[str], channels: Sequence[str], prefix: Path) -> list[str]:
    """Solve `specs` against `channels` (in order, for this platform and noarch, with this machine's virtual
    packages) and install the solution into `prefix`, which must be new or empty. Returns `name-version-build` of
    every installed package."""
    import rattler
    from rattler.exceptions import SolverError

    if not channels:
        raise UsageError("no channel given", "name at least one with --channel (a folder or a URL)")
    if prefix.exists() and (not prefix.is_dir() or any(prefix.iterdir())):
        raise UsageError(f"{prefix} exists and is not an empty folder", "give a new folder for the prefix")
    urls = [channel_url(c) for c in channels]
    platforms = [str(rattler.Platform.current()), "noarch"]
    # This machine's __glibc, __cuda (its driver) etc., overridden by CONDA_OVERRIDE_CUDA and friends, as conda does:
    # a CUDA build requires __cuda, so without them it could never be chosen.
    virtual = rattler.VirtualPackage.detect(rattler.VirtualPackageOverrides.from_env())
    with fileops.private_scratch("install") as work:
        try:
            records = run_async(rattler.solve(urls, list(specs), platforms=platforms, virtual_packages=virtual,
                                              gateway=rattler.Gateway(cache_dir=work / "repodata")))
        except SolverError as exc:
            raise UsageError(f"{', '.join(specs)} cannot be installed from {', '.join(urls)}: {str(exc).strip()[:600]}",
                             "add the channel that has the missing packages with another --channel") from None
        run_async(rattler.install(records, target_prefix=prefix.resolve(), cache_dir=work / "pkgs", show_progress=False))
    return sorted(f"{r.name.normalized}-{r.version}-{r.build}" for r in records)
