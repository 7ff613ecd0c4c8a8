"""An extension's SPEC to one local source archive, checked by the archive rule (torchforge/safeextract.py).

SPEC forms: `NAME==VERSION` (the sdist from the indexes pip's configuration names, never a wheel, downloaded
without running it: torchforge/extensions/index.py),
a local `.tar.gz` / `.zip` sdist, a local source folder (packed here, without `.git`), or `git+URL@REV` (cloned
with git and archived at REV: a URL git can reach, such as a mirror or a local repository).
"""

from __future__ import annotations

import gzip
import re
import tarfile
from dataclasses import dataclass
from pathlib import Path

from torchforge.errors import ToolFailedError, UsageError
from torchforge.extensions.index import download
from torchforge.proc import Command, Runner
from torchforge.safeextract import check_archive

ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".zip")
_PINNED = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][0-9A-Za-z.+!_-]*)$")
SPEC_HINT = ("give NAME==VERSION (e.g. torch-scatter==2.1.2), a local sdist (.tar.gz or .zip), a source folder, "
             "or git+URL@REV")


@dataclass(frozen=True)
class SdistSpec:
    """One --extension SPEC, read."""

    text: str
    kind: str  # "index", "archive", "folder" or "git"
    location: str  # NAME==VERSION, a path, or the git URL
    rev: str = ""  # git only


# What makes a folder a source tree: a folder without one (the current folder, /etc) is never packed.
SOURCE_MARKERS = ("pyproject.toml", "setup.py", "PKG-INFO")


def parse_spec(text: str) -> SdistSpec:
    spec = text.strip()
    if not spec:
        raise UsageError("--extension '': an empty SPEC names no source", SPEC_HINT)
    if spec.startswith("git+"):
        return _git_spec(text, spec[4:])
    if _PINNED.match(spec):
        return SdistSpec(text, "index", spec)
    path = Path(spec).expanduser()
    if path.is_dir():
        if not any((path / marker).is_file() for marker in SOURCE_MARKERS):
            raise UsageError(f"--extension {text!r}: the folder {path.resolve()} is not a Python source tree (no "
                             f"{', '.join(SOURCE_MARKERS)} in it)", SPEC_HINT)
        return SdistSpec(text, "folder", str(path.resolve()))
    if path.is_file() and spec.endswith(ARCHIVE_SUFFIXES):
        return SdistSpec(text, "archive", str(path.resolve()))
    why = (f"{path} is a file but not an sdist ({', '.join(ARCHIVE_SUFFIXES)})" if path.exists()
           else "no such file or folder" if "/" in spec or spec.endswith(ARCHIVE_SUFFIXES) else "not NAME==VERSION")
    raise UsageError(f"--extension {text!r}: {why}", SPEC_HINT)


def names_a_path(text: str) -> bool:
    """Whether a SPEC is a local path (a sdist or a folder), not NAME==VERSION nor git+URL@REV."""
    spec = text.strip()
    return bool(spec) and not spec.startswith("git+") and not _PINNED.match(spec)


def _git_spec(text: str, rest: str) -> SdistSpec:
    url, _, rev = rest.rpartition("@")
    for part, what in ((url, "URL"), (rev, "revision")):
        if part.startswith("-"):  # git would read it as an option
            raise UsageError(f"--extension {text!r}: the git {what} {part!r} starts with '-'",
                             "give a tag or commit (git+URL@v1.0), and a URL such as https://, ssh:// or file://")
    if not url or not rev or "/" in rev:  # git+ssh://git@host/repo has no revision
        raise UsageError(f"--extension {text!r}: a git source needs a revision (git+URL@REV)", SPEC_HINT)
    return SdistSpec(text, "git", url, rev)


def fetch(spec: SdistSpec, dest: Path, python: str, runner: Runner) -> Path:
    """The spec's source as one archive in `dest` (created), checked member by member before anyone unpacks it.
    `python` runs pip (torch importable: a setup.py that imports torch says its metadata only then); `env`
    holds the package's metadata switches."""
    dest.mkdir(parents=True, exist_ok=True)
    if spec.kind == "index":
        archive = download(spec.location, dest, python, runner)
    elif spec.kind == "archive":
        archive = Path(spec.location)
    elif spec.kind == "folder":
        archive = _pack(Path(spec.location), dest)
    else:
        archive = _git_archive(spec, dest, runner)
    check_archive(archive)
    return archive


def _pack(folder: Path, dest: Path) -> Path:
    """A source folder as NAME.tar.gz (members under NAME/), without version control files; entries sorted and
    timeless, so the same folder packs to the same bytes (the recipe pins the archive's sha256)."""
    archive = dest / f"{folder.name}.tar.gz"
    tmp = archive.with_name(archive.name + ".part")

    def clean(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        if "/.git/" in f"/{info.name}/" or info.name.endswith("/.git"):
            return None
        info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
        return info

    with tmp.open("wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz, \
            tarfile.open(fileobj=gz, mode="w") as tar:
        for path in sorted(folder.rglob("*")):
            if path.is_file() or path.is_symlink():
                tar.add(path, arcname=f"{folder.name}/{path.relative_to(folder)}", recursive=False, filter=clean)
    tmp.replace(archive)
    return archive


def _git_archive(spec: SdistSpec, dest: Path, runner: Runner) -> Path:
    """The tree of REV, archived by git itself (tracked files only, no .git)."""
    checkout = dest / "git"
    try:
        if not (checkout / "HEAD").is_file():
            runner.run(Command(("git", "clone", "--quiet", "--bare", "--", spec.location, str(checkout))))
        name = re.sub(r"[^A-Za-z0-9._-]", "_", spec.location.rstrip("/").rsplit("/", 1)[-1].removesuffix(".git"))
        archive = dest / f"{name}-{re.sub(r'[^A-Za-z0-9._-]', '_', spec.rev)}.tar.gz"
        part = archive.with_name(archive.name + ".part")
        runner.run(Command(("git", "--git-dir", str(checkout), "archive", "--format=tar.gz", f"--prefix={name}/",
                            "--output", str(part), spec.rev)))
    except ToolFailedError as exc:
        last = (exc.tail.strip().splitlines() or [""])[-1]
        raise UsageError(f"--extension {spec.text!r}: git cannot archive revision {spec.rev!r} of {spec.location} "
                         f"({last or exc.message})",
                         "check the URL (a repository this machine reaches: a mirror, or git+file:///path) and the "
                         "tag or commit") from exc
    if not runner.dry_run:
        part.replace(archive)
    return archive
