"""Maintainer tool: refresh the text snapshots of conda-forge/pytorch-cpu-feedstock that the oracle tests read.

    python scripts/feedstock_snapshots.py FEEDSTOCK_GIT_DIR

For each release commit named in torchforge/data/conda_forge.toml (and each of its earlier_builds),
tests/data/feedstock/COMMIT/ receives the feedstock's own files at that commit that rendering and the facts need:
recipe/ (less its README, the patches and the vendored third_party licence) and the linux and win .ci_support job
files. The patches are large and only their checksums matter to the table, so recipe/SHA256SUMS lists the sha256 of
every file under recipe/ that is left out. BRANCHES.toml records the tip and version of each release branch
(vX.Y.x), against which tests/test_feedstock_oracle.py checks the table's rule "the tip of the release branch".
Folders of commits the table no longer names are removed. Each commit's folder is written beside its final place
and moved in whole, so an interrupted run leaves the old snapshot or the new one, never half.
FEEDSTOCK_GIT_DIR: a clone of github.com/conda-forge/pytorch-cpu-feedstock (a bare one will do).
"""

from __future__ import annotations

import hashlib
import re
import sys
import tomllib
from pathlib import Path

from feedstock_git import copy_files, git, not_a_git_dir, remove_stale, replace_file, replace_folder

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "torchforge" / "data" / "conda_forge.toml"
SNAPSHOTS = ROOT / "tests" / "data" / "feedstock"
# Left out of recipe/: documentation, the patches (checksums kept) and a licence of vendored code.
LEFT_OUT = ("recipe/README.md", "recipe/patches/", "recipe/patches_submodules/", "recipe/third_party/")
# The jobs torchforge reads: linux and win. osx jobs and the migrators' files are not read.
CI_PREFIXES = (".ci_support/linux_", ".ci_support/win_")
SUMS = "recipe/SHA256SUMS"


def kept(path: str) -> bool:
    if path.startswith(".ci_support/"):
        return path.startswith(CI_PREFIXES) and path.endswith(".yaml")
    return not path.startswith(LEFT_OUT)


def snapshot(git_dir: Path, commit: str, target: Path) -> None:
    """Write one commit's snapshot to `target` (a fresh folder): the kept files, and the checksums of the rest."""
    left_out = copy_files(git_dir, commit, target, kept)
    sums = [f"{hashlib.sha256(blob).hexdigest()}  {path}" for path, blob in left_out.items()]
    (target / SUMS).write_text("\n".join(sorted(sums, key=lambda line: line.split("  ", 1)[1])) + "\n")


def branch_tips(git_dir: Path) -> str:
    """BRANCHES.toml: each release branch's tip and the version its recipe builds there."""
    refs = git(git_dir, "for-each-ref", "--format=%(refname:short) %(objectname)", "refs/heads/v*").decode()
    lines = ["# The feedstock's release branches: their tips and the version each builds (scripts/feedstock_snapshots.py)."]
    for branch, commit in sorted(line.split() for line in refs.splitlines()):
        meta = git(git_dir, "show", f"{commit}:recipe/meta.yaml").decode()
        version = re.search(r'set version = "([^"]+)"', meta)
        if version:
            lines.append(f'"{branch}" = {{ commit = "{commit}", version = "{version.group(1)}" }}')
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0].startswith("-"):
        print(__doc__)
        return 2
    git_dir = Path(argv[0])
    if message := not_a_git_dir(git_dir, "pytorch-cpu-feedstock"):
        print(message, file=sys.stderr)
        return 2
    releases = tomllib.loads(TABLE.read_text(encoding="utf-8"))["releases"].values()
    commits = {c for r in releases for c in (r["commit"], *r.get("earlier_builds", ()))}
    SNAPSHOTS.mkdir(parents=True, exist_ok=True)
    for commit in sorted(commits):
        replace_folder(SNAPSHOTS, commit, lambda target, c=commit: snapshot(git_dir, c, target))
    replace_file(SNAPSHOTS / "BRANCHES.toml", branch_tips(git_dir))
    remove_stale(SNAPSHOTS, commits)
    print(f"{len(commits)} snapshots in {SNAPSHOTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
