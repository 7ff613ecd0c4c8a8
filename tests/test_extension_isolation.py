"""An extension's own code (its setup.py) never reaches the network nor writes outside its folder (issue 40 item 1):
metadata an sdist states is read without running it; otherwise pip's metadata step and the engine's build run in
a user, network and mount namespace (torchforge/isolation.py).

The hostile sdists are real tar.gz archives of a setup.py project laid out as torch-scatter 2.1.2's sdist is
(PKG-INFO of Metadata-Version 2.1, so pip must run setup.py to learn its requirements): one setup.py opens a TCP
connection itself (no proxy, no urllib) to a socket this test listens on at 127.0.0.1, the other writes a file
outside its folder. Each goes through the CLI as a user types it."""

from __future__ import annotations

import io
import os
import re
import json
import socket
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.pkgfactory import make_package
from tests.test_upload_helpers import cli
from tests.tool_venvs import ensure
from torchforge.extensions.metadata import read_metadata, static_metadata
from torchforge.errors import ToolFailedError
from torchforge.localchannel import index
from torchforge.proc import Runner

SDISTS = Path(__file__).parent / "fixtures" / "sdists"
PKG_INFO = "Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\nSummary: a hostile extension\n"
CONNECTS = """import socket
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=5).sendall(b"setup.py reached the host")
except OSError as exc:
    print("setup.py: no connection:", exc)
"""
WRITES = """import pathlib
try:
    pathlib.Path({outside!r}).write_text("written by setup.py")
except OSError as exc:
    print("setup.py: not written:", exc)
"""
SETUP = """from setuptools import setup
setup(name="{name}", version="1.0", py_modules=["{name}"], install_requires=["packaging"])
"""


def hostile_sdist(folder: Path, name: str, hostile: str) -> Path:
    """NAME-1.0.tar.gz with NAME-1.0/{PKG-INFO, setup.py, setup.cfg, NAME.py}, as setuptools lays out an sdist."""
    archive = folder / f"{name}-1.0.tar.gz"
    files = {"PKG-INFO": PKG_INFO.format(name=name), "setup.py": hostile + SETUP.format(name=name), f"{name}.py": "VALUE = 1\n",
             "setup.cfg": "[egg_info]\ntag_build = \ntag_date = 0\n\n"}
    with tarfile.open(archive, "w:gz") as tar:
        for member, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{name}-1.0/{member}")
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return archive


@pytest.fixture()
def listener() -> Iterator[socket.socket]:
    """A socket on 127.0.0.1 that counts as reached once anything connects (the kernel queues the connection)."""
    with socket.create_server(("127.0.0.1", 0), backlog=8) as server:
        server.setblocking(False)
        yield server


def connected(server: socket.socket) -> bool:
    try:
        accepted, _ = server.accept()
    except BlockingIOError:
        return False
    accepted.close()
    return True


@pytest.fixture()
def channel_env(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """An output channel with one pytorch package (what `--magma-only` builds an extension for), the user cache
    under tmp_path with the suite's torch 2.13.0 venv as its metadata venv."""
    out = tmp_path / "out"
    make_package(out / "linux-64", "pytorch", "2.13.0", "whl_py3.11_cpu_0", depends=["python >=3.11,<3.12.0a0"])
    index(out)
    venvs = tmp_path / "cache" / "torchforge" / "extensions"
    venvs.mkdir(parents=True)
    (venvs / "metadata-torch-2.13.0").symlink_to(ensure("torchcpu").parent)
    return out, {"XDG_CACHE_HOME": str(tmp_path / "cache")}


def test_a_setup_py_that_opens_a_socket_itself_reaches_nothing_during_a_build(
        tmp_path: Path, listener: socket.socket, channel_env: tuple[Path, dict[str, str]]) -> None:
    out, env = channel_env
    port = listener.getsockname()[1]
    sdist = hostile_sdist(tmp_path, "netext", CONNECTS.format(port=port))
    done = cli("build", "--magma-only", "--cuda", "cpu", "--out", str(out), "--extension", str(sdist), env=env)
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "pytorch 2.13.0 whl_py3.11_cpu_0" in done.stderr  # planned for the channel's pytorch, then read
    assert not connected(listener), "the sdist's setup.py reached 127.0.0.1"


def test_a_setup_py_that_writes_outside_its_folder_writes_nothing_during_a_build(
        tmp_path: Path, channel_env: tuple[Path, dict[str, str]]) -> None:
    out, env = channel_env
    outside = tmp_path / "outside" / "written-by-setup-py.txt"
    outside.parent.mkdir()
    sdist = hostile_sdist(tmp_path, "writeext", WRITES.format(outside=str(outside)))
    done = cli("build", "--magma-only", "--cuda", "cpu", "--out", str(out), "--extension", str(sdist), env=env)
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "pytorch 2.13.0 whl_py3.11_cpu_0" in done.stderr
    assert not outside.exists(), "the sdist's setup.py wrote outside its folder"


def test_matrix_of_hostile_sdists_runs_none_of_their_code(tmp_path: Path, listener: socket.socket) -> None:
    outside = tmp_path / "outside.txt"
    connects = hostile_sdist(tmp_path, "netext", CONNECTS.format(port=listener.getsockname()[1]))
    writes = hostile_sdist(tmp_path, "writeext", WRITES.format(outside=str(outside)))
    done = cli("matrix", "--json", "--pytorch", "2.13.0", "--cuda", "cpu", "--py", "3.11", "--flavour", "official",
               "--extension", str(connects), "--extension", str(writes), env={"XDG_CACHE_HOME": str(tmp_path / "c")})
    assert done.returncode == 0, done.stderr[-3000:]
    assert {"netext", "writeext"} <= {row.get("package") for row in json.loads(done.stdout)}
    assert not connected(listener) and not outside.exists()


def test_pip_reads_what_an_sdist_leaves_dynamic_isolated_with_its_scratch_folder_writable(
        tmp_path: Path, listener: socket.socket) -> None:
    """The metadata step itself: pip still reads the requirements setup.py gives (the run is real), in the
    namespaces: the socket is not reached, the file not written, and the report lands in the scratch folder."""
    outside = tmp_path / "outside.txt"
    sdist = hostile_sdist(tmp_path, "both", CONNECTS.format(port=listener.getsockname()[1])
                          + WRITES.format(outside=str(outside)))
    assert static_metadata(sdist) is None  # Metadata-Version 2.1: pip must run it
    meta = read_metadata(sdist, str(ensure("torchcpu") / "python"), Runner(), tmp_path / "scratch")
    assert (meta.name, meta.version, meta.requires) == ("both", "1.0", ("packaging",))
    assert not connected(listener) and not outside.exists()


def test_the_real_sdists_are_read_statically_where_they_state_their_metadata() -> None:
    """mamba-ssm 2.3.2.post1 states it (PKG-INFO 2.4, Requires-Dist not dynamic): nothing of it runs.
    causal-conv1d 1.7.0 marks `Dynamic: requires-dist`, torch-scatter 2.1.2 is Metadata-Version 2.1: pip runs
    them, isolated."""
    mamba = static_metadata(SDISTS / "mamba_ssm-2.3.2.post1.tar.gz")
    assert mamba is not None and (mamba.name, mamba.version) == ("mamba_ssm", "2.3.2.post1")
    assert "tilelang==0.1.8" in mamba.requires and 'pytest; extra == "dev"' in mamba.requires
    assert static_metadata(SDISTS / "causal_conv1d-1.7.0.tar.gz") is None
    assert static_metadata(SDISTS / "torch_scatter-2.1.2.tar.gz") is None


def test_an_extension_build_that_cannot_solve_names_the_missing_specs_and_channels(
        channel_env: tuple[Path, dict[str, str]]) -> None:
    """The channel holds pytorch alone: rattler-build's "Failed to resolve dependencies" now says which specs no
    package matches, and in which channels (issue 40 item 10)."""
    out, env = channel_env
    done = cli("build", "--magma-only", "--cuda", "cpu", "--out", str(out), "--extension",
               str(SDISTS / "torch_scatter-2.1.2.tar.gz"), env=env)
    assert done.returncode == 6, done.stderr[-3000:]
    text = " ".join(done.stderr.split())
    assert "Failed to resolve dependencies: no package in " in text
    # the pytorch the channel holds is not named missing
    assert re.search(re.escape(f"{out.resolve().as_uri()}/ matches python 3.11.*, setuptools, wheel, pip") + "(?!, pytorch)",
                     text)


def test_a_metadata_step_that_fails_says_what_the_setup_py_said(tmp_path: Path) -> None:
    sdist = hostile_sdist(tmp_path, "needscuda", "raise SystemExit('needscuda: set CUDA_HOME to a CUDA toolkit')\n")
    with pytest.raises(ToolFailedError) as caught:
        read_metadata(sdist, str(ensure("torchcpu") / "python"), Runner(), tmp_path / "scratch")
    assert "needscuda-1.0.tar.gz: pip could not read its metadata" in str(caught.value)
    assert "needscuda: set CUDA_HOME to a CUDA toolkit" in str(caught.value)


def test_where_the_code_cannot_be_isolated_it_is_refused_unless_the_user_says_so(
        tmp_path: Path, listener: socket.socket, channel_env: tuple[Path, dict[str, str]]) -> None:
    """A machine without util-linux's `unshare` (here: a PATH without it) cannot isolate: the build is refused
    (exit 5) before the setup.py runs, saying what would work; TORCHFORGE_UNISOLATED=1 runs it after a warning."""
    out, env = channel_env
    tools = tmp_path / "bin"  # every tool of this machine's PATH but unshare
    tools.mkdir()
    for folder in map(Path, os.environ["PATH"].split(os.pathsep)):
        for tool in (folder.iterdir() if folder.is_dir() else ()):
            if tool.name != "unshare" and not (tools / tool.name).exists():
                (tools / tool.name).symlink_to(tool)
    bare = {**env, "PATH": str(tools)}
    sdist = hostile_sdist(tmp_path, "netext", CONNECTS.format(port=listener.getsockname()[1]))
    done = cli("build", "--magma-only", "--cuda", "cpu", "--out", str(out), "--extension", str(sdist), env=bare)
    text = " ".join(done.stderr.split())
    assert done.returncode == 5, done.stderr[-3000:]
    assert "netext-1.0.tar.gz's setup.py (pip reading its metadata) must run isolated" in text
    assert "cannot run `unshare`" in text and "TORCHFORGE_UNISOLATED=1" in text and "Traceback" not in text
    assert not connected(listener)
    scatter = str(SDISTS / "torch_scatter-2.1.2.tar.gz")
    done = cli("build", "--magma-only", "--cuda", "cpu", "--out", str(out), "--extension", scatter,
               env={**bare, "TORCHFORGE_UNISOLATED": "1"})
    text = " ".join(done.stderr.split())
    assert "torch_scatter-2.1.2.tar.gz's setup.py (pip reading its metadata) runs WITHOUT isolation" in text
    assert "Failed to resolve dependencies" in text, text[-1500:]  # it went on to the build (whose solve fails here)
