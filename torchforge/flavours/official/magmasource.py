"""What a `--magma-source` is: a local tree, a local tarball or a URL, and for local ones the MAGMA version
read from the source itself (include/magma_types.h), so a recipe never labels a tree with another version.
"""

from __future__ import annotations

import re
import tarfile
from dataclasses import dataclass
from pathlib import Path

from torchforge.errors import UsageError
from torchforge import sourcestate
from torchforge.fileops import path_of_file_url, sha256_file
from torchforge.safeextract import tar_members

VERSION_HEADER = "include/magma_types.h"
_DEFINE = re.compile(r"^\s*#\s*define\s+MAGMA_VERSION_(MAJOR|MINOR|MICRO)\s+(\d+)\s*$", re.MULTILINE)
_TARBALL_SUFFIXES = (".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")


@dataclass(frozen=True)
class MagmaSource:
    kind: str  # "tree", "tarball" (a local file) or "url"
    location: str  # absolute path, or the URL as given
    version: str | None = None  # None for a URL: it is not read before the build
    sha256: str | None = None  # of a local tarball
    state: str | None = None  # of a local tree: its content or git state (sourcestate.identity)

    @property
    def is_local(self) -> bool:
        return self.kind != "url"


def version_from_header(text: str, where: str) -> str:
    found = dict(_DEFINE.findall(text))
    if set(found) != {"MAJOR", "MINOR", "MICRO"}:
        raise UsageError(
            f"{where} does not define MAGMA_VERSION_MAJOR, _MINOR and _MICRO: cannot tell which MAGMA this is",
            "pass a MAGMA source tree or release tarball (it has include/magma_types.h)",
        )
    return f"{int(found['MAJOR'])}.{int(found['MINOR'])}.{int(found['MICRO'])}"


def _tarball_header(path: Path) -> tuple[str, str]:
    """The version header's text, read while every member goes through the extraction rule: the build engine
    unpacks this tarball later, so one that would write outside its folder is refused now."""
    found: tuple[str, str] | None = None
    try:
        for archive, member in tar_members(path):
            parts = member.name.split("/")
            # the header at the root or one folder down (magma-X.Y.Z/include/magma_types.h)
            if found is None and member.isfile() and "/".join(parts[-2:]) == VERSION_HEADER and len(parts) <= 3:
                handle = archive.extractfile(member)
                assert handle is not None
                found = handle.read().decode("utf-8", errors="replace"), f"{path}:{member.name}"
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise UsageError(f"--magma-source {path} is not a readable tarball: {exc}",
                         "pass a MAGMA release tarball (.tar.gz) or an unpacked tree") from exc
    if found is not None:
        return found
    raise UsageError(f"--magma-source {path} has no {VERSION_HEADER}: it is not a MAGMA source tarball",
                     "pass a MAGMA release tarball (magma-X.Y.Z.tar.gz) or an unpacked tree")


def inspect(location: str) -> MagmaSource:
    """Classify `location` and read the version of a local source; a bad local source is a usage error."""
    if "://" in location:
        if location.startswith("file://"):
            local = path_of_file_url(location)
            return inspect(str(local) if local is not None else location[len("file://"):])
        return MagmaSource("url", location)
    path = Path(location).expanduser()
    if path.is_dir():
        header = path / VERSION_HEADER
        if not header.is_file():
            raise UsageError(f"--magma-source {path} has no {VERSION_HEADER}: it is not a MAGMA source tree",
                             "pass the folder that holds MAGMA's CMakeLists.txt, or a release tarball")
        text = header.read_text(encoding="utf-8", errors="replace")
        return MagmaSource("tree", str(path.resolve()), version_from_header(text, str(header)),
                           state=sourcestate.identity(str(path)))
    if path.is_file():
        if not path.name.endswith(_TARBALL_SUFFIXES):
            raise UsageError(f"--magma-source {path} is neither a folder nor a tarball",
                             f"pass a MAGMA tree or a tarball ({', '.join(_TARBALL_SUFFIXES)})")
        text, where = _tarball_header(path)
        return MagmaSource("tarball", str(path.resolve()), version_from_header(text, where), sha256_file(path))
    raise UsageError(f"--magma-source {location} does not exist",
                     "pass a MAGMA source tree, a local release tarball or a URL of one")
