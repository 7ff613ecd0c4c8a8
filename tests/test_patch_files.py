"""A `--patch` / `--magma-patch` file that changes nothing is refused before anything is planned or written
(issue 34 item 7): exit 2 in both flavours, naming the file and what would work. Real patches (made here by
`diff -u`, `diff -c` and `git diff --binary`) are taken."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from torchforge.cli import main
from torchforge.patchfile import has_hunks

SELECTIONS = {
    "official": ["--pytorch", "2.9.0", "--flavour", "official", "--cuda", "cpu", "--py", "3.11"],
    "conda-forge": ["--pytorch", "2.13.0", "--flavour", "conda-forge", "--cuda", "cpu", "--py", "3.11"],
}
NOT_PATCHES = {
    "a note": b"remember to fix setup.py\n",
    "empty": b"",
    "headers only": b"--- a/setup.py\n+++ b/setup.py\n",
    "an image": bytes(range(256)) * 4,
}


def _diff(tmp_path: Path, style: str) -> Path:
    old, new = tmp_path / "a" / "setup.py", tmp_path / "b" / "setup.py"
    old.parent.mkdir(exist_ok=True)
    new.parent.mkdir(exist_ok=True)
    old.write_text("import os\nprint('old')\n")
    new.write_text("import os\nprint('new')\n")
    made = subprocess.run(["diff", style, "a/setup.py", "b/setup.py"], cwd=tmp_path, capture_output=True)
    assert made.returncode == 1 and made.stdout  # diff's "files differ"
    patch = tmp_path / f"fix{style}.patch"
    patch.write_bytes(made.stdout)
    return patch


@pytest.mark.parametrize("flavour", SELECTIONS)
@pytest.mark.parametrize("kind", NOT_PATCHES)
@pytest.mark.parametrize("command", ["render", "build"])
def test_a_file_with_no_hunk_is_refused_before_anything_is_written(
        flavour: str, kind: str, command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    patch = tmp_path / "fix.patch"
    patch.write_bytes(NOT_PATCHES[kind])
    out = tmp_path / "out"
    extra = ["--skip-preflight"] if command == "build" else []
    assert main([command, *SELECTIONS[flavour], "--patch", str(patch), "--out", str(out), *extra]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"--patch {patch} is not a patch" in err and "what would work: give a unified diff" in err, err
    assert "flavour" not in err.split("error:")[0]  # refused before the flavour line, the plan or the build
    assert not out.exists()


def test_a_magma_patch_with_no_hunk_is_refused_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    patch = tmp_path / "magma.patch"
    patch.write_bytes(NOT_PATCHES["headers only"])
    assert main(["render", "--pytorch", "2.5.1", "--cuda", "12.4", "--py", "3.12", "--magma-patch", str(patch),
                 "--out", str(tmp_path / "out")]) == 2
    assert f"--magma-patch {patch} is not a patch" in " ".join(capsys.readouterr().err.split())
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("flavour", SELECTIONS)
@pytest.mark.parametrize("style", ["-u", "-c"])
def test_unified_and_context_diffs_are_taken(flavour: str, style: str, tmp_path: Path) -> None:
    patch = _diff(tmp_path, style)
    out = tmp_path / "out"
    assert main(["render", *SELECTIONS[flavour], "--patch", str(patch), "--out", str(out)]) == 0
    assert [p.read_bytes() for p in out.glob(f"*/{patch.name}")] == [patch.read_bytes()]


@pytest.mark.skipif(shutil.which("git") is None, reason="git makes the binary patch")
def test_a_git_binary_patch_counts_as_a_change(tmp_path: Path) -> None:
    def git(*args: str) -> bytes:
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path,
                              check=True, capture_output=True).stdout

    git("init", "-q")
    (tmp_path / "blob.bin").write_bytes(bytes(range(256)))
    git("add", "blob.bin")
    git("commit", "-qm", "one")
    (tmp_path / "blob.bin").write_bytes(bytes(reversed(range(256))))
    binary = git("diff", "--binary")
    assert b"GIT binary patch" in binary and b"@@" not in binary
    assert has_hunks(binary) and not has_hunks(binary.split(b"GIT binary patch")[0])
