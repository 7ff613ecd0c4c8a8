"""The source a recipe builds (`Source`: a git URL at a tag, a local folder or a tarball, from `--source`), and what
a local `--source` holds, as one identity string: the same content gives the same identity however the
path is spelled, and an edit gives another one, so a package built from the tree is reused only for that tree.

- a folder of a git work tree: the tree object of the folder at HEAD, plus a digest of its uncommitted changes
  (`git diff HEAD`, including staged changes and submodules, and the untracked files git does not ignore);
- any other folder: a digest of every file's relative path, mode and content (symlinks by their target);
- a local file (a tarball): its sha256;
- anything else (a URL or a git mirror, fetched at the release tag): its spelling.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from torchforge.fileops import sha256_file
from torchforge.errors import ToolMissingError
from torchforge.proc import Command, Runner


@dataclass(frozen=True)
class Source:
    kind: str  # "git", "path" or "url"
    location: str
    rev: str | None = None
    sha256: str | None = None
    patches: tuple[str, ...] = ()


def resolve_source(location: str | None, default_url: str, tag: str) -> Source:
    """--source: a local checkout (path), a tarball (url) or a git mirror; default: upstream git at the tag."""
    if location is None:
        return Source("git", default_url, tag)
    if os.path.isdir(location):
        return Source("path", str(Path(location).resolve()))
    if location.endswith((".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".zip")):
        return Source("url", location)
    return Source("git", location, tag)


def identity(location: str) -> str:
    """The identity string of a `--source` / `--magma-source` (see the module's docstring)."""
    path = Path(location).expanduser()
    if path.is_dir():
        return _git_state(path) or f"sha256:{folder_digest(path)}"
    if path.is_file():
        return f"sha256:{sha256_file(path)}"
    return location


def describe(identity_: str) -> str:
    """A short human form for messages: `git tree 1a2b3c4d5e6f + uncommitted changes 0f1e2d3c`."""
    if identity_.startswith("git-tree:"):
        tree, _, changes = identity_.removeprefix("git-tree:").partition("+changes:")
        return f"git tree {tree[:12]}" + (f" + uncommitted changes {changes[:8]}" if changes else "")
    if identity_.startswith("sha256:"):
        return f"sha256:{identity_.removeprefix('sha256:')[:12]}"
    return identity_


def _git(path: Path, *argv: str) -> tuple[int, str]:
    # -c core.quotepath=off: paths as bytes-to-text, not octal escapes; no pager, no ext diff, no colour.
    result = Runner().run(Command(("git", "-C", str(path), "-c", "core.quotepath=off", *argv),
                                  env={"GIT_PAGER": "cat", "GIT_OPTIONAL_LOCKS": "0"}), check=False)
    return result.returncode, result.output


def _git_state(path: Path) -> str | None:
    """`git-tree:<tree of the folder at HEAD>[+changes:<digest>]`, or None when the folder is not a tracked part of
    a git work tree with a commit (no git, no repository, no HEAD yet, or a folder the repository ignores)."""
    try:
        code, prefix = _git(path, "rev-parse", "--show-prefix")
    except ToolMissingError:  # git is not installed: the folder's content is its identity
        return None
    if code != 0:
        return None
    prefix = prefix.strip()
    code, tree = _git(path, "rev-parse", "--verify", "--quiet", f"HEAD:{prefix}")
    if code != 0 or len(tree.strip()) not in (40, 64):  # a SHA-1 or SHA-256 object id
        return None  # no commit yet, or the folder has nothing committed (ignored or untracked as a whole)
    changes = hashlib.sha256()
    code, diff = _git(path, "diff", "HEAD", "--binary", "--no-ext-diff", "--no-color", "--submodule=diff",
                      "--relative", "--", ".")
    if code != 0:
        return None
    changes.update(diff.encode())
    code, untracked = _git(path, "ls-files", "-z", "--others", "--exclude-standard", "--", ".")
    if code != 0:
        return None
    for relative in sorted(name for name in untracked.split("\0") if name):
        _add_entry(changes, path, relative)
    dirty = bool(diff) or bool(untracked.strip("\0"))
    return f"git-tree:{tree.strip()}" + (f"+changes:{changes.hexdigest()}" if dirty else "")


def folder_digest(root: Path) -> str:
    digest = hashlib.sha256()
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        base = Path(folder)
        for name in sorted(files + [d for d in dirs if (base / d).is_symlink()]):
            _add_entry(digest, root, str((base / name).relative_to(root)))
    return digest.hexdigest()


def _add_entry(digest: hashlib._Hash, root: Path, relative: str) -> None:
    path = root / relative
    info = path.lstat()
    digest.update(relative.encode("utf-8", "surrogateescape") + b"\0")
    if stat.S_ISLNK(info.st_mode):
        digest.update(b"link\0" + os.readlink(path).encode("utf-8", "surrogateescape") + b"\0")
    elif stat.S_ISREG(info.st_mode):
        digest.update(b"x\0" if info.st_mode & 0o111 else b"f\0")
        digest.update(sha256_file(path).encode() + b"\0")
