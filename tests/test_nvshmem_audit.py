"""Why the 2.9+ CUDA packages are built with USE_NVSHMEM=0 instead of bundling NVSHMEM (eras.toml,
docs/inside-the-package.md, "NVSHMEM is not bundled"), checked with the real audit on gcc-built stand-ins shaped like the twelve shared
libraries of the real nvidia-nvshmem-cu13 3.4.5 wheel (tests/fixtures/nvshmem_like cites it): the wheel's set,
copied into torch/lib unmodified, fails the audit (plugins need Open MPI, PMIx, rdma-core, libfabric and UCX, and
two carry NVIDIA's build path as RUNPATH); the self-contained part passes and its plugins load by bare name
through libnvshmem_host's ${ORIGIN}, which only works while their file names are kept."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from torchforge.proc import Runner
from torchforge.rpath import Kind, Layout, audit
from torchforge.rpath.fix import find_patchelf, hashed_name

FIXTURES = Path(__file__).parent / "fixtures"
SITE = f"lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc builds the stand-in libraries")


def _fixture_module():  # type: ignore[no-untyped-def]
    # Loaded from its file under its own name: tests/fixtures/cuda_like has a `build` module too, and a plain
    # `import build` returns whichever one this worker imported first.
    spec = importlib.util.spec_from_file_location("nvshmem_like_build", FIXTURES / "nvshmem_like" / "build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def nvshmem_like(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("nvshmem_like")
    lib, _ = _fixture_module().build(out)
    # libtorch_cuda stand-in: links libnvshmem_host.so.3 by SONAME, DT_RPATH as the recipe's loop leaves it.
    (out / "consumer.c").write_text("int nvshmem_load_plugin(const char *name);\n"
                                    "int torch_load(const char *name) { return nvshmem_load_plugin(name); }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(out / "libtorch_cuda.so"), str(out / "consumer.c"),
                    "-Wl,-soname,libtorch_cuda.so", "-Wl,--disable-new-dtags,-rpath,$ORIGIN:$ORIGIN/../../../..",
                    f"-L{lib}", "-Wl,--no-as-needed", "-l:libnvshmem_host.so.3"], check=True)
    return out


def package(root: Path, built: Path, files: list[str]) -> Path:
    """A conda package tree: torch/lib with libtorch_cuda.so and `files` copied unmodified, names kept."""
    lib = root / SITE / "torch" / "lib"
    lib.mkdir(parents=True)
    shutil.copy2(built / "libtorch_cuda.so", lib)
    for name in files:
        shutil.copy2(built / "lib" / name, lib / name)
    (root / "info").mkdir()
    (root / "info" / "index.json").write_text(json.dumps({"name": "pytorch", "depends": ["python >=3.11,<3.12.0a0"]}))
    return lib


def test_the_wheels_library_set_bundled_as_is_fails_the_audit(nvshmem_like: Path, tmp_path: Path) -> None:
    entries = _fixture_module().libraries()
    package(tmp_path, nvshmem_like, [str(e["file"]) for e in entries])
    report = audit(tmp_path, Layout.CONDA)
    assert not report.ok
    outside = {str(n) for e in entries for n in e["needed"]}  # type: ignore[union-attr]
    unresolved = {f.detail.split()[0] for f in report.findings if f.kind is Kind.UNRESOLVED}
    assert unresolved == outside
    assert outside == {"libmpi.so.40", "liboshmem.so.40", "libpmix.so.2", "libmlx5.so.1", "libfabric.so.1",
                       "libucs.so.0", "libucp.so.0"}
    runpath_files = {str(e["file"]) for e in entries if "runpath" in e}
    assert runpath_files == {"nvshmem_bootstrap_mpi.so.3", "nvshmem_bootstrap_shmem.so.3"}
    flagged = {Path(f.file).name for f in report.findings if f.kind in (Kind.BUILD_PATH, Kind.ABSOLUTE, Kind.RUNPATH)}
    assert flagged == runpath_files


def _load(lib: Path, plugin: str) -> subprocess.CompletedProcess[str]:
    code = ("import ctypes, sys\n"
            "torch = ctypes.CDLL(sys.argv[1])\n"
            "sys.exit(torch.torch_load(sys.argv[2].encode()))\n")
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"} | {"LD_LIBRARY_PATH": ""}
    return subprocess.run([sys.executable, "-c", code, str(lib / "libtorch_cuda.so"), plugin],
                          env=env, capture_output=True, text=True, check=False)


def test_the_self_contained_part_passes_and_loads_plugins_only_by_their_own_names(nvshmem_like: Path,
                                                                                  tmp_path: Path) -> None:
    entries = _fixture_module().libraries()
    contained = [str(e["file"]) for e in entries if not e["needed"] and "runpath" not in e]
    assert contained == ["libnvshmem_host.so.3", "nvshmem_bootstrap_pmi.so.3", "nvshmem_bootstrap_pmi2.so.3",
                         "nvshmem_bootstrap_uid.so.3", "nvshmem_transport_ibrc.so.3"]
    lib = package(tmp_path, nvshmem_like, contained)
    report = audit(tmp_path, Layout.CONDA)
    assert report.ok, report.findings
    loaded = _load(lib, "nvshmem_bootstrap_uid.so.3")
    assert loaded.returncode == 0, loaded.stderr
    # A hashed copy (the treatment of a library that is only linked) is not found by the name dlopen asks for.
    hashed = hashed_name(lib / "nvshmem_bootstrap_uid.so.3")
    (lib / "nvshmem_bootstrap_uid.so.3").rename(lib / hashed)
    missing = _load(lib, "nvshmem_bootstrap_uid.so.3")
    assert missing.returncode == 1 and "nvshmem_bootstrap_uid.so.3" in missing.stderr


def test_upstreams_self_contained_layout_passes_the_audit_but_finds_no_plugin(nvshmem_like: Path,
                                                                              tmp_path: Path) -> None:
    """PyTorch's own bundled (no nvidia-* wheels) builds copy libnvshmem_host.so.3 alone, hashed like any linked
    library (P@799d09f2:.ci/manywheel/build_cuda.sh DEPS_LIST): the audit has nothing to object to, yet the
    bootstrap plugin NVSHMEM dlopens at initialisation is not there."""
    lib = package(tmp_path, nvshmem_like, ["libnvshmem_host.so.3"])
    host = hashed_name(lib / "libnvshmem_host.so.3")
    assert host.startswith("libnvshmem_host-") and host.endswith(".so.3")
    (lib / "libnvshmem_host.so.3").rename(lib / host)
    patchelf = find_patchelf(Runner())
    subprocess.run([patchelf, "--replace-needed", "libnvshmem_host.so.3", host, str(lib / "libtorch_cuda.so")],
                   check=True)
    assert audit(tmp_path, Layout.CONDA).ok
    missing = _load(lib, "nvshmem_bootstrap_uid.so.3")
    assert missing.returncode == 1 and "nvshmem_bootstrap_uid.so.3" in missing.stderr
