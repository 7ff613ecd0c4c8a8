"""A stand-in CUDA toolkit for machines whose toolkit has nvcc but no cuBLAS/cuSPARSE (the project's 2-core
machines): this machine's real nvcc, headers and runtime, linked in, plus empty libcublas/libcusparse (and
optionally libcudnn) compiled here, and headers that declare only the handle types MAGMA's headers name. Enough
to configure, generate, compile MAGMA's headers and link; nothing in it can run a cuBLAS call.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REAL_CUDA = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
STUB_LIBRARIES = {"libcublas.so": "cublas_v2.h", "libcublasLt.so": "cublasLt.h", "libcusparse.so": "cusparse.h"}
CUDNN = {"libcudnn.so": "cudnn.h"}
_HANDLE = {"cublas": "#include <cuda_runtime.h>\n#include <cuComplex.h>\ntypedef struct cublasContext *cublasHandle_t;\n",
           "cusparse": "typedef struct cusparseContext *cusparseHandle_t;\n"}
HEADERS = {"cublas_v2.h": _HANDLE["cublas"], "cublas.h": _HANDLE["cublas"], "cublasLt.h": "",
           "cusparse.h": _HANDLE["cusparse"], "cusparse_v2.h": '#include "cusparse.h"\n', "cudnn.h": ""}


def make_stand_in_toolkit(root: Path, *, cudnn: bool = False) -> Path:
    include, lib = root / "include", root / "lib"
    include.mkdir(parents=True)
    lib.mkdir()
    for name in ("bin", "nvvm"):
        (root / name).symlink_to(REAL_CUDA / name)
    for entry in (REAL_CUDA / "include").iterdir():
        (include / entry.name).symlink_to(entry)
    for entry in (REAL_CUDA / "lib64").iterdir():
        (lib / entry.name).symlink_to(entry)
    source = root / "stand_in.c"
    source.write_text("void torchforge_stand_in(void) {}\n")
    for library, header in {**STUB_LIBRARIES, **(CUDNN if cudnn else {})}.items():
        if not (lib / library).exists():
            subprocess.run(["gcc", "-shared", "-fPIC", str(source), "-o", str(lib / library)], check=True)
    for header, text in HEADERS.items():
        if header == "cudnn.h" and not cudnn:
            continue
        if not (include / header).exists():
            (include / header).write_text(f"#pragma once\n/* torchforge test stand-in */\n{text}")
    (root / "lib64").symlink_to("lib")
    targets = root / "targets" / "x86_64-linux"
    targets.mkdir(parents=True)
    (targets / "include").symlink_to("../../include")
    (targets / "lib").symlink_to("../../lib")
    return root
