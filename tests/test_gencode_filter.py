"""The compile cache's nvcc wrapper keeps only the arch list that was asked for (TORCHFORGE_ARCH_LIST), whatever
-gencode list a setup.py hard-codes: the real nvcc compiles a kernel with the lists causal-conv1d 1.7.0's and
mamba-ssm 2.3.2.post1's setup.py build for CUDA 13.0 (read from their PyPI sdists in tests/fixtures/sdists), and
cuobjdump shows which SASS and PTX the object holds."""

from __future__ import annotations

import os
import re
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.test_build import cuobjdump, needs_nvcc
from torchforge.compilecache import CompileCache, find_ccache

SDISTS = Path(__file__).parent / "fixtures" / "sdists"
KERNEL = "__global__ void scale(float* x) { x[threadIdx.x] *= 2.0f; }\n"


def setup_py_gencode(sdist: str) -> list[str]:
    """The -gencode pairs a real setup.py appends (`cc_flag.append("arch=compute_75,code=sm_75")`), every one of
    them: with nvcc 13.0 each of its CUDA version conditions holds."""
    with tarfile.open(SDISTS / sdist) as tar:
        member = next(m for m in tar.getmembers() if m.name.count("/") == 1 and m.name.endswith("/setup.py"))
        text = tar.extractfile(member).read().decode()  # type: ignore[union-attr]
    pairs = re.findall(r'cc_flag\.append\("(arch=compute_\d+,code=sm_\d+)"\)', text)
    assert len(pairs) >= 6, f"{sdist}: the setup.py's gencode list was not found"
    return [word for pair in pairs for word in ("-gencode", pair)]


@pytest.fixture()
def wrapper(tmp_path: Path) -> Path:
    ccache = find_ccache()
    assert ccache is not None
    cache = CompileCache(tmp_path / "cache", "ext", ccache)
    cache.prepare()
    work = tmp_path / "work"
    work.mkdir()
    (work / "kernel.cu").write_text(KERNEL)
    return Path(cache.build_env(work, work / "stats.log")["CUDA_NVCC_EXECUTABLE"])


def compile_kernel(wrapper: Path, gencode: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    work = wrapper.parent.parent
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TORCHFORGE_")}
    return subprocess.run([str(wrapper), "-c", "kernel.cu", "-o", "kernel.o", *gencode], cwd=work,
                          env={**environ, **env}, capture_output=True, text=True)


def inside(obj: Path) -> tuple[list[str], list[str]]:
    """(SASS archs, PTX archs) of an object, as cuobjdump lists them."""
    elf = subprocess.run([cuobjdump(), "--list-elf", str(obj)], capture_output=True, text=True).stdout
    ptx = subprocess.run([cuobjdump(), "--list-ptx", str(obj)], capture_output=True, text=True).stdout
    return re.findall(r"\.(sm_\w+)\.cubin", elf), re.findall(r"\.(sm_\w+)\.ptx", ptx)


@needs_nvcc
def test_causal_conv1d_list_is_cut_to_the_one_arch_asked_for(wrapper: Path) -> None:
    gencode = setup_py_gencode("causal_conv1d-1.7.0.tar.gz")
    done = compile_kernel(wrapper, gencode, TORCHFORGE_ARCH_LIST="9.0")
    assert done.returncode == 0, done.stderr
    assert inside(wrapper.parent.parent / "kernel.o") == (["sm_90"], [])
    # the build log says what was dropped
    assert "kept sm_90; dropped sm_75 sm_80 sm_87 sm_100 sm_120 sm_103 sm_110 sm_121" in done.stderr


@needs_nvcc
def test_mamba_list_keeps_two_archs_and_the_ptx_asked_for(wrapper: Path) -> None:
    """torch's own form (-gencode=...) and nvcc's bracketed code lists are read too; +PTX adds the last arch's PTX."""
    gencode = setup_py_gencode("mamba_ssm-2.3.2.post1.tar.gz")
    joined = [f"-gencode={pair}" for pair in gencode[1::2]]
    joined[0] = "--generate-code=arch=compute_75,code=[compute_75,sm_75]"
    done = compile_kernel(wrapper, joined, TORCHFORGE_ARCH_LIST="8.0;9.0+PTX")
    assert done.returncode == 0, done.stderr
    assert inside(wrapper.parent.parent / "kernel.o") == (["sm_80", "sm_90"], ["sm_90"])
    assert "dropped compute_75 sm_75 sm_87" in done.stderr


@needs_nvcc
def test_the_user_keeps_the_setup_py_list(wrapper: Path) -> None:
    gencode = setup_py_gencode("causal_conv1d-1.7.0.tar.gz")
    done = compile_kernel(wrapper, gencode, TORCHFORGE_ARCH_LIST="9.0", TORCHFORGE_KEEP_GENCODE="1")
    assert done.returncode == 0, done.stderr
    sass, _ = inside(wrapper.parent.parent / "kernel.o")
    assert sorted(sass) == sorted(pair.rsplit("=", 1)[1] for pair in gencode[1::2])
    assert "dropped" not in done.stderr


@needs_nvcc
def test_a_call_with_none_of_the_archs_asked_for_fails_and_says_why(wrapper: Path) -> None:
    gencode = setup_py_gencode("causal_conv1d-1.7.0.tar.gz")
    done = compile_kernel(wrapper, gencode, TORCHFORGE_ARCH_LIST="8.6")
    assert done.returncode == 1
    assert "none of its -gencode archs" in done.stderr and "TORCHFORGE_KEEP_GENCODE=1" in done.stderr
    assert not (wrapper.parent.parent / "kernel.o").exists()


def test_a_named_arch_keeps_the_list_and_says_so(wrapper: Path, tmp_path: Path) -> None:
    """An arch list torchforge cannot read as numbers (a name like Ampere) filters nothing: nvcc (a stand-in
    that prints its arguments) gets the call as it was."""
    toolkit = tmp_path / "toolkit"
    (toolkit / "bin").mkdir(parents=True)
    (toolkit / "bin" / "nvcc").write_text('#!/bin/sh\necho "nvcc $*"\n')
    (toolkit / "bin" / "nvcc").chmod(0o755)
    done = compile_kernel(wrapper, ["-gencode", "arch=compute_75,code=sm_75"], TORCHFORGE_ARCH_LIST="Ampere",
                          CUDA_HOME=str(toolkit), CCACHE_DISABLE="1")
    assert "nvcc -c kernel.cu -o kernel.o -gencode arch=compute_75,code=sm_75" in done.stdout
    assert "'Ampere' is not an arch like 8.0" in done.stderr


def test_route_points_cpp_extension_nvcc_at_the_wrapper(wrapper: Path) -> None:
    """torch's cpp_extension (ninja) runs $PYTORCH_NVCC: route.sh sets it to the wrapper, and keeps a user's own."""
    route = wrapper.parent.parent / "ccache-compilers" / "route.sh"
    script = f'source "{route}"; echo "PYTORCH_NVCC=$PYTORCH_NVCC"'
    environ = {k: v for k, v in os.environ.items() if k != "PYTORCH_NVCC"}
    ours = subprocess.run(["bash", "-c", script], env=environ, capture_output=True, text=True, check=True)
    assert f"PYTORCH_NVCC={wrapper}" in ours.stdout
    own = subprocess.run(["bash", "-c", script], env={**environ, "PYTORCH_NVCC": "/opt/my/nvcc"},
                         capture_output=True, text=True, check=True)
    assert "PYTORCH_NVCC=/opt/my/nvcc" in own.stdout
