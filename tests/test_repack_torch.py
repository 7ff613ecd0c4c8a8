"""`torchforge repack` on the real torch 2.13.0 CPU wheel: audit, install with py-rattler, import.

The wheel (190 MB, conftest's `torch_wheel`) and a Python 3.11 venv with torch's pure-Python dependencies
are cached under .cache/torchforge-tests (gitignored); the repacked channel is built once per test session, in
the session's own temporary folder (conftest.session_shared), so no session reuses one that older code made.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from filelock import FileLock

from tests.conftest import TORCH, cached, session_shared
from tests.rattler_in_child import install_without_dependencies
from torchforge.elf import read_elf
from torchforge.proc import Runner
from torchforge.rpath import Kind, Layout, audit
from torchforge.rpath.fix import find_patchelf
from torchforge.binaries.stack import repack_stack

PY = f"{sys.version_info.major}.{sys.version_info.minor}"
IMPORT_DEPS = ("typing_extensions", "sympy", "networkx", "jinja2", "filelock", "fsspec", "numpy")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def import_python() -> Path:
    """A Python with torch's runtime deps but no torch: the repacked package must supply torch."""
    def make(dest: Path) -> None:
        subprocess.run([sys.executable, "-m", "venv", str(dest / "venv")], check=True)
        subprocess.run([str(dest / "venv/bin/python"), "-m", "pip", "install", "--quiet", *IMPORT_DEPS], check=True)

    return cached(f"import-venv-py{PY}", make) / "venv" / "bin" / "python"


def _terminal_sigint() -> None:
    """In the child before exec: SIGINT as a terminal's program has it. SIG_IGN is inherited through exec, and a
    suite started as a background job (`bash .ci/run &`) has SIGINT ignored, so Python then leaves Ctrl-C
    ignored too: the repack ran to the end, exit 0, in three whole-suite runs (never in a foreground one)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def signal_repack_mid_unpack(wheel: Path, chan: Path, signum: int) -> tuple[int, int, str]:
    """`torchforge repack` sent `signum` (to its whole process group, as a terminal's Ctrl-C or a CI job's
    cancel does) once it has unpacked 100 MB of the wheel; returns the bytes its scratch folder held then, its
    exit status and its output."""
    from tests.test_upload_helpers import ROOT, cli_env

    proc = subprocess.Popen([sys.executable, "-m", "torchforge.cli", "repack", str(wheel), "--out", str(chan)],
                            env=cli_env(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True, preexec_fn=_terminal_sigint)

    def left() -> int:
        return sum(f.stat().st_size for f in chan.glob(".torchforge-tmp-repack-*/**/*") if f.is_file())

    try:
        while proc.poll() is None and (held := left()) < 100e6:
            time.sleep(0.05)
        assert proc.poll() is None, "the repack ended before the signal"
        os.killpg(proc.pid, signum)
        output, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return held, proc.returncode, output.decode(errors="replace")


@pytest.fixture(scope="session")
def channel(torch_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The repacked channel, made the hard way: a first repack is SIGKILLed mid-unpack (as an OOM kill or a
    cancelled CI job would), and the same repack then has to succeed and remove what the killed one left."""
    shared = session_shared(tmp_path_factory) / "repacked-torch"
    with FileLock(str(shared) + ".lock"):
        marker = shared / ".complete"
        if not marker.exists() or not marker.read_text().strip():  # empty: made before the kill was part of it
            shutil.rmtree(shared, ignore_errors=True)
            left, _code, _output = signal_repack_mid_unpack(torch_wheel, shared / "chan", signal.SIGKILL)
            repack_stack([torch_wheel], shared / "chan", Runner())
            (shared / ".complete").write_text(str(left))
    return shared / "chan"


def test_the_repacked_channel_belongs_to_this_session(channel: Path, extracted: Path,
                                                      tmp_path_factory: pytest.TempPathFactory) -> None:
    """Issue 25 item 15: run without xdist, the channel once lived in pytest-of-<user>/, which outlives the
    session, and a later session reused a channel that older code had made."""
    base = tmp_path_factory.getbasetemp()
    session = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    assert session.name.startswith("pytest-") and session.name[len("pytest-"):].isdigit(), session
    assert channel.is_relative_to(session) and extracted.is_relative_to(session)


def test_a_repack_killed_mid_unpack_left_scratch_that_the_rerun_removed(channel: Path) -> None:
    left = int((channel.parent / ".complete").read_text())
    assert left >= 100e6  # what the killed run left in the channel's scratch folder
    assert not list(channel.glob(".torchforge-tmp-*"))
    assert [p.name for p in channel.glob("linux-64/*.conda")] == [f"pytorch-{TORCH}-whl_py{PY}_cpu_0.conda"]


@pytest.fixture(scope="session")
def extracted(channel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The repacked archive extracted once (read-only use; tests that modify it take a hard-link copy)."""
    from conda_package_handling import api as cph

    shared = session_shared(tmp_path_factory) / "repacked-torch-extracted"
    with FileLock(str(shared) + ".lock"):
        if not (shared / ".complete").exists():
            shutil.rmtree(shared, ignore_errors=True)
            cph.extract(str(_archive(channel)), dest_dir=str(shared / "pkg"))
            (shared / ".complete").write_text("")
    return shared / "pkg"


def _archive(channel: Path) -> Path:
    return channel / "linux-64" / f"pytorch-{TORCH}-whl_py{PY}_cpu_0.conda"


def test_repacked_package_is_named_like_official_and_audits_clean(channel: Path) -> None:
    archive = _archive(channel)
    assert archive.is_file()
    report = audit(archive)
    assert report.layout is Layout.CONDA and report.ok, report.findings[:5]
    assert len(report.files) >= 12
    repodata = json.loads((channel / "linux-64" / "repodata.json").read_text())
    record = repodata["packages.conda"][archive.name]
    assert (record["name"], record["version"], record["build"], record["build_number"]) == ("pytorch", TORCH, f"whl_py{PY}_cpu_0", 0)
    assert "python >=3.11,<3.12.0a0" in record["depends"]
    assert "typing_extensions >=4.10.0" in record["depends"] and "sympy >=1.13.3" in record["depends"]
    assert not any(d.startswith(("optree", "opt-einsum", "pyyaml")) for d in record["depends"])  # extras
    # its dist-info requires setuptools: without it `pip check` (conda-forge's recipes run it) fails
    assert "setuptools >=77.0.3" in record["depends"]
    assert record["constrains"] == ["cpuonly"]


def test_repacked_info_is_complete(extracted: Path) -> None:
    tmp_path = extracted
    info = tmp_path / "info"
    for name in ("index.json", "paths.json", "about.json", "files", "recipe/meta.yaml", "has_prefix"):
        assert (info / name).is_file(), name
    paths = json.loads((info / "paths.json").read_text())["paths"]
    files = (info / "files").read_text().split()
    assert sorted(p["_path"] for p in paths) == sorted(files)
    torch_cpu = next(p for p in paths if p["_path"].endswith("torch/lib/libtorch_cpu.so"))
    on_disk = tmp_path / torch_cpu["_path"]
    import hashlib

    assert torch_cpu["size_in_bytes"] == on_disk.stat().st_size
    assert torch_cpu["sha256"] == hashlib.sha256(on_disk.read_bytes()).hexdigest()
    site = tmp_path / "lib" / f"python{PY}" / "site-packages" / "torch"
    c_ext = read_elf(next(site.glob("_C.cpython-*.so")))
    lib = read_elf(site / "lib" / "libtorch_cpu.so")
    assert c_ext and c_ext.rpath == ("$ORIGIN", "$ORIGIN/lib", "$ORIGIN/../../..") and not c_ext.runpath
    assert lib and lib.rpath == ("$ORIGIN", "$ORIGIN/../../../..") and not lib.runpath


def test_installed_repack_imports(channel: Path, import_python: Path, tmp_path: Path) -> None:
    prefix = tmp_path / "env"
    # Only pytorch itself: its conda dependencies (python, sympy ...) are not in this offline channel; the
    # interpreter below brings them, the prefix brings torch.
    install_without_dependencies(channel, "pytorch", f"whl_py{PY}_cpu_0", prefix, tmp_path / "pkgs")
    site = prefix / "lib" / f"python{PY}" / "site-packages"
    assert (prefix / "conda-meta").is_dir() and (site / "torch" / "lib" / "libtorch_cpu.so").is_file()
    assert f"#!{prefix}/bin/python" in (prefix / "bin" / "torchrun").read_text()  # placeholder replaced
    code = "import torch; print(torch.__file__); print(torch.ones(3).sum().item())"
    done = subprocess.run([str(import_python), "-c", code], capture_output=True, text=True,
                          env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    where, value = done.stdout.split()
    assert where.startswith(str(site)) and float(value) == 3.0
    assert audit(prefix).ok


def test_broken_copy_is_flagged(extracted: Path, tmp_path: Path) -> None:
    tmp_path = tmp_path / "pkg"
    shutil.copytree(extracted, tmp_path, copy_function=os.link, symlinks=True)  # hard links: fast, no 700 MB copy
    lib = tmp_path / "lib" / f"python{PY}" / "site-packages" / "torch" / "lib"
    # --output + rename: a new inode, so the shared hard-linked original stays intact
    subprocess.run([find_patchelf(Runner()), "--set-rpath", "/usr/local/cuda/lib64:$ORIGIN", "--force-rpath",
                    "--output", str(lib / "libshm.so.new"), str(lib / "libshm.so")], check=True)
    os.replace(lib / "libshm.so.new", lib / "libshm.so")
    (lib / "libc10.so").unlink()
    report = audit(tmp_path)
    assert not report.ok
    assert any(f.kind is Kind.BUILD_PATH and f.file.endswith("libshm.so") and f.detail == "/usr/local/cuda/lib64"
               for f in report.findings)
    missing = {f.file.rsplit("/", 1)[-1] for f in report.findings if f.kind is Kind.UNRESOLVED}
    assert {"libtorch_cpu.so", "libshm.so", "libtorch_python.so"} <= missing


def test_official_wheel_as_shipped_is_flagged(torch_wheel: Path) -> None:
    # The wheel itself carries absolute MKL leftovers (/lib/intel64 ...) and a test binary whose RUNPATH
    # cannot reach torch/lib: the audit says so instead of passing it.
    report = audit(torch_wheel)
    assert report.layout is Layout.WHEEL_BUNDLED
    assert any(f.kind is Kind.BUILD_PATH and f.detail == "/lib/intel64" for f in report.findings)
    assert any(f.kind is Kind.UNRESOLVED and f.file == "torch/bin/test_shim" for f in report.findings)
