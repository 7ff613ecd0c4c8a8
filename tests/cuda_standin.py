"""A stand-in CUDA toolkit for machines whose toolkit has nvcc but no cuBLAS/cuSPARSE (the project's 2-core
machines): this machine's real nvcc, headers and runtime, linked in, plus empty libcublas/libcusparse (and
optionally libcudnn) compiled here, and headers that declare only the handle types MAGMA's headers name. Enough
to configure, generate, compile MAGMA's headers and link; nothing in it can run a cuBLAS call.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

REAL_CUDA = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
STUB_LIBRARIES = {"libcublas.so": "cublas_v2.h", "libcublasLt.so": "cublasLt.h", "libcusparse.so": "cusparse.h"}
CUDNN = {"libcudnn.so": "cudnn.h"}
_HANDLE = {"cublas": "#include <cuda_runtime.h>\n#include <cuComplex.h>\ntypedef struct cublasContext *cublasHandle_t;\n",
           "cusparse": "typedef struct cusparseContext *cusparseHandle_t;\n"}
HEADERS = {"cublas_v2.h": _HANDLE["cublas"], "cublas.h": _HANDLE["cublas"], "cublasLt.h": "",
           "cusparse.h": _HANDLE["cusparse"], "cusparse_v2.h": '#include "cusparse.h"\n', "cudnn.h": ""}


def make_stand_in_toolkit(root: Path, *, cudnn: bool = False, cublas: bool = True, release: str | None = None) -> Path:
    """The machine's toolkit linked in, plus stand-ins. `cublas=False`: a toolkit with nvcc but without cuBLAS and
    cuSPARSE (the project's machines), made the same way on a machine whose toolkit has them; without `cudnn`,
    no cuDNN either. `release` ("11.5"): nvcc --version names that CUDA release, so a recipe of an older CUDA (its
    nvcc check, FindCUDA's CUDA_VERSION) configures here; what compiles is still this machine's nvcc."""
    include, lib = root / "include", root / "lib"
    include.mkdir(parents=True)
    lib.mkdir()
    # What the stand-in lacks, it lacks even where the machine's toolkit has it.
    dropped = (() if cublas else ("cublas", "libcublas", "cusparse", "libcusparse")) + (() if cudnn else ("cudnn", "libcudnn"))
    (root / "nvvm").symlink_to(REAL_CUDA / "nvvm")
    if release is None:
        (root / "bin").symlink_to(REAL_CUDA / "bin")
    else:
        _bin_reporting(root / "bin", release)
    for entry in (REAL_CUDA / "include").iterdir():
        if not entry.name.startswith(dropped or ("\0",)):
            (include / entry.name).symlink_to(entry)
    for entry in (REAL_CUDA / "lib64").iterdir():
        if not entry.name.startswith(dropped or ("\0",)):
            (lib / entry.name).symlink_to(entry)
    source = root / "stand_in.c"
    source.write_text("void torchforge_stand_in(void) {}\n")
    for library, header in {**(STUB_LIBRARIES if cublas else {}), **(CUDNN if cudnn else {})}.items():
        if not (lib / library).exists():
            subprocess.run(["gcc", "-shared", "-fPIC", str(source), "-o", str(lib / library)], check=True)
    for header, text in HEADERS.items():
        if (header == "cudnn.h" and not cudnn) or (header != "cudnn.h" and not cublas):
            continue
        if not (include / header).exists():
            (include / header).write_text(f"#pragma once\n/* torchforge test stand-in */\n{text}")
    (root / "lib64").symlink_to("lib")
    targets = root / "targets" / "x86_64-linux"
    targets.mkdir(parents=True)
    (targets / "include").symlink_to("../../include")
    (targets / "lib").symlink_to("../../lib")
    return root


def _bin_reporting(bin_dir: Path, release: str) -> None:
    """The real bin/, with an nvcc whose --version line says `release`."""
    bin_dir.mkdir()
    for entry in (REAL_CUDA / "bin").iterdir():
        if entry.name != "nvcc":
            (bin_dir / entry.name).symlink_to(entry)
    nvcc = bin_dir / "nvcc"
    nvcc.write_text(
        "#!/bin/sh\n"
        'case " $* " in *" --version "*|*" -V "*)\n'
        f'  "{REAL_CUDA}/bin/nvcc" "$@" | sed "s/release [0-9]*\\.[0-9]*, V[0-9.]*/release {release}, V{release}.0/"; exit ;;\n'
        "esac\n"
        f'exec "{REAL_CUDA}/bin/nvcc" "$@"\n')
    nvcc.chmod(0o755)


def path_without(tool: str | tuple[str, ...], farm: Path) -> str:
    """A PATH on which every command of the real PATH is found except `tool` (one name or several): `farm` gets a
    link to the first of each name. For a test of what happens on a machine without `tool`, run the same way on
    one that has it."""
    left_out = (tool,) if isinstance(tool, str) else tool
    farm.mkdir(parents=True, exist_ok=True)
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        if not folder or not os.path.isdir(folder):
            continue
        for entry in os.scandir(folder):
            link = farm / entry.name
            if entry.name not in left_out and not link.exists() and not link.is_symlink() \
                    and os.access(entry.path, os.X_OK) and not entry.is_dir():
                link.symlink_to(entry.path)
    assert all(shutil.which(name, path=str(farm)) is None for name in left_out)
    return str(farm)
