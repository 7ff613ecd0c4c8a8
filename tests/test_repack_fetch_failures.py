"""`torchforge repack --pytorch`: what pip cannot find is one clear message with its exit code, not pip's raw
output and exit 6; a `--py` no wheel was published for is refused before pip runs; the line saying where
torch came from names the find-links folder pip actually took it from, not the index (issue 34, item 15); a
named --wheel-index is the only place wheels come from (pip's own configuration and PIP_* settings set aside)
and one that does not answer is said to be unreachable, exit 9 (issue 40, item 13).
Offline: pip's configuration is set aside and it reads a find-links folder or a local index the test writes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.standin_stack import PY, PYTAG, TORCH, write_wheel
from tests.test_upload_helpers import ROOT, cli_env
from torchforge.errors import ExitCode


TORCH_FILES = {"torch/__init__.py": b"", "torch/version.py": f"__version__ = '{TORCH}+cpu'\ncuda = None\n".encode()}
TORCH_TAG = f"{PYTAG}-{PYTAG}-manylinux_2_28_x86_64"


@pytest.fixture()
def offline_pip(tmp_path: Path) -> tuple[dict[str, str], str, Path]:
    """pip's environment with its configuration set aside, a find-links folder holding a CPU torch wheel of
    the stand-in release, and an empty local index (so nothing is asked of the network)."""
    links, index = tmp_path / "links", tmp_path / "empty-index"
    links.mkdir()
    index.mkdir()
    write_wheel(links, "torch", TORCH, TORCH_TAG, TORCH_FILES, [])
    env = {k: v for k, v in cli_env().items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_FIND_LINKS=str(links), PIP_DISABLE_PIP_VERSION_CHECK="1")
    return env, index.as_uri(), links


@pytest.fixture()
def torch_index(tmp_path: Path) -> str:
    """A local PEP 503 index (file://, one page per project) serving the CPU torch wheel of the stand-in release."""
    project = tmp_path / "index" / "torch"
    project.mkdir(parents=True)
    wheel = write_wheel(project, "torch", TORCH, TORCH_TAG, TORCH_FILES, [])
    (project / "index.html").write_text(f'<a href="{wheel.name}">{wheel.name}</a>\n')
    return (tmp_path / "index").as_uri()


@pytest.fixture()
def silent_port() -> Iterator[int]:
    """A loopback TCP port bound by this test and never listening: a connection to it is refused, and no other
    process can take it while the test runs."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


def repack(argv: list[str], env: dict[str, str], tmp_path: Path) -> tuple[int, str]:
    result = subprocess.run([sys.executable, "-m", "torchforge.cli", "repack", *argv, "--out", str(tmp_path / "chan"),
                             "--wheel-dir", str(tmp_path / "wheels")], env=env, cwd=ROOT, capture_output=True,
                            text=True, timeout=600)
    return result.returncode, " ".join((result.stdout + result.stderr).split())


def test_a_release_the_index_does_not_have_is_named_with_the_versions_it_has(
        offline_pip: tuple[dict[str, str], str, Path], torch_index: str, tmp_path: Path) -> None:
    env, _, _ = offline_pip
    code, text = repack(["--pytorch", "9.9.9", "--py", PY, "--wheel-index", torch_index], env, tmp_path)
    assert code == ExitCode.USAGE, text
    assert (f"{torch_index} (alone: pip's configuration set aside) has no wheel of torch==9.9.9 "
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
    """Without --wheel-index pip's own configuration applies: here an empty index and a find-links folder."""
    env, index, links = offline_pip
    code, text = repack(["--pytorch", TORCH, "--py", PY, "--cuda", "12.8"], {**env, "PIP_INDEX_URL": index}, tmp_path)
    assert code == ExitCode.USAGE, text
    assert f"the folder {links} (pip's find-links) served the CPU build of torch, not 12.8" in text
    assert f"torch-{TORCH}-{PYTAG}-{PYTAG}-manylinux_2_28_x86_64.whl: from the folder {links} (pip's find-links)" in text
    assert f"{index} served" not in text


def test_a_named_index_is_the_only_place_wheels_come_from(
        offline_pip: tuple[dict[str, str], str, Path], tmp_path: Path) -> None:
    """pip's configuration names a find-links folder that has torch and an extra index: neither takes part
    when --wheel-index names the (empty) index to use."""
    env, index, links = offline_pip
    config = tmp_path / "pip.conf"
    config.write_text(f"[global]\nfind-links = {links}\nextra-index-url = {links.as_uri()}\n")
    env = {**env, "PIP_CONFIG_FILE": str(config), "PIP_EXTRA_INDEX_URL": links.as_uri()}
    code, text = repack(["--pytorch", TORCH, "--py", PY, "--wheel-index", index], env, tmp_path)
    assert code == ExitCode.USAGE, text
    assert (f"{index} (alone: pip's configuration set aside) has no wheel of torch=={TORCH} for CPython {PY} "
            "on Linux x86-64 (versions there: none)" in text), text
    assert "find-links" not in text and not list((tmp_path / "wheels").glob("*.whl"))


@pytest.mark.parametrize("where", ["missing-folder", "silent-port"])
def test_an_index_that_does_not_answer_is_named_unreachable(
        where: str, offline_pip: tuple[dict[str, str], str, Path], silent_port: int, tmp_path: Path) -> None:
    """A file:// index that is no folder, and an http index on a loopback port nobody listens on: exit 9, the
    index and why it did not answer; never pip's configured indexes (which have torch) in its place, nor
    "conflicting dependencies". PIP_RETRIES=1 (passed on to pip) keeps pip's retries short."""
    env, _, links = offline_pip
    index = (tmp_path / "nonexistent").as_uri() if where == "missing-folder" else f"http://127.0.0.1:{silent_port}/simple"
    why = f"{tmp_path / 'nonexistent'} is not a folder" if where == "missing-folder" else "Connection refused"
    code, text = repack(["--pytorch", TORCH, "--py", PY, "--with", "torchvision", "--wheel-index", index],
                        {**env, "PIP_RETRIES": "1"}, tmp_path)
    assert code == ExitCode.PREFLIGHT_FAILED, text
    assert f"the wheel index {index} cannot be reached (" in text and why in text, text
    assert "nothing was fetched" in text and "what would work: check the URL, the network or proxy" in text
    assert "conflicting" not in text and "Traceback" not in text
    assert not (tmp_path / "chan").exists() and not list((tmp_path / "wheels").glob("*.whl"))
