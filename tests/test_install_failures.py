"""`torchforge install` never aborts and never leaves a half-made prefix: a channel whose package would write
outside the prefix (a real .conda and .tar.bz2 with `../../x` or an absolute path, indexed), a py-rattler that
panics in its child, a real Ctrl-C or SIGKILL mid-install (the rerun finishes), and each user or environment
error with its own exit code and what would work (issue 34, items 3, 9 and 12)."""

from __future__ import annotations

import functools
import hashlib
import http.server
import io
import json
import os
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.pkgfactory import make_package
from torchforge import localchannel
from torchforge.errors import ExitCode
from torchforge.pausepoint import PAUSE_VARIABLE
from torchforge.prefix import IN_PROGRESS

CLI = [sys.executable, "-m", "torchforge.cli"]


def forge(*argv: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *argv], capture_output=True, text=True, env={**os.environ, **(env or {})}, cwd=cwd,
                          timeout=300)


def _tar(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def make_escaping_package(subdir_dir: Path, path: str, fmt: str) -> Path:
    """A real conda package `escape-1.0-py3.11_cpu_0` whose one file is at `path` (`../../x`, `/abs/x`), in
    its payload and its info/paths.json, as a hostile channel would hold it."""
    from backports import zstd

    payload = b"written outside the prefix\n"
    index = {"name": "escape", "version": "1.0", "build": "py3.11_cpu_0", "build_number": 0, "depends": [],
             "license": "BSD-3-Clause", "subdir": "linux-64", "platform": "linux", "arch": "x86_64",
             "timestamp": int(time.time() * 1000)}
    paths = {"paths": [{"_path": path, "path_type": "hardlink", "sha256": hashlib.sha256(payload).hexdigest(),
                        "size_in_bytes": len(payload)}], "paths_version": 1}
    info = {"info/index.json": json.dumps(index).encode(), "info/paths.json": json.dumps(paths).encode(),
            "info/files": f"{path}\n".encode()}
    stem = "escape-1.0-py3.11_cpu_0"
    subdir_dir.mkdir(parents=True, exist_ok=True)
    if fmt == ".tar.bz2":
        import bz2

        target = subdir_dir / f"{stem}.tar.bz2"
        target.write_bytes(bz2.compress(_tar({**info, path: payload})))
        return target
    target = subdir_dir / f"{stem}.conda"
    with zipfile.ZipFile(target, "w") as zf:
        zf.writestr("metadata.json", json.dumps({"conda_pkg_format_version": 2}))
        zf.writestr(f"pkg-{stem}.tar.zst", zstd.compress(_tar({path: payload})))
        zf.writestr(f"info-{stem}.tar.zst", zstd.compress(_tar(info)))
    return target


def hostile_channel(root: Path, path: str, fmt: str) -> Path:
    channel = root / "hostile"
    make_escaping_package(channel / "linux-64", path, fmt)
    localchannel.index(channel)
    return channel


@pytest.fixture()
def served() -> Iterator[tuple[str, Path]]:
    """An HTTP server on 127.0.0.1 serving a folder (a remote channel, or nothing: 404)."""
    with tempfile.TemporaryDirectory(prefix="served-") as tmp:
        folder = Path(tmp)
        handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
        handler.log_message = lambda *args: None  # type: ignore[method-assign]
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}", folder
        finally:
            server.shutdown()
            server.server_close()


@pytest.mark.parametrize("path", ["../../x", "lib/../../../x", "ABSOLUTE"])
def test_a_local_channel_whose_package_writes_outside_the_prefix_is_refused_and_nothing_is_written(
        path: str, tmp_path: Path) -> None:
    outside = tmp_path / "abs_x"
    path = str(outside) if path == "ABSOLUTE" else path
    channel = hostile_channel(tmp_path, path, ".conda")
    prefix = tmp_path / "deep" / "p" / "env"
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    result = forge("install", "escape", "--channel", str(channel), "--prefix", str(prefix))
    text = " ".join(result.stderr.split())
    assert result.returncode == ExitCode.USAGE, text
    assert f"would write '{path}', outside the prefix; nothing was installed" in text
    assert "panicked" not in result.stderr and "Traceback" not in result.stderr
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before  # not even deep/
    assert not (tmp_path / "x").exists() and not outside.exists()


def install_from_served(served: tuple[str, Path], path: str, fmt: str, tmp_path: Path
                        ) -> tuple[str, Path, subprocess.CompletedProcess[str], str]:
    """`install` from a hostile channel served over HTTP: its URL, the prefix, the result, its stderr as one line."""
    url, folder = served
    hostile_channel(folder, path, fmt)
    prefix = tmp_path / "env"
    result = forge("install", "escape", "--channel", f"{url}/hostile", "--prefix", str(prefix))
    return url, prefix, result, " ".join(result.stderr.split())


def test_a_remote_conda_whose_package_writes_outside_the_prefix_is_refused_before_it_is_linked(
        tmp_path: Path, served: tuple[str, Path]) -> None:
    """A remote .conda's info/paths.json is read alone before the install, as a local one is."""
    url, prefix, result, text = install_from_served(served, "../../x", ".conda", tmp_path)
    assert result.returncode == ExitCode.USAGE, text
    assert f"{url}/hostile/linux-64/escape-1.0-py3.11_cpu_0.conda would write '../../x', outside the prefix" in text
    assert not prefix.exists() and not (tmp_path / "x").exists()


def test_a_sound_remote_conda_passes_the_check_and_installs(tmp_path: Path, served: tuple[str, Path]) -> None:
    """The check reads info/paths.json over HTTP (a server without range requests included) and lets it by."""
    url, folder = served
    make_package(folder / "sound" / "linux-64", name="sound", version="1.0", build="py3.11_cpu_0")
    localchannel.index(folder / "sound")
    prefix = tmp_path / "env"
    result = forge("install", "sound", "--channel", f"{url}/sound", "--prefix", str(prefix))
    assert result.returncode == 0, result.stderr
    assert (prefix / "share" / "sound" / "hello.txt").read_text() == "hello from sound 1.0\n"


def test_a_py_rattler_panic_in_the_child_is_a_clear_error_without_a_backtrace_and_no_prefix(
        tmp_path: Path, served: tuple[str, Path]) -> None:
    """A remote .tar.bz2 is not read before the install (it would be downloaded twice): py-rattler panics on its
    absolute path. The panic ends the child, not torchforge: exit 6 with the panic's message."""
    _, prefix, result, text = install_from_served(served, "/tmp/torchforge-escaped-x", ".tar.bz2", tmp_path)
    assert result.returncode == ExitCode.BUILD_FAILED, text
    # py-rattler aborts the child, or catches its own panic and fails: one message either way.
    assert "it panicked: All inserted paths must be relative" in text
    assert "stack backtrace" not in result.stderr and "Traceback" not in result.stderr
    assert not prefix.exists() and not Path("/tmp/torchforge-escaped-x").exists()


@pytest.fixture(scope="module")
def bulky_channel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A package with thousands of files: its install takes long enough to be interrupted in the middle."""
    channel = tmp_path_factory.mktemp("bulky") / "channel"
    make_package(channel / "linux-64", name="bulky", version="1.0", build="py3.11_cpu_0", extra_files=8000)
    localchannel.index(channel)
    return channel


@pytest.fixture(scope="module")
def held_channel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A package of a few files: a held install needs no size to be caught in the middle."""
    channel = tmp_path_factory.mktemp("held") / "channel"
    make_package(channel / "linux-64", name="bulky", version="1.0", build="py3.11_cpu_0", extra_files=HELD_FILES)
    localchannel.index(channel)
    return channel


HELD_FILES = 50


def paused_install(channel: Path, prefix: Path, step: str, hold: Path) -> subprocess.Popen[str]:
    """`torchforge install bulky` held at `step` (torchforge.pausepoint): returns once it waits there. As a
    terminal's foreground job: a test run in the background has SIGINT ignored, which the child inherits."""
    hold.mkdir(exist_ok=True)
    proc = subprocess.Popen([*CLI, "install", "bulky", "--channel", str(channel), "--prefix", str(prefix)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, PAUSE_VARIABLE: f"{step}:{hold}"},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while not (hold / f"{step}.reached").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    if not (hold / f"{step}.reached").exists():
        proc.kill()
        _, stderr = proc.communicate()
        pytest.fail(f"the install never reached {step} (exit {proc.returncode}): {stderr}")
    return proc


@pytest.mark.parametrize(("sig", "group"), [(signal.SIGINT, True), (signal.SIGKILL, False)], ids=["ctrl-c", "sigkill"])
def test_an_install_interrupted_mid_way_is_finished_by_the_rerun(sig: signal.Signals, group: bool,
                                                                 held_channel: Path, tmp_path: Path) -> None:
    """Interrupted with its 8000 files linked and its marker still there (held at install-linked)."""
    prefix = tmp_path / "env"
    proc = paused_install(held_channel, prefix, "install-linked", tmp_path / "hold")
    assert len(list((prefix / "share" / "bulky").rglob("f*.txt"))) == HELD_FILES and (prefix / IN_PROGRESS).is_file()
    # Ctrl-C reaches the whole foreground process group; `kill -9 PID` only the command.
    os.killpg(proc.pid, sig) if group else os.kill(proc.pid, sig)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == (ExitCode.INTERRUPTED if sig == signal.SIGINT else -signal.SIGKILL), stderr
    if sig == signal.SIGINT:
        assert "rerun the same command to resume" in stderr
    # Ctrl-C: the command removes what it made. SIGKILL: nothing can; the marker tells the rerun.
    assert prefix.exists() == (sig == signal.SIGKILL)
    rerun = forge("install", "bulky", "--channel", str(held_channel), "--prefix", str(prefix))
    assert rerun.returncode == 0, rerun.stderr
    resumed = "is what an interrupted install left: removing it and installing again" in rerun.stderr
    assert resumed == (sig == signal.SIGKILL), rerun.stderr
    assert "bulky-1.0-py3.11_cpu_0" in rerun.stdout
    assert len(list((prefix / "share" / "bulky").rglob("f*.txt"))) == HELD_FILES
    assert sorted(p.name for p in prefix.iterdir()) == ["CACHEDIR.TAG", "conda-meta", "share"]  # no marker left
    again = forge("install", "bulky", "--channel", str(held_channel), "--prefix", str(prefix))
    assert again.returncode == ExitCode.USAGE and "is not an empty folder" in again.stderr  # a finished one is kept


def test_a_second_install_into_a_prefix_being_installed_is_refused_and_the_first_finishes(
        held_channel: Path, tmp_path: Path) -> None:
    """The rerun removes a prefix an install left, never one an install is still writing: the first is held
    with its lock and marker taken (install-claimed) while the second runs, then released."""
    prefix, hold = tmp_path / "env", tmp_path / "hold"
    first = paused_install(held_channel, prefix, "install-claimed", hold)
    try:
        second = forge("install", "bulky", "--channel", str(held_channel), "--prefix", str(prefix))
    finally:
        (hold / "install-claimed.release").touch()
    out, err = first.communicate(timeout=300)
    text = " ".join(second.stderr.split())
    assert second.returncode == ExitCode.USAGE, text
    assert f"another torchforge install is writing {prefix}" in text and "removing it" not in text
    assert first.returncode == 0, err
    assert len(list((prefix / "share" / "bulky").rglob("f*.txt"))) == HELD_FILES
    assert sorted(p.name for p in prefix.iterdir()) == ["CACHEDIR.TAG", "conda-meta", "share"]


def read_only_mounted(folder: Path, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """`torchforge ARGV` with a read-only tmpfs mounted on `folder`, in a user and mount namespace of its own
    (`unshare -Urm`: no privilege needed, and the mount ends with the command)."""
    script = 'mount -t tmpfs -o ro,size=1m tmpfs "$1" && shift && exec "$@"'
    return subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script, "sh", str(folder),
                           *CLI, *argv], capture_output=True, text=True, timeout=300)


def _closed_port_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}/conda"


@pytest.mark.parametrize(("case", "code", "words"), [
    ("bad-spec", ExitCode.USAGE, "'bulky >=>1': not a package spec"),
    ("channel-404", ExitCode.USAGE, "a channel could not be read"),
    ("channel-unreachable", ExitCode.USAGE, "a channel could not be read"),
    ("glibc-override", ExitCode.USAGE, "CONDA_OVERRIDE_GLIBC='abc' is not a version"),
    ("cuda-override", ExitCode.USAGE, "CONDA_OVERRIDE_CUDA='abc' is not a version"),
    ("read-only-prefix", ExitCode.FILESYSTEM, "Read-only file system"),
])
def test_install_errors_of_the_user_or_the_machine_have_their_own_exit_code(
        case: str, code: ExitCode, words: str, bulky_channel: Path, tmp_path: Path,
        served: tuple[str, Path]) -> None:
    prefix, channel, spec, env = tmp_path / "env", str(bulky_channel), "bulky", {}
    if case == "bad-spec":
        spec = "bulky >=>1"
    elif case == "channel-404":
        channel = f"{served[0]}/no-such-channel"
    elif case == "channel-unreachable":
        channel = _closed_port_url()
    elif case.endswith("-override"):
        env = {f"CONDA_OVERRIDE_{case.split('-')[0].upper()}": "abc"}
    elif case == "read-only-prefix":
        prefix.mkdir()
    argv = ["install", spec, "--channel", channel, "--prefix", str(prefix)]
    result = forge(*argv, env=env) if case != "read-only-prefix" else read_only_mounted(prefix, argv)
    text = " ".join(result.stderr.split())
    assert result.returncode == code, text
    assert words in text and "what would work" in text
    assert "internal error" not in text and "Traceback" not in text
    assert case == "read-only-prefix" or not prefix.exists()


def test_a_dotted_build_string_in_the_spec_is_accepted(bulky_channel: Path, tmp_path: Path) -> None:
    result = forge("install", "bulky 1.0 py3.11_cpu_0", "--channel", str(bulky_channel), "--prefix", str(tmp_path / "e"))
    assert result.returncode == 0, result.stderr
