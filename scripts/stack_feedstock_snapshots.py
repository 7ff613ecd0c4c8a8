"""Maintainer tool: refresh the text snapshots of conda-forge/torchvision-feedstock and torchaudio-feedstock that
the stack oracle tests read (the counterpart of scripts/feedstock_snapshots.py for pytorch-cpu-feedstock).

    python scripts/stack_feedstock_snapshots.py torchvision FEEDSTOCK_GIT_DIR
    python scripts/stack_feedstock_snapshots.py torchaudio FEEDSTOCK_GIT_DIR

Which commits: for each release the feedstock's recipe/recipe.yaml built, the newest commit (in the history of
HEAD) at which it builds that release against the pytorch torchforge/data/stack_pairing.toml pairs it with, else
(the feedstock never did) the newest commit building it. tests/data/stack_feedstock/PACKAGE/
RELEASES.toml records, per release, that commit, its date and the pytorch pin of its linux-64 CPU jobs (the
`pytorch:` key of the .ci_support files; the feedstock builds against that pytorch). Each commit's folder
receives recipe/ whole (recipe.yaml, the build scripts and the patches, all small) and the linux and win
.ci_support job files of every Python (each Python's job pins its own python: `3.12.* *_cpython`, `3.13.* *_cp313`,
and the companion recipes take that pin). A release built only by meta.yaml (before the feedstock moved to recipe.yaml) is not
taken: the oracle renders recipe.yaml. Folders are written beside their final place and moved in whole, so an
interrupted run leaves the old snapshot or the new one, never half; folders of commits no longer named go.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

from feedstock_git import copy_files, git, not_a_git_dir, remove_stale, replace_file, replace_folder, show

ROOT = Path(__file__).resolve().parent.parent
SNAPSHOTS = ROOT / "tests" / "data" / "stack_feedstock"
PACKAGES = ("torchvision", "torchaudio")
PAIRING = ROOT / "torchforge" / "data" / "stack_pairing.toml"
CI_PREFIXES = (".ci_support/linux_", ".ci_support/win_")
VERSION = re.compile(r'^\s*version:\s*"?([0-9][0-9.]*)"?\s*$', re.MULTILINE)
PYTORCH_PIN = re.compile(r"^pytorch:\n- '?([0-9.]+)'?", re.MULTILINE)


def text(git_dir: Path, commit: str, path: str) -> str | None:
    blob = show(git_dir, commit, path)
    return blob.decode() if blob is not None else None


def pytorch_pin(git_dir: Path, commit: str) -> str | None:
    names = git(git_dir, "ls-tree", "--name-only", commit, ".ci_support/").decode().split()
    cpu = sorted(n for n in names if n.startswith(".ci_support/linux_64_") and "versionNone" in n)
    job = text(git_dir, commit, cpu[0]) if cpu else None
    match = PYTORCH_PIN.search(job or "")
    return match.group(1) if match else None


def paired_pytorch(package: str) -> dict[str, str]:
    """release -> the pytorch X.Y that torchforge/data/stack_pairing.toml pairs it with."""
    rows = tomllib.loads(PAIRING.read_text(encoding="utf-8"))[package]
    return {row["version"]: row["pytorch"] for row in rows if row["found"]}


def releases(git_dir: Path, package: str) -> dict[str, tuple[str, str, str | None]]:
    """release -> (commit, date, pytorch pin): the newest commit whose recipe.yaml builds the release against
    the pytorch the pairing table gives it, else (the feedstock never did) the newest commit building it."""
    newest: dict[str, tuple[str, str, str | None]] = {}
    paired: dict[str, tuple[str, str, str | None]] = {}
    wanted = paired_pytorch(package)
    log = git(git_dir, "log", "--format=%H %ad", "--date=short", "HEAD", "--", "recipe", ".ci_support").decode()
    for line in log.splitlines():
        commit, date = line.split()
        match = VERSION.search(text(git_dir, commit, "recipe/recipe.yaml") or "")
        if not match:
            continue
        version, pin = match.group(1), pytorch_pin(git_dir, commit)
        newest.setdefault(version, (commit, date, pin))
        if pin is not None and pin == wanted.get(version):
            paired.setdefault(version, (commit, date, pin))
    return {version: paired.get(version, first) for version, first in newest.items()}


def kept(path: str) -> bool:
    """recipe/ whole; of .ci_support/, the linux and win jobs (every Python's)."""
    return not path.startswith(".ci_support/") or (path.startswith(CI_PREFIXES) and path.endswith(".yaml"))


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in PACKAGES:
        print(__doc__)
        return 2
    package, git_dir = argv[0], Path(argv[1])
    if message := not_a_git_dir(git_dir, f"{package}-feedstock"):
        print(message, file=sys.stderr)
        return 2
    folder = SNAPSHOTS / package
    folder.mkdir(parents=True, exist_ok=True)
    table = releases(git_dir, package)
    for commit, _, _ in table.values():
        replace_folder(folder, commit, lambda target, c=commit: copy_files(git_dir, c, target, kept) and None)
    lines = [f"# conda-forge/{package}-feedstock: per release, the newest commit building it, its date and the",
             "# pytorch pin of its linux-64 CPU jobs (scripts/stack_feedstock_snapshots.py; do not edit)."]
    lines += [f'"{version}" = {{ commit = "{commit}", date = "{date}", pytorch = "{pin}" }}'
              for version, (commit, date, pin) in table.items()]
    replace_file(folder / "RELEASES.toml", "\n".join(lines) + "\n")
    commits = {commit for commit, _, _ in table.values()}
    remove_stale(folder, commits)
    print(f"{len(commits)} snapshots in {folder.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
