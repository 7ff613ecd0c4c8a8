"""What the feedstock snapshot scripts (feedstock_snapshots.py, stack_feedstock_snapshots.py) share: reading a
feedstock's git directory, and writing snapshot folders and files so that an interrupted run leaves the old
snapshot or the new one, never half of one."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path


def git(git_dir: Path, *args: str) -> bytes:
    return subprocess.run(["git", "--git-dir", str(git_dir), *args], capture_output=True, check=True).stdout


def show(git_dir: Path, commit: str, path: str) -> bytes | None:
    """The file at `path` in `commit`; None where the commit has no such file."""
    done = subprocess.run(["git", "--git-dir", str(git_dir), "show", f"{commit}:{path}"], capture_output=True)
    return done.stdout if done.returncode == 0 else None


def not_a_git_dir(git_dir: Path, feedstock: str) -> str | None:
    """The message for a path that is not a git directory (None when it is one)."""
    if subprocess.run(["git", "--git-dir", str(git_dir), "rev-parse", "--git-dir"], capture_output=True).returncode:
        return (f"{git_dir} is not a git directory: give a clone of conda-forge/{feedstock} (a bare one will do, "
                "or the .git folder of a checkout)")
    return None


def copy_files(git_dir: Path, commit: str, target: Path, kept: Callable[[str], bool]) -> dict[str, bytes]:
    """Write the files of recipe/ and .ci_support/ at `commit` that `kept` accepts under `target`; returns the
    others of recipe/ (path -> content), for whoever wants their checksums."""
    paths = git(git_dir, "ls-tree", "-r", "--name-only", commit, "recipe", ".ci_support").decode().split("\n")
    left_out = {}
    for path in filter(None, paths):
        if kept(path):
            (target / path).parent.mkdir(parents=True, exist_ok=True)
            (target / path).write_bytes(git(git_dir, "show", f"{commit}:{path}"))
        elif path.startswith("recipe/"):
            left_out[path] = git(git_dir, "show", f"{commit}:{path}")
    return left_out


def replace_folder(folder: Path, name: str, fill: Callable[[Path], None]) -> None:
    """folder/name filled by `fill` beside its final place, then moved in whole."""
    partial, old, final = folder / f".{name}.partial", folder / f".{name}.old", folder / name
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    fill(partial)
    if final.exists():
        final.rename(old)
    partial.rename(final)
    shutil.rmtree(old, ignore_errors=True)


def replace_file(path: Path, text: str) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    partial.replace(path)


def remove_stale(folder: Path, named: Iterable[str]) -> None:
    """Remove the snapshot folders of commits no longer named."""
    keep = set(named)
    for stale in (p for p in folder.iterdir() if p.is_dir() and p.name not in keep):
        shutil.rmtree(stale)
