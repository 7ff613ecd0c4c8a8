"""Rendered recipes against the official ones, one variant per release era: run requirements, host pins,
the exported build environment and the bundled libraries, each expected value written here as upstream's own
text with the file and line that state it.

Citations: `B <branch>:<path>:<line>` is pytorch/builder (release branches, `main@8c82f759` for 1.8.0);
`P` is pytorch/pytorch; `PyPI torch X METADATA` is the Requires-Dist of the wheel on PyPI (its triton pin comes
from the same `.ci/docker/triton_version.txt` the conda build read). Requirement texts are compared as conda
MatchSpecs parsed by py-rattler, so upstream's `numpy=1.21.5` equals torchforge's `numpy 1.21.5.*`.
"""

from __future__ import annotations

import fnmatch
import re
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from tests.rattler_in_child import Spec, parse_specs
from torchforge.flavours.official.recipe import pytorch_context
from torchforge.flavours.official.render import render_files
from torchforge.templates import RecipeFormat
from torchforge.flavours.official.resolve import classify
from torchforge.flavours.official.variant import Options, Request

M18 = "B main@8c82f759:conda/pytorch-nightly/meta.yaml"
B = "B release/{}:conda/{}"
ABSENT = None  # the variable is not set


def meta(release: str, line: int) -> str:
    return B.format(release, f"pytorch-nightly/meta.yaml:{line}")


def script(release: str, line: int | str) -> str:
    return B.format(release, f"pytorch-nightly/build.sh:{line}")


def bat(release: str, line: int | str) -> str:
    return B.format(release, f"pytorch-nightly/bld.bat:{line}")


def driver(release: str, line: int | str) -> str:
    return B.format(release, f"build_pytorch.sh:{line}")


def openssl_image(release: str) -> str:
    return f"B release/{release}:common/install_openssl.sh:5 (the image's /opt/openssl; no openssl in host for Python <= 3.9)"


def mkl_archive(release: str, lines: str) -> str:
    return bat(release, lines) + " (mkl_<version>.7z first on CMAKE_INCLUDE_PATH and LIB)"


OLD_ABI = ("B release/1.9:conda/Dockerfile:12,20 (devtoolset-7 GCC builds the old ABI only); exported by the driver "
           "from release/1.12:conda/build_pytorch.sh:305-307")
MAGMA_BUILD0 = ("B 7c2cfcea:magma/package_files/meta.yaml:7-12 (build 0, no LU patches); LU patches and build 1 from "
                "268c55b9:magma/package_files/meta.yaml:10-14 (2022-08-18)")


SPLIT_CUDA = ("P .circleci/scripts/binary_linux_build.sh: cu111 (1.8 copy) / cu1[1-2][0-9] (@3c92794d:14-16) "
              "-> BUILD_SPLIT_CUDA=ON, forwarded by meta.yaml script_env")


@dataclass(frozen=True)
class Official:
    """What the official package of one variant had. Requirements: (upstream text, citation)."""

    request: Request
    run: tuple[tuple[str, str], ...]
    host_pins: tuple[tuple[str, str], ...]  # host lines with a version (python and magma excluded)
    env: dict[str, tuple[str | None, str]] = field(default_factory=dict)  # name -> (value or ABSENT, citation)
    bundled: tuple[tuple[str, str], ...] = ()  # (file name or glob copied into torch/lib, citation)
    # host packages upstream's build image provided instead (the official package has no run requirement from them)
    image: tuple[tuple[str, str], ...] = ()
    magma: tuple[str, str] | None = None  # the host magma-cudaXYZ requirement, where a case checks it
    static_mkl: tuple[str | None, str] | None = None  # Windows: the MKL archive version bld.bat links, or ABSENT


CASES: dict[str, Official] = {
    "1.8 cu111": Official(
        Request("1.8.0", "11.1", "3.8", "linux-64"),
        run=(("numpy >=1.19", f"{M18}:32"), ("mkl >=2018", f"{M18}:33"), ("ninja", f"{M18}:37"),
             ("typing_extensions", f"{M18}:38"), ("blas * mkl", f"{M18}:39"),
             ("cudatoolkit >=11.1,<11.2", "B main@8c82f759:conda/build_pytorch.sh:264")),
        host_pins=(("numpy=1.19", f"{M18}:17"), ("mkl >=2019", f"{M18}:20")),
        env={"BUILD_SPLIT_CUDA": ("ON", SPLIT_CUDA),
             "USE_STATIC_CUDNN": ("1", "B main@8c82f759:conda/pytorch-nightly/build.sh:51"),
             "TORCH_CUDA_ARCH_LIST": ("3.7+PTX;5.0;6.0;6.1;7.0;7.5;8.0;8.6",
                                      "B main@8c82f759:conda/pytorch-nightly/build.sh:33,45"),
             "USE_GLOO_WITH_OPENSSL": (ABSENT, "B main@8c82f759:conda/build_pytorch.sh (not set before 1.9)"),
             "USE_LLVM": (ABSENT, "B main@8c82f759:conda/pytorch-nightly/build.sh (not set before 1.10)")},
    ),
    "1.9 cu111 py3.9 (image OpenSSL, old ABI from the compiler)": Official(
        Request("1.9.1", "11.1", "3.9", "linux-64"),
        run=(("mkl >=2018", meta("1.9", 32)), ("ninja", meta("1.9", 36)), ("typing_extensions", meta("1.9", 37)),
             ("blas * mkl", meta("1.9", 38)), ("cudatoolkit >=11.1,<11.2", driver("1.9", 266))),
        host_pins=(("numpy=1.19", meta("1.9", 17)), ("mkl=2020.2", meta("1.9", 20))),
        image=(("openssl=1.1.1k", openssl_image("1.9")),),
        magma=("magma-cuda111 ==2.5.2", driver("1.9", 267) + " (unpinned); the branch's magma: "
               "release/1.9:magma/package_files/meta.yaml:3,13 (2.5.2, build 1, the newest build)"),
        env={"_GLIBCXX_USE_CXX11_ABI": ("0", OLD_ABI), "USE_GLOO_WITH_OPENSSL": ("1", driver("1.9", 318)),
             "TORCH_CUDA_ARCH_LIST": ("3.7+PTX;5.0;6.0;6.1;7.0;7.5;8.0;8.6", script("1.9", "39,51"))},
    ),
    "1.9 cu111 win-64 (static MKL)": Official(
        Request("1.9.1", "11.1", "3.9", "win-64"),
        run=(("mkl >=2018", meta("1.9", 32)), ("libuv", meta("1.9", 34)), ("intel-openmp", meta("1.9", 35)),
             ("ninja", meta("1.9", 36)), ("typing_extensions", meta("1.9", 37)), ("blas * mkl", meta("1.9", 38)),
             ("cudatoolkit >=11.1,<11.2", driver("1.9", 266))),
        host_pins=(("numpy=1.19", meta("1.9", 17)), ("mkl=2020.2", meta("1.9", 20))),
        env={"TORCH_CUDA_ARCH_LIST": ("3.7+PTX;5.0;6.0;6.1;7.0;7.5;8.0;8.6", bat("1.9", "22,30"))},
        bundled=(("cudnn*64_*.dll*", bat("1.9", 117)),),
        static_mkl=("2020.2.254", mkl_archive("1.9", "38-41")),
    ),
    "1.11 cu115 py3.9 (MAGMA 2.6.1 build 0, image OpenSSL)": Official(
        Request("1.11.0", "11.5", "3.9", "linux-64"),
        run=(("mkl >=2018", meta("1.11", 36)), ("typing_extensions", meta("1.11", 40)),
             ("blas * mkl", meta("1.11", 41)), ("pytorch-mutex 1.0 cuda", meta("1.11", 42)),
             ("cudatoolkit >=11.5,<11.6", driver("1.11", 271))),
        host_pins=(("mkl=2020.2", meta("1.11", 20)), ("numpy=1.19", meta("1.11", 28)), ("llvmdev=9", meta("1.11", 31))),
        image=(("openssl=1.1.1l", openssl_image("1.11")),),
        magma=("magma-cuda115 ==2.6.1 0", driver("1.11", 272) + " (unpinned); uploaded 2022-02-23 and 03-01 by "
               "7c2cfcea:.github/workflows/build-magma-linux.yml:4-8,31,57, before 1.11.0 (2022-03-10); " + MAGMA_BUILD0),
        env={"_GLIBCXX_USE_CXX11_ABI": ("0", OLD_ABI), "USE_GLOO_WITH_OPENSSL": ("1", driver("1.11", 332)),
             "USE_STATIC_CUDNN": ("0", script("1.11", 77))},
        bundled=(("libcudnn*.so.8", script("1.11", 79)),),
    ),
    "1.12 cu116 (MAGMA 2.6.1 build 0)": Official(
        Request("1.12.1", "11.6", "3.10", "linux-64"),
        run=(("mkl >=2018", meta("1.12", 39)), ("typing_extensions", meta("1.12", 43)),
             ("blas * mkl", meta("1.12", 45)), ("pytorch-mutex 1.0 cuda", meta("1.12", 47)),
             ("cudatoolkit >=11.6,<11.7", driver("1.12", 270))),
        host_pins=(("mkl=2020.2", meta("1.12", 24)), ("numpy=1.21.5", meta("1.12", 31)),
                   ("openssl=1.1.1l", meta("1.12", 32)), ("llvmdev=9", meta("1.12", 33))),
        magma=("magma-cuda116 ==2.6.1 0", driver("1.12", 271) + " (unpinned); magma-cuda116 from 29b3c184 "
               "(2022-03-21), 1.12.1 released 2022-08-05; " + MAGMA_BUILD0),
        env={"_GLIBCXX_USE_CXX11_ABI": ("0", driver("1.12", 307)), "USE_STATIC_CUDNN": ("0", script("1.12", 78))},
        bundled=(("libcudnn*.so.8", script("1.12", 80)), ("libcupti.so.11.6", script("1.12", 80))),
    ),
    "1.13 cu117 win-64 (static MKL)": Official(
        Request("1.13.1", "11.7", "3.10", "win-64"),
        run=(("mkl >=2018", meta("1.13", 39)), ("libuv", meta("1.13", 41)), ("intel-openmp", meta("1.13", 42)),
             ("typing_extensions", meta("1.13", 43)), ("blas * mkl", meta("1.13", 45)),
             ("pytorch-mutex 1.0 cuda", meta("1.13", 47)), ("pytorch-cuda >=11.7,<11.8", driver("1.13", 270))),
        host_pins=(("mkl=2021.4", meta("1.13", 25)), ("numpy=1.21.5", meta("1.13", 31)), ("llvmdev=9", meta("1.13", 33))),
        bundled=(("cudnn*64_*.dll*", bat("1.13", 109)), ("nvToolsExt64_*.dll*", bat("1.13", 110)),
                 ("cupti64_*.dll*", bat("1.13", 113)), ("zlibwapi.dll", bat("1.13", "116-117"))),
        static_mkl=("2020.2.254", mkl_archive("1.13", "41-44")),
    ),
    "2.0 cpu win-64 (static MKL)": Official(
        Request("2.0.0", "cpu", "3.10", "win-64"),
        run=(("mkl >=2018", meta("2.0", 41)), ("libuv", meta("2.0", 43)), ("intel-openmp", meta("2.0", 44)),
             ("typing_extensions", meta("2.0", 45)), ("sympy", meta("2.0", 46)), ("filelock", meta("2.0", 47)),
             ("networkx", meta("2.0", 48)), ("jinja2", meta("2.0", 49)), ("blas * mkl", meta("2.0", 51)),
             ("pytorch-mutex 1.0 cpu", meta("2.0", 53))),
        host_pins=(("mkl=2021.4", meta("2.0", 25)), ("numpy=1.21.5", meta("2.0", 31)), ("llvmdev=9", meta("2.0", 35))),
        env={"USE_CUDA": ("0", driver("2.0", 250))},
        static_mkl=("2020.2.254", mkl_archive("2.0", "42-45")),
    ),
    "2.2 cu121 win-64 (the last static MKL)": Official(
        Request("2.2.2", "12.1", "3.11", "win-64"),
        run=(("mkl >=2018", meta("2.2", 44)), ("libuv", meta("2.2", 46)), ("intel-openmp", meta("2.2", 47)),
             ("typing_extensions", meta("2.2", 51)), ("sympy", meta("2.2", 52)), ("filelock", meta("2.2", 53)),
             ("networkx", meta("2.2", 54)), ("jinja2", meta("2.2", 55)), ("pyyaml", meta("2.2", 56)),
             ("blas * mkl", meta("2.2", 58)), ("pytorch-mutex 1.0 cuda", meta("2.2", 60)),
             ("pytorch-cuda >=12.1,<12.2", driver("2.2", 273))),
        host_pins=(("mkl=2021.4", meta("2.2", 26)), ("numpy=1.23.5", meta("2.2", 33)), ("llvmdev=9", meta("2.2", 38))),
        env={"TORCH_CUDA_ARCH_LIST": ("5.0;6.0;6.1;7.0;7.5;8.0;8.6;9.0", bat("2.2", "23,29"))},
        bundled=(("cudnn*64_*.dll*", bat("2.2", 105)), ("nvToolsExt64_*.dll*", bat("2.2", 106)),
                 ("cupti64_*.dll*", bat("2.2", 109)), ("zlibwapi.dll", bat("2.2", "112-113"))),
        static_mkl=("2020.2.254", mkl_archive("2.2", "37-40")),
    ),
    "2.3 cu121 win-64 (dynamic MKL from mkl-devel)": Official(
        Request("2.3.1", "12.1", "3.11", "win-64"),
        run=(("mkl=2021.4", meta("2.3", 44)), ("libuv", meta("2.3", 47)), ("intel-openmp", meta("2.3", 48)),
             ("typing_extensions", meta("2.3", 52)), ("sympy", meta("2.3", 53)), ("filelock", meta("2.3", 54)),
             ("networkx", meta("2.3", 55)), ("jinja2", meta("2.3", 56)), ("pyyaml", meta("2.3", 57)),
             ("blas * mkl", meta("2.3", 59)), ("pytorch-mutex 1.0 cuda", meta("2.3", 61)),
             ("pytorch-cuda >=12.1,<12.2", driver("2.3", 272))),
        host_pins=(("mkl-devel=2021.4.0", meta("2.3", 26)), ("numpy=2.0.0rc1", meta("2.3", 33)),
                   ("llvmdev=9", meta("2.3", 37))),
        bundled=(("cudnn*64_*.dll*", bat("2.3", 100)), ("nvToolsExt64_*.dll*", bat("2.3", 101)),
                 ("cupti64_*.dll*", bat("2.3", 104)), ("zlibwapi.dll", bat("2.3", "107-108"))),
        static_mkl=(ABSENT, meta("2.3", "26-27") + " (mkl-devel instead: builder 896b6df5, 'Use dynamic MKL on Windows')"),
    ),
    "1.10 cu113": Official(
        Request("1.10.2", "11.3", "3.9", "linux-64"),
        run=(("mkl >=2018", meta("1.10", 35)), ("typing_extensions", meta("1.10", 39)),
             ("blas * mkl", meta("1.10", 40)), ("pytorch-mutex 1.0 cuda", meta("1.10", 41)),
             ("cudatoolkit >=11.3,<11.4", driver("1.10", 268))),
        host_pins=(("numpy=1.19", meta("1.10", 19)), ("mkl=2020.2", meta("1.10", 22)),
                   ("llvmdev=9", meta("1.10", 30))),
        image=(("openssl=1.1.1k", openssl_image("1.10")),),
        env={"USE_LLVM": ("/opt/llvm_no_cxx11_abi", script("1.10", 9)),
             "LLVM_DIR": ("$USE_LLVM/lib/cmake/llvm", script("1.10", 10)),
             "USE_STATIC_CUDNN": ("1", script("1.10", 63)),
             "BUILD_SPLIT_CUDA": ("ON", SPLIT_CUDA),
             "USE_GLOO_WITH_OPENSSL": ("1", driver("1.10", 326))},
    ),
    "1.12 cu102 (static cuDNN)": Official(
        Request("1.12.1", "10.2", "3.10", "linux-64"),
        run=(("mkl >=2018", meta("1.12", 39)), ("typing_extensions", meta("1.12", 43)),
             ("blas * mkl", meta("1.12", 45)), ("pytorch-mutex 1.0 cuda", meta("1.12", 47)),
             ("cudatoolkit >=10.2,<10.3", driver("1.12", 279))),
        host_pins=(("mkl=2020.2", meta("1.12", 24)), ("numpy=1.21.5", meta("1.12", 31)),
                   ("openssl=1.1.1l", meta("1.12", 32)), ("llvmdev=9", meta("1.12", 33))),
        env={"USE_STATIC_CUDNN": ("1", script("1.12", 55)),
             "BUILD_SPLIT_CUDA": (ABSENT, SPLIT_CUDA + " (cu102 does not match)"),
             "USE_GLOO_WITH_OPENSSL": ("1", driver("1.12", 303))},
        bundled=(("libcupti.so.10.2", script("1.12", 59)),),
    ),
    "1.12 cu102 win-64": Official(
        Request("1.12.1", "10.2", "3.10", "win-64"),
        run=(("mkl >=2018", meta("1.12", 39)), ("libuv", meta("1.12", 41)), ("intel-openmp", meta("1.12", 42)),
             ("typing_extensions", meta("1.12", 43)), ("blas * mkl", meta("1.12", 45)),
             ("pytorch-mutex 1.0 cuda", meta("1.12", 47)), ("cudatoolkit >=10.2,<10.3", driver("1.12", 279))),
        host_pins=(("mkl=2021.4", meta("1.12", 25)), ("numpy=1.21.5", meta("1.12", 31)),
                   ("llvmdev=9", meta("1.12", 33))),
        env={"TORCH_NVCC_FLAGS": ("-Xfatbin -compress-all", bat("1.12", "22-36")),
             "TORCH_CUDA_ARCH_LIST": ("3.7+PTX;5.0;6.0;6.1;7.0;7.5", bat("1.12", "23-24")),
             "USE_MAGMA": (ABSENT, bat("1.12", "60-64")), "BUILD_SPLIT_CUDA": (ABSENT, SPLIT_CUDA)},
        bundled=(("cudnn*64_*.dll*", bat("1.12", 110)), ("cupti64_*.dll*", bat("1.12", 113)),
                 ("zlibwapi.dll", bat("1.12", "116-117"))),
        static_mkl=("2020.2.254", mkl_archive("1.12", "42-45")),
    ),
    "1.13 cu117": Official(
        Request("1.13.1", "11.7", "3.10", "linux-64"),
        run=(("mkl >=2018", meta("1.13", 39)), ("typing_extensions", meta("1.13", 43)),
             ("blas * mkl", meta("1.13", 45)), ("pytorch-mutex 1.0 cuda", meta("1.13", 47)),
             ("pytorch-cuda >=11.7,<11.8", driver("1.13", 270))),
        host_pins=(("mkl=2020.2", meta("1.13", 24)), ("numpy=1.21.5", meta("1.13", 31)),
                   ("openssl=1.1.1l", meta("1.13", 32)), ("llvmdev=9", meta("1.13", 33))),
        env={"USE_STATIC_CUDNN": ("0", script("1.13", 86)), "BUILD_SPLIT_CUDA": ("ON", SPLIT_CUDA),
             "PACKAGE_TYPE": ("conda", script("1.13", 11))},
        bundled=(("libcudnn*.so.8", script("1.13", 88)), ("libcupti.so.11.7", script("1.13", 88))),
    ),
    "2.0 cu118 (no pyyaml in run)": Official(
        Request("2.0.1", "11.8", "3.10", "linux-64"),
        run=(("mkl >=2018", meta("2.0", 41)), ("typing_extensions", meta("2.0", 45)), ("sympy", meta("2.0", 46)),
             ("filelock", meta("2.0", 47)), ("networkx", meta("2.0", 48)), ("jinja2", meta("2.0", 49)),
             ("blas * mkl", meta("2.0", 51)), ("pytorch-mutex 1.0 cuda", meta("2.0", 53)),
             ("pytorch-cuda >=11.8,<11.9", driver("2.0", 269)), ("torchtriton==2.0.0", driver("2.0", 282))),
        host_pins=(("mkl=2020.2", meta("2.0", 24)), ("numpy=1.21.5", meta("2.0", 31)),
                   ("openssl=1.1.1l", meta("2.0", 33)), ("llvmdev=9", meta("2.0", 35))),
        env={"USE_STATIC_CUDNN": ("0", script("2.0", 76)), "BUILD_SPLIT_CUDA": (ABSENT, SPLIT_CUDA + "; the option was deleted before 2.0, P pytorch#87502"),
             "TORCH_CUDA_ARCH_LIST": ("3.7+PTX;5.0;6.0;6.1;7.0;7.5;8.0;8.6;9.0", script("2.0", "55,73"))},
        bundled=(("libcudnn*.so.8", script("2.0", 78)), ("libcupti.so.11.8", script("2.0", 78))),
    ),
    "2.1 cu121": Official(
        Request("2.1.2", "12.1", "3.11", "linux-64"),
        run=(("mkl >=2018", meta("2.1", 41)), ("llvm-openmp <16", meta("2.1", 47)),
             ("typing_extensions", meta("2.1", 48)), ("sympy", meta("2.1", 49)), ("filelock", meta("2.1", 50)),
             ("networkx", meta("2.1", 51)), ("jinja2", meta("2.1", 52)), ("pyyaml", meta("2.1", 53)),
             ("blas * mkl", meta("2.1", 55)), ("pytorch-mutex 1.0 cuda", meta("2.1", 57)),
             ("pytorch-cuda >=12.1,<12.2", driver("2.1", 267)), ("torchtriton==2.1.0", driver("2.1", 278))),
        host_pins=(("mkl=2020.2", meta("2.1", 24)), ("numpy=1.23.5", meta("2.1", 32)),
                   ("openssl=1.1.1s", meta("2.1", 34)), ("llvmdev=9", meta("2.1", 35))),
        env={"USE_STATIC_CUDNN": ("0", script("2.1", 69)), "USE_CUSPARSELT": (ABSENT, script("2.1", "53-79"))},
        bundled=(("libcudnn*.so.8", script("2.1", 70)), ("libcupti.so.12", script("2.1", 70))),
    ),
    "2.2 cu121 py3.12 (no triton, no TLS)": Official(
        Request("2.2.2", "12.1", "3.12", "linux-64"),
        run=(("mkl >=2018", meta("2.2", 44)), ("llvm-openmp <16", meta("2.2", 50)),
             ("typing_extensions", meta("2.2", 51)), ("sympy", meta("2.2", 52)), ("filelock", meta("2.2", 53)),
             ("networkx", meta("2.2", 54)), ("jinja2", meta("2.2", 55)), ("pyyaml", meta("2.2", 56)),
             ("blas * mkl", meta("2.2", 58)), ("pytorch-mutex 1.0 cuda", meta("2.2", 60)),
             ("pytorch-cuda >=12.1,<12.2", driver("2.2", 273))),  # torchtriton: `# [py < 312]`, :285
        host_pins=(("mkl=2023.1", meta("2.2", 25)), ("numpy=1.26.0", meta("2.2", 34)),
                   ("openssl=3.0.12", meta("2.2", 37)), ("llvmdev=9", meta("2.2", 38))),
        env={"USE_GLOO_WITH_OPENSSL": ("0", driver("2.2", "313-315")),
             "USE_STATIC_CUDNN": ("0", script("2.2", 56)), "USE_CUSPARSELT": ("1", script("2.2", 57))},
        bundled=(("libcudnn*.so.8", script("2.2", 67)), ("libcupti.so.12", script("2.2", 67)),
                 ("libcusparseLt.so.0", script("2.2", 67))),
    ),
    "2.3.1 cu118 py3.11 (triton by patch, numpy rc)": Official(
        Request("2.3.1", "11.8", "3.11", "linux-64"),
        run=(("mkl >=2018", meta("2.3", 43)), ("llvm-openmp <16", meta("2.3", 51)),
             ("typing_extensions", meta("2.3", 52)), ("sympy", meta("2.3", 53)), ("filelock", meta("2.3", 54)),
             ("networkx", meta("2.3", 55)), ("jinja2", meta("2.3", 56)), ("pyyaml", meta("2.3", 57)),
             ("blas * mkl", meta("2.3", 59)), ("pytorch-mutex 1.0 cuda", meta("2.3", 61)),
             ("pytorch-cuda >=11.8,<11.9", driver("2.3", 275)),
             ("torchtriton==2.3.1", driver("2.3", 289) + "; PyPI torch 2.3.1 METADATA triton (==2.3.1)")),
        host_pins=(("mkl=2020.2", meta("2.3", 24)), ("numpy=2.0.0rc1", meta("2.3", 33)),
                   ("openssl=1.1.1s", meta("2.3", 35)), ("llvmdev=9", meta("2.3", 37))),
        env={"USE_GLOO_WITH_OPENSSL": ("1", driver("2.3", 308)), "USE_CUSPARSELT": ("1", script("2.3", 57)),
             "TORCH_CUDA_ARCH_LIST": ("5.0;6.0;6.1;7.0;7.5;8.0;8.6;3.7+PTX;9.0", script("2.3", "55,60"))},
        bundled=(("libcudnn*.so.8", script("2.3", 62)), ("libcupti.so.11.8", script("2.3", 62)),
                 ("libcusparseLt.so.0", script("2.3", 62))),
    ),
    "2.4 cu124 py3.12": Official(
        Request("2.4.1", "12.4", "3.12", "linux-64"),
        run=(("mkl >=2018", meta("2.4", 42)), ("llvm-openmp <16", meta("2.4", 49)),
             ("typing_extensions", meta("2.4", 50)), ("sympy", meta("2.4", 51)), ("filelock", meta("2.4", 52)),
             ("networkx", meta("2.4", 53)), ("jinja2", meta("2.4", 54)), ("pyyaml", meta("2.4", 55)),
             ("blas * mkl", meta("2.4", 57)), ("pytorch-mutex 1.0 cuda", meta("2.4", 59)),
             ("pytorch-cuda >=12.4,<12.5", driver("2.4", 272)),
             ("torchtriton==3.0.0", driver("2.4", 292) + "; PyPI torch 2.4.1 METADATA triton (==3.0.0)")),
        host_pins=(("mkl=2023.1", meta("2.4", 25)), ("numpy=2.0.0rc1", meta("2.4", 32)),
                   ("openssl=3.0.12", meta("2.4", 35)), ("llvmdev=9", meta("2.4", 36))),
        env={"USE_GLOO_WITH_OPENSSL": ("0", driver("2.4", "321-323")), "USE_STATIC_CUDNN": ("0", script("2.4", 56))},
        bundled=(("libcudnn*.so.9", script("2.4", 67)), ("libcupti.so.12", script("2.4", 67)),
                 ("libcusparseLt.so.0", script("2.4", 67))),
    ),
    "2.5 cu124 win-64": Official(
        Request("2.5.1", "12.4", "3.12", "win-64"),
        run=(("mkl=2023.1", meta("2.5", 43)), ("libuv", meta("2.5", 45)), ("intel-openmp", meta("2.5", 46)),
             ("typing_extensions", meta("2.5", 50)), ("sympy", meta("2.5", 51)), ("filelock", meta("2.5", 52)),
             ("networkx", meta("2.5", 53)), ("jinja2", meta("2.5", 54)), ("pyyaml", meta("2.5", 55)),
             ("blas * mkl", meta("2.5", 57)), ("pytorch-mutex 1.0 cuda", meta("2.5", 59)),
             ("pytorch-cuda >=12.4,<12.5", driver("2.5", 272))),  # no torchtriton on msys: :285
        host_pins=(("mkl=2023.1", meta("2.5", 25)), ("mkl-devel=2023.1", meta("2.5", 26)),
                   ("numpy=2.0.1", meta("2.5", 32)), ("setuptools=72.1.0", meta("2.5", 20)),
                   ("llvmdev=9", meta("2.5", 36))),
        env={"USE_CUSPARSELT": (ABSENT, bat("2.5", "1-114")), "USE_MAGMA": (ABSENT, bat("2.5", "52-56")),
             "TORCH_NVCC_FLAGS": ("-Xfatbin -compress-all --threads 2", bat("2.5", 32)),
             "TORCH_CUDA_ARCH_LIST": ("5.0;6.0;6.1;7.0;7.5;8.0;8.6;9.0", bat("2.5", 23))},
        bundled=(("cudnn*64_*.dll*", bat("2.5", 102)), ("nvToolsExt64_*.dll*", bat("2.5", 103)),
                 ("cupti64_*.dll*", bat("2.5", 106)), ("zlibwapi.dll", bat("2.5", "109-110"))),
        static_mkl=(ABSENT, meta("2.5", 26) + " (mkl-devel in host since builder 896b6df5)"),
    ),
    "2.5 cpu": Official(
        Request("2.5.1", "cpu", "3.10", "linux-64"),
        run=(("mkl >=2018", meta("2.5", 42)), ("llvm-openmp <16", meta("2.5", 49)),
             ("typing_extensions", meta("2.5", 50)), ("sympy", meta("2.5", 51)), ("filelock", meta("2.5", 52)),
             ("networkx", meta("2.5", 53)), ("jinja2", meta("2.5", 54)), ("pyyaml", meta("2.5", 55)),
             ("blas * mkl", meta("2.5", 57)), ("pytorch-mutex 1.0 cpu", meta("2.5", 59))),
        host_pins=(("setuptools=72.1.0", meta("2.5", 20)), ("mkl=2020.2", meta("2.5", 24)),
                   ("numpy=2.0.1", meta("2.5", 32)), ("openssl=1.1.1l", meta("2.5", 33)),
                   ("llvmdev=9", meta("2.5", 36))),
        env={"USE_CUDA": ("0", driver("2.5", 253)), "USE_GLOO_WITH_OPENSSL": ("1", driver("2.5", 311)),
             "_GLIBCXX_USE_CXX11_ABI": ("0", driver("2.5", 315)),
             "USE_LLVM": ("/opt/llvm_no_cxx11_abi", script("2.5", 9))},
    ),
}


# Requirement texts read by py-rattler, in its child process (tests/rattler_in_child.py): filled for every text the
# module compares by one read before its tests (`_every_text_read_once`); a text outside it is read on its own.
_READ: dict[str, Spec] = {}


def _read(text: str) -> Spec:
    if text not in _READ:
        _READ.update(parse_specs([text]))
    return _READ[text]


def spec(text: str) -> str:
    return _read(text).text


def name_of(text: str) -> str:
    return _read(text).name


@pytest.fixture(scope="module", autouse=True)
def _every_text_read_once() -> None:
    requests = [o.request for o in CASES.values()]
    requests += [Request(p, accel, py, subdir) for p, cuda, subdir, py, _ in WHEEL_TRITON for accel in (cuda, "cpu")]
    texts = {t for r in requests for section in rendered(r)[0].values() for t in section if isinstance(t, str)}
    texts |= {t for o in CASES.values() for t, _ in (*o.run, *o.host_pins, *o.image, *([o.magma] if o.magma else []))}
    texts |= {t for *_, t in WHEEL_TRITON if t}
    _READ.update(parse_specs(sorted(texts)))


def rendered(request: Request) -> tuple[dict[str, list[str]], dict[str, str], list[str]]:
    """(requirements by section, exported environment, bundled names) of the rendered conda-build recipe."""
    variant = classify(request)
    files = render_files(pytorch_context(variant), RecipeFormat.CONDA_BUILD)
    requirements = YAML(typ="safe").load(files["meta.yaml"])["requirements"]
    env: dict[str, str] = {}
    bundled: list[str] = []
    if "bld.bat" in files:
        for line in files["bld.bat"].splitlines():
            if match := re.fullmatch(r'set "([A-Za-z_0-9]+)=(.*)"', line):
                env[match.group(1)] = match.group(2)
            if match := re.search(r'copy /y "%\w+%\\([^"]+)"', line):
                bundled.append(match.group(1))
    else:
        for line in files["build.sh"].splitlines():
            if match := re.fullmatch(r"export ([A-Za-z_0-9]+)=(.*)", line):
                env[match.group(1)] = shlex.split(match.group(2))[0]
            if match := re.fullmatch(r'for src in "\$\{\w+:-[^}]*\}"/(\S+); do', line):
                bundled.append(match.group(1))
    return requirements, env, bundled


@pytest.mark.parametrize("case", sorted(CASES))
def test_run_requirements_are_the_official_ones(case: str) -> None:
    official = CASES[case]
    requirements, _, _ = rendered(official.request)
    run = {spec(r) for r in requirements["run"] if name_of(r) != "python"}
    assert run == {spec(text) for text, _ in official.run}


@pytest.mark.parametrize("case", sorted(CASES))
def test_host_pins_are_the_official_ones(case: str) -> None:
    official = CASES[case]
    requirements, _, _ = rendered(official.request)
    pinned = {name_of(text) for text, _ in official.host_pins}
    host = {spec(r) for r in requirements["host"] if name_of(r) in pinned}
    assert host == {spec(text) for text, _ in official.host_pins}


@pytest.mark.parametrize("case", sorted(CASES))
def test_build_environment_is_the_official_one(case: str) -> None:
    official = CASES[case]
    _, env, _ = rendered(official.request)
    for name, (value, source) in official.env.items():
        if value is ABSENT:
            assert name not in env, f"{name} is set, {source} did not set it"
        else:
            # A path of upstream's build image stays overridable: ${NAME:-<upstream value>}.
            assert env.get(name) in (value, f"${{{name}:-{value}}}"), f"{name}: {source} set {value!r}"


@pytest.mark.parametrize("case", sorted(CASES))
def test_bundled_libraries_are_the_official_ones(case: str) -> None:
    official = CASES[case]
    _, _, bundled = rendered(official.request)
    assert bundled == [name for name, _ in official.bundled]


def recipe_files(request: Request) -> dict[str, str]:
    return {k: str(v) for k, v in render_files(pytorch_context(classify(request)), RecipeFormat.CONDA_BUILD).items()}


@pytest.mark.parametrize("case", sorted(CASES))
def test_what_the_build_image_provided_is_pinned_without_a_run_requirement(case: str) -> None:
    """The image's OpenSSL of the Python <= 3.9 builds before 2.1: the same version in host, its run export
    ignored; every other case ignores none."""
    official = CASES[case]
    files = recipe_files(official.request)
    meta_yaml = YAML(typ="safe").load(files["meta.yaml"])
    host = {spec(r) for r in meta_yaml["requirements"]["host"]}
    assert {spec(text) for text, _ in official.image} <= host
    assert set(meta_yaml["build"].get("ignore_run_exports", [])) == {name_of(text) for text, _ in official.image}


@pytest.mark.parametrize("case", sorted(c for c in CASES if CASES[c].magma))
def test_the_magma_build_linked_is_the_official_one(case: str) -> None:
    official = CASES[case]
    assert official.magma is not None
    requirements, _, _ = rendered(official.request)
    magma = [r for r in requirements["host"] if name_of(r).startswith("magma-cuda")]
    assert [spec(r) for r in magma] == [spec(official.magma[0])]


@pytest.mark.parametrize("case", sorted(c for c in CASES if CASES[c].static_mkl))
def test_windows_links_the_official_mkl(case: str) -> None:
    official = CASES[case]
    assert official.static_mkl is not None
    version, source = official.static_mkl
    files = recipe_files(official.request)
    _, env, _ = rendered(official.request)
    if version is ABSENT:
        assert "mkl_" not in files["bld.bat"] and "CMAKE_INCLUDE_PATH" not in env, source
    else:
        assert f"https://s3.amazonaws.com/ossci-windows/mkl_{version}.7z" in files["bld.bat"], source
        assert env["CMAKE_INCLUDE_PATH"] == r"%MKL_STATIC_DIR%\include", source
        assert env["LIB"] == r"%MKL_STATIC_DIR%\lib;%LIB%", source


def test_every_table_value_cites_its_source() -> None:
    for official in CASES.values():
        cited = [*official.run, *official.host_pins, *official.bundled, *official.image,
                 *((name, source) for name, (_, source) in official.env.items()),
                 *([official.magma] if official.magma else []),
                 *([official.static_mkl] if official.static_mkl else [])]
        for value, source in cited:
            assert re.search(r"(^B |^P |PyPI)", source) and re.search(r"[:@]\S*\d", source), (value, source)


# ---- 2.6+ (wheels only upstream): the cuDNN the recipe bundles and names is the official wheel's pin ---------
# (release, default CUDA of the PyPI wheel, nvidia-cudnn pin, nvidia-nccl pin), each from the Requires-Dist of
# the PyPI wheel `torch==X` (manylinux x86_64, cp312), read with pip's metadata-only resolve (PEP 658). The CUDA
# is the one its nvidia-cuda-runtime / cuda-toolkit pin names.
WHEEL_PINS = (
    ("2.6.0", "12.4", "9.1.0.70", "2.21.5"),
    ("2.7.0", "12.6", "9.5.1.17", "2.26.2"),
    ("2.8.0", "12.8", "9.10.2.21", "2.27.3"),
    ("2.9.0", "12.8", "9.10.2.21", "2.27.5"),
    ("2.10.0", "12.8", "9.10.2.21", "2.27.5"),
    ("2.11.0", "13.0", "9.19.0.56", "2.28.9"),
    ("2.12.0", "13.0", "9.20.0.48", "2.29.7"),
    ("2.13.0", "13.0", "9.20.0.48", "2.29.7"),
    ("2.14.0", "13.0", "9.24.0.43", "2.30.7"),
    # torch-2.15.0+cu132: cuda-toolkit[...]==13.2.2, nvidia-cudnn-cu13==9.26.0.51, nvidia-nccl-cu13==2.30.7
    ("2.15.0", "13.2", "9.26.0.51", "2.30.7"),
)


@pytest.mark.parametrize(("pytorch", "cuda", "cudnn", "nccl"), WHEEL_PINS, ids=[p[0] for p in WHEEL_PINS])
def test_beyond_conda_the_bundled_cudnn_is_the_official_wheels_pin(pytorch: str, cuda: str, cudnn: str,
                                                                   nccl: str) -> None:
    variant = classify(Request(pytorch, cuda, "3.12", "linux-64"))
    assert (variant.cudnn, variant.nccl) == (cudnn, nccl)
    assert variant.build_string == f"py3.12_cuda{cuda}_cudnn{'.'.join(cudnn.split('.')[:3])}_0"
    _, env, bundled = rendered(variant.request)
    # bundled like 2.5 (docs/inside-the-package.md, "Bundled libraries"); CUPTI comes from the cuda-cupti dependency
    assert bundled == ["libcudnn*.so.9", "libcusparseLt.so.0"] and env["USE_STATIC_CUDNN"] == "0"


def test_jetson_builds_bundle_nothing_jetpack_provides_cudnn() -> None:
    # Orin (JetPack 6.2) with 2.5.1: the linux rule would bundle cuDNN 9, CUPTI and cuSPARSELt. With --jetson
    # given, or found from the Tegra-only arch 8.7 in --arch-list, nothing is copied in.
    for options in (Options(jetson="orin"), Options(arch_list="8.7")):
        request = Request("2.5.1", "12.6", "3.10", "linux-aarch64", options)
        assert classify(request).jetson == "orin"
        assert rendered(request)[2] == []
    assert rendered(Request("2.5.1", "12.4", "3.10", "linux-aarch64"))[2]  # not Jetson: bundled as on linux-64


# ---- 2.6+: the triton the wheel requires, as conda-forge's `triton` (conda-forge's pytorch pins the same) ------
# (release, CUDA, subdir, Python, the run requirement or None), from the Requires-Dist of PyPI `torch==X`
# (manylinux x86_64, cp312; same metadata-only resolve): `triton==V; platform_system == "Linux" and
# platform_machine == "x86_64"` up to 2.10, no machine marker from 2.11, `python_version < "3.15"` from 2.13,
# `triton~=3.8.0` in 2.14, `triton~=3.9.0; platform_system == "Linux" and python_version < "3.16"` in 2.15.0 (x86_64
# and aarch64 wheels alike).
WHEEL_TRITON = (
    ("2.6.0", "12.6", "linux-64", "3.12", "triton ==3.2.0"),
    ("2.7.1", "12.8", "linux-64", "3.12", "triton ==3.3.1"),   # 2.7.0: 3.3.0
    ("2.9.0", "12.8", "linux-64", "3.12", "triton ==3.5.0"),
    ("2.9.1", "12.8", "linux-64", "3.12", "triton ==3.5.1"),
    ("2.10.0", "12.8", "linux-aarch64", "3.12", None),         # platform_machine == "x86_64"
    ("2.11.0", "13.0", "linux-aarch64", "3.12", "triton ==3.6.0"),
    ("2.12.1", "13.0", "linux-64", "3.12", "triton ==3.7.1"),  # 2.12.0: 3.7.0
    ("2.13.0", "13.0", "linux-64", "3.15", None),              # python_version < "3.15"
    ("2.14.1", "13.0", "linux-64", "3.12", "triton >=3.8.0,<3.9.0a0"),
    ("2.15.0", "13.2", "linux-64", "3.15", "triton >=3.9.0,<3.10.0a0"),       # < 3.16: 3.15 keeps it
    ("2.15.0", "13.2", "linux-aarch64", "3.11", "triton >=3.9.0,<3.10.0a0"),
)


@pytest.mark.parametrize(("pytorch", "cuda", "subdir", "python", "triton"), WHEEL_TRITON,
                         ids=[f"{p[0]}-{p[2]}-py{p[3]}" for p in WHEEL_TRITON])
def test_beyond_conda_cuda_builds_require_the_wheels_triton(pytorch: str, cuda: str, subdir: str, python: str,
                                                            triton: str | None) -> None:
    requirements, _, _ = rendered(Request(pytorch, cuda, python, subdir))
    tritons = [spec(r) for r in requirements["run"] if "triton" in name_of(r)]
    assert tritons == ([spec(triton)] if triton else [])
    cpu, _, _ = rendered(Request(pytorch, "cpu", python, subdir))
    assert not [r for r in cpu["run"] if "triton" in name_of(r)]


NVSHMEM_WHEEL = Path(__file__).parent / "fixtures" / "nvshmem_like" / "nvidia_nvshmem_cu13-3.4.5.toml"


@pytest.mark.parametrize(("pytorch", "cuda", "subdir", "exported"), [
    ("2.7.1", "12.8", "linux-64", False),     # no wheel of 2.7 links NVSHMEM
    ("2.8.0", "12.8", "linux-64", True),
    ("2.9.1", "12.8", "linux-64", True),      # PyPI torch 2.9.x METADATA: nvidia-nvshmem-cu12==3.3.20
    ("2.11.0", "13.0", "linux-64", True),     # PyPI torch 2.11.0 METADATA: nvidia-nvshmem-cu13==3.4.5
    ("2.13.0", "13.0", "linux-aarch64", True),
    ("2.13.0", "cpu", "linux-64", False),
    ("2.9.1", "12.8", "win-64", False),       # NVSHMEM has no Windows build
])
def test_beyond_conda_cuda_builds_leave_nvshmem_out(pytorch: str, cuda: str, subdir: str, exported: bool) -> None:
    """The wheels take libnvshmem_host.so.3 and its plugins from nvidia-nvshmem-cuXX; bundling them is not sound
    (licence and audit: eras.toml, docs/inside-the-package.md, "NVSHMEM is not bundled", tests/test_nvshmem_audit.py), so a build machine
    that has NVSHMEM (the manylinux2_28 images do) must not link it, and none of the wheel's files is copied."""
    _, env, bundled = rendered(Request(pytorch, cuda, "3.12", subdir))
    assert (env.get("USE_NVSHMEM") == "0") is exported and (exported or "USE_NVSHMEM" not in env)
    wheel_files = {entry["file"] for entry in tomllib.loads(NVSHMEM_WHEEL.read_text())["library"]}
    assert len(wheel_files) == 12
    assert not [name for name in bundled if fnmatch.filter(wheel_files, name) or "nvshmem" in name.lower()]
