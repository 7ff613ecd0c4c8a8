"""A full disk is one message and one exit code (10, fileops.translate) wherever torchforge meets it.

The channel lives on a tmpfs just big enough for the package: the copy succeeds and what is written next
(the index, or the verification's prefix) finds the disk full. The tmpfs is mounted in a private user and
mount namespace (`unshare -rm`), so the test needs no privileges and leaves no mount behind.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.pkgfactory import make_package
from tests.test_upload_helpers import ROOT, cli_env
from torchforge.errors import ExitCode

PAGE = 4096
FULL_DISK_HINT = "the disk is full: free space or choose a folder on another disk"


def _upload_onto_small_disk(tmp_path: Path, spare_pages: int) -> subprocess.CompletedProcess[str]:
    package = make_package(tmp_path / "out" / "linux-64", name="hello", payload_bytes=200_000)
    size = -(-package.stat().st_size // PAGE) * PAGE + spare_pages * PAGE
    mount = tmp_path / "disk"
    mount.mkdir()
    argv = [sys.executable, "-m", "torchforge.cli", "upload", "--from", str(tmp_path / "out"),
            "--to", (mount / "chan").as_uri()]
    script = f"mount -t tmpfs -o size={size} tmpfs {shlex.quote(str(mount))} && exec {shlex.join(argv)}"
    return subprocess.run(["unshare", "-rm", "sh", "-c", script], env=cli_env(), cwd=ROOT, capture_output=True,
                          text=True, timeout=300, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize(("spare_pages", "where"), [(1, "/repodata.json"), (2, "/prefix/")])
def test_a_full_disk_during_upload_is_exit_10_with_the_disk_full_hint(spare_pages: int, where: str,
                                                                    tmp_path: Path) -> None:
    done = _upload_onto_small_disk(tmp_path, spare_pages)
    assert "mount" not in done.stderr.split("error:")[0], f"could not mount a tmpfs: {done.stderr}"
    assert done.returncode == ExitCode.FILESYSTEM, done.stderr
    assert "No space left on device" in done.stderr and where in done.stderr, done.stderr
    assert f"what would work: {FULL_DISK_HINT}" in done.stderr
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr


def test_a_full_disk_while_the_package_itself_is_copied_names_it(tmp_path: Path) -> None:
    """The disk fills while the archive is written (a write to an open file, which names no path itself)."""
    done = _upload_onto_small_disk(tmp_path, spare_pages=-20)
    assert "mount" not in done.stderr.split("error:")[0], f"could not mount a tmpfs: {done.stderr}"
    assert done.returncode == ExitCode.FILESYSTEM, done.stderr
    assert "/chan/linux-64/hello-1.0-py3.11_cpu_0.conda: No space left on device" in done.stderr, done.stderr
    assert "cannot use a file" not in done.stderr


@pytest.mark.parametrize("selection", [["--pytorch", "2.5.1", "--flavour", "official"],
                                       ["--pytorch", "2.13.0", "--flavour", "conda-forge"]])
def test_a_full_disk_while_rendering_names_the_recipe_file(selection: list[str], tmp_path: Path) -> None:
    mount = tmp_path / "disk"
    mount.mkdir()
    argv = [sys.executable, "-m", "torchforge.cli", "render", *selection, "--cuda", "cpu", "--py", "3.11",
            "--out", str(mount / "recipes")]
    script = f"mount -t tmpfs -o size={2 * PAGE} tmpfs {shlex.quote(str(mount))} && exec {shlex.join(argv)}"
    done = subprocess.run(["unshare", "-rm", "sh", "-c", script], env=cli_env(), cwd=ROOT, capture_output=True,
                          text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert "mount" not in done.stderr.split("error:")[0], f"could not mount a tmpfs: {done.stderr}"
    assert done.returncode == ExitCode.FILESYSTEM, done.stderr
    named = done.stderr.split("error: cannot use ", 1)[-1].split(": No space left on device")[0]
    assert named.startswith(f"{mount}/recipes/") and "\n" not in named, done.stderr
    assert f"what would work: {FULL_DISK_HINT}" in done.stderr
    assert not (mount / "recipes").exists() or not any((mount / "recipes").iterdir()) or \
        all(p.name.startswith(".torchforge-tmp-") for p in (mount / "recipes").iterdir())
