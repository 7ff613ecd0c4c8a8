"""Install packages from channels into a new prefix with py-rattler's solver (what `conda create -p PREFIX -c
CHANNEL SPEC` does), for trying a channel on a machine without conda, mamba or pixi.

The solve and the install run in a child process (torchforge.rattlerchild): a py-rattler panic ends the child,
never this process. While the install runs, PREFIX holds a marker; a prefix with the marker is one an
interrupted or failed install left, and the rerun removes it and installs again (a conda prefix cannot be
installed elsewhere and renamed: its files name their own folder)."""

from __future__ import annotations

import json
import os
import re
import shutil
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from torchforge import fileops, localchannel
from torchforge.aio import run_async
from torchforge.errors import ArchiveError, UsageError
from torchforge.pausepoint import pause_at
from torchforge.safeextract import MemberRule

IN_PROGRESS = ".torchforge-install-in-progress"
_LOCK = ".torchforge-install.lock"
# The virtual packages a user may override, as conda and py-rattler read them; each takes a version.
# CONDA_OVERRIDE_CUDA_ARCH (CEP 46, conda/ceps@04652ad0:cep-0046.md) may add `=BUILD`; py-rattler 0.28 has no
# keyword for it in VirtualPackageOverrides, but its from_env() reads it (and drops it where __cuda is absent).
_OVERRIDES = ("CONDA_OVERRIDE_CUDA", "CONDA_OVERRIDE_CUDA_ARCH", "CONDA_OVERRIDE_GLIBC", "CONDA_OVERRIDE_OSX",
              "CONDA_OVERRIDE_LINUX")
_VERSION = re.compile(r"^[0-9]+(\.[0-9]+)*$")


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


def check_overrides(environ: dict[str, str] | os._Environ[str] = os.environ) -> None:
    """Refuse a CONDA_OVERRIDE_* that is not a version (py-rattler fails on some, ignores others silently)."""
    for name in _OVERRIDES:
        value = environ.get(name)
        # An empty CONDA_OVERRIDE_CUDA means "no driver", as in conda.
        if value is not None and value.strip() and not _VERSION.match(value.strip().partition("=")[0]):
            raise UsageError(f"{name}={value!r} is not a version",
                             "give a version made of numbers and dots (X.Y), or unset it to use what this machine has")


def cuda_arch_seen() -> str | None:
    """The `__cuda_arch` (CEP 46) a solve here sees: this machine's lowest GPU compute capability as rattler
    detects it, or CONDA_OVERRIDE_CUDA_ARCH; None where it is absent (no GPU, or no `__cuda`)."""
    from torchforge.rattlerchild import call

    check_overrides()
    return call("torchforge.prefix:_cuda_arch_seen")  # type: ignore[no-any-return]


def _cuda_arch_seen() -> str | None:
    import rattler

    for package in rattler.VirtualPackage.detect(rattler.VirtualPackageOverrides.from_env()):
        generic = package.into_generic()
        if generic.name.normalized == "__cuda_arch":
            return str(generic.version)
    return None


@dataclass(frozen=True)
class Installed:
    packages: list[str]  # name-version-build of every installed package
    cuda_arch: str | None  # the `__cuda_arch` the solve saw (CEP 46), None where it was absent


def install(specs: Sequence[str], channels: Sequence[str], prefix: Path) -> Installed:
    """Solve `specs` against `channels` (in order, for this platform and noarch, with this machine's virtual
    packages) and install the solution into `prefix`, which must be new or empty, or one an interrupted install
    left. On any failure the prefix is removed; a refused solve names the `__cuda_arch` it saw."""
    if not channels:
        raise UsageError("no channel given", "name at least one with --channel (a folder or a URL)")
    urls = [channel_url(c) for c in channels]
    check_overrides()
    installed: Installed = install_by("torchforge.prefix:_install_here", prefix, list(specs), urls)
    return installed


def install_by(target: str, prefix: Path, *args: Any) -> Any:
    """Claim `prefix` and run `target(*args, prefix, work)` in py-rattler's child process (an install of a solve,
    or of a lock's exact files); what it returns. On any failure the prefix is removed."""
    from torchforge.rattlerchild import call

    made, lock = _claim(prefix)
    try:
        pause_at("install-claimed")  # the suite holds an install here (lock and marker taken, nothing linked)
        with fileops.private_scratch("install") as work:
            installed = call(target, *args, prefix.resolve(), work)
        pause_at("install-linked")  # or here: every file linked, the marker not yet removed
    except BaseException:
        lock.release()
        _remove_half_made(prefix, made)
        raise
    (prefix / IN_PROGRESS).unlink()
    lock.release()
    (prefix / _LOCK).unlink(missing_ok=True)
    return installed


def resuming(prefix: Path) -> bool:
    """Whether `prefix` is one an interrupted or failed install left (the rerun starts it again), not one an
    install is still writing."""
    if not (prefix / IN_PROGRESS).is_file():
        return False
    try:
        _take(prefix).release()
    except UsageError:
        return False
    return True


def _claim(prefix: Path) -> tuple[Path | None, FileLock]:
    """Make `prefix` an empty folder holding only the in-progress marker and the lock this process holds while
    it installs. Returns the outermost folder this made (to remove on failure; None where the prefix folder was
    there before, then only emptied) and the lock. A prefix whose lock another install holds is not touched."""
    if prefix.exists() and not prefix.is_dir():
        raise UsageError(f"{prefix} exists and is not a folder", "give a new folder for the prefix")
    if prefix.is_dir() and (prefix / IN_PROGRESS).is_file():
        _take(prefix).release()  # refused while the install that left the marker still runs
        shutil.rmtree(prefix)
    elif prefix.is_dir() and any(prefix.iterdir()):
        raise UsageError(f"{prefix} exists and is not an empty folder", "give a new folder for the prefix")
    made = next((p for p in reversed([prefix, *prefix.absolute().parents]) if not p.exists()), None)
    prefix.mkdir(parents=True, exist_ok=True)
    lock = _take(prefix)
    try:
        (prefix / IN_PROGRESS).write_text("torchforge install is writing this prefix; rerun it to start again\n")
    except OSError:  # a full disk: leave nothing behind
        lock.release()
        _remove_half_made(prefix, made)
        raise
    return made, lock


def _take(prefix: Path) -> FileLock:
    """The prefix's install lock (the kernel drops it when its holder dies), or a refusal while another holds it."""
    lock = FileLock(str(prefix / _LOCK))
    try:
        lock.acquire(blocking=False)
    except Timeout:
        raise UsageError(f"another torchforge install is writing {prefix}",
                         "wait for it to finish, or give another folder for the prefix") from None
    return lock


def _remove_half_made(prefix: Path, made: Path | None) -> None:
    """Remove what an install wrote: the folders it made, or the prefix's contents where it was there before."""
    if made is not None:
        shutil.rmtree(made, ignore_errors=True)
        return
    for child in list(prefix.iterdir()):
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


def _install_here(specs: list[str], urls: list[str], prefix: Path, work: Path) -> Installed:
    """`install`'s work, in the child process."""
    import rattler

    return Installed(install_records(rattler, _solve(rattler, specs, urls, work), prefix, work), _cuda_arch_seen())


def install_records(rattler: Any, records: list[Any], prefix: Path, work: Path) -> list[str]:
    """In the child: link `records` into `prefix`, each checked first for paths outside it (a solve's records, or
    a lock's exact files)."""
    for record in records:
        _refuse_escaping_paths(rattler, record)
    try:
        run_async(rattler.install(records, target_prefix=prefix, cache_dir=work / "pkgs", show_progress=False))
    except rattler.exceptions.InstallerError as exc:
        text = _chain(exc)
        if "(os error" in text:
            raise  # a system error: rattlerchild reports it as one (a full disk, a read-only folder)
        raise UsageError(f"installing into {prefix} failed: {text[:600]}",
                         "the channel's packages may be damaged: rebuild or re-download them") from None
    return sorted(f"{r.name.normalized}-{r.version}-{r.build}" for r in records)


def _solve(rattler: Any, specs: list[str], urls: list[str], work: Path) -> list[Any]:
    from rattler.exceptions import GatewayError, InvalidMatchSpecError, SolverError

    try:
        # Parsed leniently, as conda does: official build strings have dots (py3.11_cpu_0).
        matchspecs = [rattler.MatchSpec(spec) for spec in specs]
    except InvalidMatchSpecError as exc:
        raise UsageError(f"{' '.join(specs)!r}: not a package spec ({exc})",
                         "give NAME, 'NAME VERSION' or 'NAME VERSION BUILD', e.g. pytorch or 'pytorch >=2.9'") from None
    platforms = [str(rattler.Platform.current()), "noarch"]
    # This machine's __glibc, __cuda (its driver) etc., overridden by CONDA_OVERRIDE_CUDA and friends, as conda does:
    # a CUDA build requires __cuda, so without them it could never be chosen.
    virtual = rattler.VirtualPackage.detect(rattler.VirtualPackageOverrides.from_env())
    try:
        return list(run_async(rattler.solve(urls, matchspecs, platforms=platforms, virtual_packages=virtual,
                                            gateway=rattler.Gateway(cache_dir=work / "repodata"))))
    except SolverError as exc:
        seen = next((str(p.into_generic().version) for p in virtual if p.into_generic().name.normalized == "__cuda_arch"),
                    None)
        text = f"{str(exc).strip()[:600]} (the solve saw " + (f"__cuda_arch {seen})" if seen else "no __cuda_arch)")
        hint = ("a package's device code does not run on this GPU (its __cuda_arch constraint, CEP 46): install one "
                "built with an arch list that covers the GPU, or set CONDA_OVERRIDE_CUDA_ARCH to install for another "
                "GPU" if "would constrain" in text and "__cuda_arch" in text else
                "add the channel that has the missing packages with another --channel")
        raise UsageError(f"{', '.join(specs)} cannot be installed from {', '.join(urls)}: {text}", hint) from None
    except GatewayError as exc:
        raise UsageError(f"a channel could not be read: {_chain(exc)[:600]}",
                         "check each --channel: a folder or URL with <subdir>/repodata.json that this machine can "
                         "reach (a URL is read over the network)") from None


def _chain(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def _refuse_escaping_paths(rattler: Any, record: Any) -> None:
    """Refuse a package that would write outside the prefix (an absolute path or `..` in info/paths.json)
    before anything is linked: py-rattler aborts on some and writes others where they say."""
    paths_json = _paths_json(rattler, str(record.url))
    rule = MemberRule(Path(str(record.url)))  # the one rule every archive reader applies (safeextract)
    for entry in paths_json.get("paths", []):
        path = str(entry.get("_path", ""))
        try:
            rule.check_name(path)
        except ArchiveError:
            raise ArchiveError(f"{record.url} would write {path!r}, outside the prefix; nothing was installed",
                               "remove that package from the channel (torchforge upload refuses such archives) "
                               "and install only from channels you trust") from None


def _paths_json(rattler: Any, url: str) -> dict[str, Any]:
    """info/paths.json of a package: read from the file for a local channel (localchannel.info_json), fetched
    alone for a remote .conda (a range request); {} for a remote .tar.bz2, which would have to be downloaded twice."""
    local = fileops.path_of_file_url(url)
    if local is not None:
        return _local_paths_json(local)
    if url.endswith(".conda"):
        from rattler.networking import Client
        from rattler.package_streaming import fetch_raw_package_file_from_url

        try:  # py-rattler's own client: retries, and the credentials it installs with
            raw = bytes(run_async(fetch_raw_package_file_from_url(Client.default_client(), url, "info/paths.json")))
        except OSError as exc:
            raise UsageError(f"{url}: its info/paths.json could not be read to check it before installing ({exc})",
                             "check that the channel is reachable and serves the file whole; nothing was installed"
                             ) from None
        value = json.loads(raw)
        return value if isinstance(value, dict) else {}
    return {}


def _local_paths_json(archive: Path) -> dict[str, Any]:
    import tarfile

    from backports import zstd  # conda-package-handling's own zstd dependency

    try:
        return localchannel.info_json(archive, "paths.json")
    except (OSError, EOFError, zipfile.BadZipFile, tarfile.TarError, zstd.ZstdError) as exc:
        raise ArchiveError.unreadable(archive, exc) from None
