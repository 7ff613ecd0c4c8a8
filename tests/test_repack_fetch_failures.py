"""`torchforge repack --pytorch`: what pip cannot find is one clear message with its exit code, not pip's raw
output and exit 6; a `--py` no wheel was published for is refused before pip runs; and the line saying where
torch came from names the find-links folder pip actually took it from, not the index (issue 34, item 15).
Offline: pip's configuration is set aside and it reads a find-links folder the test writes and an empty index."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.standin_stack import PY, PYTAG, TORCH, write_wheel
from tests.test_upload_helpers import ROOT, cli_env
from torchforge.errors import ExitCode


@pytest.fixture()
def offline_pip(tmp_path: Path) -> tuple[dict[str, str], str, Path]:
    """pip's environment with its configuration set aside, a find-links folder holding a CPU torch wheel of
    the stand-in release, and an empty local index (so nothing is asked of the network)."""
    links, index = tmp_path / "links", tmp_path / "empty-index"
    links.mkdir()
    index.mkdir()
    files = {"torch/__init__.py": b"", "torch/version.py": f"__version__ = '{TORCH}+cpu'\ncuda = None\n".encode()}
    write_wheel(links, "torch", TORCH, f"{PYTAG}-{PYTAG}-manylinux_2_28_x86_64", files, [])
    env = {k: v for k, v in cli_env().items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_FIND_LINKS=str(links), PIP_DISABLE_PIP_VERSION_CHECK="1")
    return env, index.as_uri(), links


def repack(argv: list[str], env: dict[str, str], tmp_path: Path) -> tuple[int, str]:
    result = subprocess.run([sys.executable, "-m", "torchforge.cli", "repack", *argv, "--out", str(tmp_path / "chan"),
                             "--wheel-dir", str(tmp_path / "wheels")], env=env, cwd=ROOT, capture_output=True,
                            text=True, timeout=600)
    return result.returncode, " ".join((result.stdout + result.stderr).split())


def test_a_release_the_index_does_not_have_is_named_with_the_versions_it_has(
        offline_pip: tuple[dict[str, str], str, Path], tmp_path: Path) -> None:
    env, index, _ = offline_pip
    code, text = repack(["--pytorch", "9.9.9", "--py", PY, "--wheel-index", index], env, tmp_path)
    assert code == ExitCode.USAGE, text
    assert (f"{index} (with the indexes and find-links of pip's own configuration) has no wheel of torch==9.9.9 "
            f"for CPython {PY} on Linux x86-64 (versions there: {TORCH})" in text), text
    assert "what would work: give a --pytorch and --py the index has wheels for" in text
    assert "ERROR:" not in text and "Traceback" not in text
    assert not (tmp_path / "chan").exists()


def test_a_python_the_release_has_no_wheels_for_is_refused_before_pip_runs(
        offline_pip: tuple[dict[str, str], str, Path], tmp_path: Path) -> None:
    env, index, _ = offline_pip
    code, text = repack(["--pytorch", TORCH, "--py", "2.7", "--wheel-index", index], env, tmp_path)
    assert code == ExitCode.REFUSED, text
    assert f"PyTorch {TORCH} has wheels for Python 3." in text and "not 2.7" in text
    assert "fetching" not in text and not (tmp_path / "wheels").exists()
    code, text = repack(["--pytorch", TORCH, "--py", "three", "--wheel-index", index], env, tmp_path)
    assert code == ExitCode.USAGE and "--py three is not a Python X.Y" in text, text


def test_the_origin_named_is_the_find_links_folder_pip_took_torch_from(
        offline_pip: tuple[dict[str, str], str, Path], tmp_path: Path) -> None:
    env, index, links = offline_pip
    code, text = repack(["--pytorch", TORCH, "--py", PY, "--cuda", "12.8", "--wheel-index", index], env, tmp_path)
    assert code == ExitCode.USAGE, text
    assert f"the folder {links} (pip's find-links) served the CPU build of torch, not 12.8" in text
    assert f"torch-{TORCH}-{PYTAG}-{PYTAG}-manylinux_2_28_x86_64.whl: from the folder {links} (pip's find-links)" in text
    assert f"{index} served" not in text
