"""The post-build RPATH audit on conda package trees shaped like the official CUDA packages: a library that
neither the package nor a declared dependency provides fails it; the bundled layout of official-builds.md §1.8
(cuDNN under its own names, CUPTI renamed <stem>-<sha8>.<rest>, DT_NEEDED rewritten, DT_RPATH $ORIGIN) passes.
The libraries are gcc-built stand-ins (tests/fixtures/cuda_like), the tree is what a built .conda holds."""

from __future__ import annotations

import json
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


@pytest.fixture(scope="module")
def cuda_like(tmp_path_factory: pytest.TempPathFactory) -> Path:
    sys.path.insert(0, str(FIXTURES / "cuda_like"))
    try:
        import build as cuda_like_build
    finally:
        sys.path.pop(0)
    out = cuda_like_build.build(tmp_path_factory.mktemp("cuda_like"))
    # libtorch_cuda stand-in: needs cuDNN and CUPTI by SONAME, DT_RPATH as the recipe's loop leaves it.
    (out / "consumer.c").write_text("unsigned long cudnnGetVersion(void);\n"
                                    "int use(void) { return (int)cudnnGetVersion(); }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(out / "libtorch_cuda.so"), str(out / "consumer.c"),
                    "-Wl,-soname,libtorch_cuda.so", "-Wl,--disable-new-dtags,-rpath,$ORIGIN:$ORIGIN/../../../..",
                    f"-L{out}", "-Wl,--no-as-needed", "-l:libcudnn.so.9", "-l:libcupti.so.12"], check=True)
    return out


def package(root: Path, built: Path, depends: list[str]) -> Path:
    """A conda package tree with torch/lib/libtorch_cuda.so and info/index.json declaring `depends`."""
    lib = root / SITE / "torch" / "lib"
    lib.mkdir(parents=True)
    shutil.copy2(built / "libtorch_cuda.so", lib)
    (root / "info").mkdir()
    (root / "info" / "index.json").write_text(json.dumps({"name": "pytorch", "depends": depends}))
    return lib


def unresolved(root: Path) -> set[str]:
    report = audit(root, Layout.CONDA)
    return {f.detail.split()[0] for f in report.findings if f.kind is Kind.UNRESOLVED}


def test_a_library_no_one_provides_fails_the_audit(cuda_like: Path, tmp_path: Path) -> None:
    package(tmp_path, cuda_like, ["python >=3.11,<3.12.0a0", "pytorch-cuda >=12.4,<12.5"])
    report = audit(tmp_path, Layout.CONDA)
    assert not report.ok
    # CUPTI comes with pytorch-cuda (cuda-cupti); cuDNN comes with nothing the package declares.
    assert unresolved(tmp_path) == {"libcudnn.so.9"}


def test_a_declared_dependency_that_provides_it_passes(cuda_like: Path, tmp_path: Path) -> None:
    package(tmp_path, cuda_like, ["python >=3.11,<3.12.0a0", "pytorch-cuda >=12.4,<12.5", "cudnn >=9,<10"])
    assert audit(tmp_path, Layout.CONDA).ok


def test_the_bundled_layout_passes_without_any_cuda_dependency(cuda_like: Path, tmp_path: Path) -> None:
    lib = package(tmp_path, cuda_like, ["python >=3.11,<3.12.0a0"])
    assert unresolved(tmp_path) == {"libcudnn.so.9", "libcupti.so.12"}
    patchelf = find_patchelf(Runner())
    for name in ("libcudnn.so.9", "libcudnn_graph.so.9"):  # kept names: cuDNN's libraries load each other by name
        shutil.copy2(cuda_like / name, lib / name)
    cupti = hashed_name(cuda_like / "libcupti.so.12")
    assert cupti.startswith("libcupti-") and cupti.endswith(".so.12")
    shutil.copy2(cuda_like / "libcupti.so.12", lib / cupti)
    subprocess.run([patchelf, "--replace-needed", "libcupti.so.12", cupti, str(lib / "libtorch_cuda.so")], check=True)
    for copy in ("libcudnn.so.9", "libcudnn_graph.so.9", cupti):
        subprocess.run([patchelf, "--set-rpath", "$ORIGIN:$ORIGIN/../../../..", "--force-rpath", str(lib / copy)],
                       check=True)
    report = audit(tmp_path, Layout.CONDA)
    assert report.ok, report.findings
    resolved = {r.needed: r.where for f in report.files for r in f.resolutions}
    assert resolved["libcudnn.so.9"] == resolved[cupti] == resolved["libcudnn_graph.so.9"] == "package"


def test_a_bundled_copy_whose_own_dependency_is_missing_fails(cuda_like: Path, tmp_path: Path) -> None:
    lib = package(tmp_path, cuda_like, ["python >=3.11,<3.12.0a0", "pytorch-cuda >=12.4,<12.5"])
    shutil.copy2(cuda_like / "libcudnn.so.9", lib / "libcudnn.so.9")  # without libcudnn_graph.so.9
    patchelf = find_patchelf(Runner())
    subprocess.run([patchelf, "--set-rpath", "$ORIGIN:$ORIGIN/../../../..", "--force-rpath",
                    str(lib / "libcudnn.so.9")], check=True)
    assert unresolved(tmp_path) == {"libcudnn_graph.so.9"}


@pytest.mark.parametrize(("depends", "unresolved_names"), [
    (["python >=3.11,<3.12.0a0"], set()),  # every conda python run-depends on zlib (data/rpath.toml cites why)
    (["zlib"], set()),
    (["pytorch-cuda >=12.4,<12.5"], {"libz.so.1"}),
])
def test_libz_of_a_bundled_cudnn_comes_through_python(tmp_path: Path, depends: list[str],
                                                       unresolved_names: set[str]) -> None:
    """The real cuDNN 9 sub-libraries need libz.so.1 (seen in nvidia-cudnn-cu13 9.19.0.56); the official
    packages bundled them without naming zlib, which python's run-exported zlib provides."""
    (tmp_path / "src.c").write_text("int zlibVersion(void);\nint use(void) { return zlibVersion() != 0; }\n")
    lib = tmp_path / "pkg" / SITE / "torch" / "lib"
    lib.mkdir(parents=True)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib / "libcudnn_graph.so.9"), str(tmp_path / "src.c"),
                    "-Wl,-soname,libcudnn_graph.so.9", "-Wl,--disable-new-dtags,-rpath,$ORIGIN:$ORIGIN/../../../..",
                    "-Wl,--no-as-needed", "-l:libz.so.1"], check=True)
    (tmp_path / "pkg" / "info").mkdir()
    (tmp_path / "pkg" / "info" / "index.json").write_text(json.dumps({"name": "pytorch", "depends": depends}))
    assert unresolved(tmp_path / "pkg") == unresolved_names
