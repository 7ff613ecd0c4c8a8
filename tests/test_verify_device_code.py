"""`torchforge verify` checks every installed package's CUDA libraries against the GPU's arch, not torch alone
(issue 32): libraries built here by the real nvcc 13.0, listed by the real cuobjdump, in a prefix whose
conda-meta records name them. No GPU here: `--gpu-arch` says which one to check for."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from tests.nvcc_libraries import LIBRARIES, MOVED, nvcc_libraries  # noqa: F401 (fixture)
from tests.test_archcheck import nvcc_library, needs_nvcc
from tests.test_verify_python import HERE, environment, forge
from torchforge.binaries.devicecode import GpuArch, runs_on
from torchforge.errors import ExitCode

# package -> (library, nvcc -gencode): SASS for sm_90 only; PTX for compute_80 only; SASS for sm_86 only.
PACKAGES = {
    "torchvision-0.20.1-py312_cu124": ("libsass90", "arch=compute_90,code=sm_90"),
    "torchaudio-2.5.1-py312_cu124": ("libptx80", "arch=compute_80,code=compute_80"),
    "torch-scatter-2.1.2-pt251_cu124_py312_0": ("libsass86", "arch=compute_86,code=sm_86"),
}


# What the probe asks of torch, answered as a CPU build does.
TORCH = "from . import version\nclass cuda:\n    is_available = staticmethod(lambda: False)\n"


@pytest.fixture
def libraries(nvcc_libraries: Path) -> Path:  # noqa: F811 (the shared fixture)
    for library, gencode in PACKAGES.values():  # what tests/nvcc_libraries.py builds them with
        assert LIBRARIES[library.removeprefix("lib")] == ("-gencode", gencode)
    return nvcc_libraries


def prefix_with(root: Path, libraries: Path, packages: list[str]) -> Path:
    """A prefix (a CPU torch stand-in, see environment(); torchvision and torchaudio modules beside it) where each
    package's record names its library under lib/."""
    prefix = environment(root, TORCH)
    site = next(prefix.glob("lib/python3*/site-packages"))
    for module in ("torchvision", "torchaudio"):
        (site / module).mkdir()
        (site / module / "__init__.py").write_text("")
        (site / module / "version.py").write_text("__version__ = '0.0+cpu'\n")
    (prefix / "lib" / "host.so").write_bytes(Path(sys.executable).resolve().read_bytes())  # an ELF, no device code
    for package in packages:
        library = PACKAGES[package][0] + ".so"
        shutil.copy(libraries / library, prefix / "lib" / library)
        record = {"name": package.rsplit("-", 2)[0], "files": [f"lib/{library}", "lib/host.so"]}
        (prefix / "conda-meta" / f"{package}.json").write_text(json.dumps(record))
    return prefix


def verify(prefix: Path, *flags: str, path: str | None = None) -> tuple[int, str, str]:
    env = {"COLUMNS": "400", **({"PATH": path} if path is not None else {})}
    result = forge("verify", str(prefix), "--python", sys.executable, "--want", "cpu", *flags, cwd=prefix.parent,
                   env=env)
    return result.returncode, " ".join(result.stdout.split()), " ".join(result.stderr.split())


@needs_nvcc
@pytest.mark.parametrize(("arch", "lacking"), [
    ("9.0", {"torch-scatter-2.1.2-pt251_cu124_py312_0": "libsass86"}),  # sm_86 SASS does not run on 9.0
    ("8.9", {"torchvision-0.20.1-py312_cu124": "libsass90"}),  # sm_86 SASS and compute_80 PTX both run on 8.9
    ("10.0", {"torchvision-0.20.1-py312_cu124": "libsass90", "torch-scatter-2.1.2-pt251_cu124_py312_0": "libsass86"}),
    ("7.5", {name: library for name, (library, _) in PACKAGES.items()}),  # PTX for 8.0 is not compiled for 7.5
])
def test_a_package_whose_library_lacks_the_gpu_arch_is_named_with_file_and_arch(
        arch: str, lacking: dict[str, str], libraries: Path, tmp_path: Path) -> None:
    prefix = prefix_with(tmp_path, libraries, list(PACKAGES))
    code, out, err = verify(prefix, "--gpu-arch", arch)
    assert code == ExitCode.AUDIT_FAILED, out + err
    sm = "sm_" + arch.replace(".", "")
    for package, (library, _) in PACKAGES.items():
        row = f"{package}: CUDA code for the GPU ({sm}, from --gpu-arch) │"
        if package in lacking:
            assert f"{row} FAILED │ no SASS or PTX for {sm} in lib/{library}.so" in out, out
            assert package.rsplit("-", 2)[0] in err
        else:
            assert f"{row} ok │ 1 library with device code for {sm}" in out, out
    assert "host.so" not in out  # no device code: not listed


@needs_nvcc
def test_a_prefix_whose_every_cuda_library_runs_on_the_gpu_passes(libraries: Path, tmp_path: Path) -> None:
    prefix = prefix_with(tmp_path, libraries, ["torchvision-0.20.1-py312_cu124", "torchaudio-2.5.1-py312_cu124"])
    code, out, err = verify(prefix, "--gpu-arch", "9.0")
    assert code == 0, out + err
    assert "torchaudio-2.5.1-py312_cu124: CUDA code for the GPU (sm_90, from --gpu-arch) │ ok" in out


@needs_nvcc
def test_without_a_gpu_or_gpu_arch_no_device_code_is_checked(libraries: Path, tmp_path: Path) -> None:
    prefix = prefix_with(tmp_path, libraries, list(PACKAGES))
    empty = tmp_path / "no-tools"
    empty.mkdir()
    code, out, err = verify(prefix, path=str(empty))  # no nvidia-smi on PATH, torch sees no GPU
    assert code == 0, out + err
    assert "CUDA code for the GPU" not in out


@needs_nvcc
def test_the_gpu_arch_is_asked_from_nvidia_smi_when_not_given(libraries: Path, tmp_path: Path) -> None:
    """No driver here, so nvidia-smi is a stand-in answering its compute_cap query as the real one prints it
    (one line per GPU); any other question fails, so the test shows the exact query verify asks."""
    prefix = prefix_with(tmp_path, libraries, list(PACKAGES))
    tools = tmp_path / "tools"
    tools.mkdir()
    smi = tools / "nvidia-smi"
    smi.write_text('#!/bin/sh\n[ "$*" = "--query-gpu=compute_cap --format=csv,noheader" ] || exit 9\n'
                   'printf "8.9\\n8.9\\n"\n')
    smi.chmod(0o755)
    code, out, err = verify(prefix, path=f"{tools}{os.pathsep}{os.environ['PATH']}")
    assert code == ExitCode.AUDIT_FAILED, out + err
    assert ("torchvision-0.20.1-py312_cu124: CUDA code for the GPU (sm_89, from nvidia-smi) │ FAILED │ "
            "no SASS or PTX for sm_89 in lib/libsass90.so") in out, out
    assert "torchaudio-2.5.1-py312_cu124: CUDA code for the GPU (sm_89, from nvidia-smi) │ ok" in out


@needs_nvcc
def test_a_record_naming_a_file_outside_the_prefix_is_not_read(libraries: Path, tmp_path: Path) -> None:
    prefix = prefix_with(tmp_path, libraries, [])
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.copy(libraries / "libsass86.so", outside / "libsass86.so")
    record = {"name": "stray", "files": ["../outside/libsass86.so", str(outside / "libsass86.so")]}
    (prefix / "conda-meta" / "stray-1-0.json").write_text(json.dumps(record))
    code, out, err = verify(prefix, "--gpu-arch", "9.0")
    assert code == 0, out + err
    assert "stray" not in out


@pytest.mark.parametrize("given", ["sm_90", "9", "9.0+PTX", ""])
def test_a_gpu_arch_that_is_not_major_minor_is_refused_before_the_probe(given: str, tmp_path: Path) -> None:
    prefix = environment(tmp_path, "raise SystemExit('the probe ran')\n")
    code, out, err = verify(prefix, "--gpu-arch", given)
    assert code == ExitCode.USAGE, out + err
    assert f"--gpu-arch {given!r} is not a compute capability MAJOR.MINOR" in err and "e.g. 9.0" in err
    assert "the probe ran" not in out + err and "Traceback" not in err


def test_arch_specific_sass_runs_only_on_its_own_arch_and_ptx_only_upwards() -> None:
    # The names as cuobjdump lists them (libk.1.sm_90a.cubin, libk.1.sm_80.ptx).
    hopper, blackwell = GpuArch(9, 0, "test"), GpuArch(10, 0, "test")
    assert runs_on(hopper, {"sm_90a"}, set()) and not runs_on(GpuArch(9, 1, "test"), {"sm_90a"}, set())
    assert runs_on(GpuArch(12, 1, "test"), {"sm_120"}, set()) and not runs_on(blackwell, {"sm_120"}, set())
    assert runs_on(blackwell, set(), {"sm_90"}) and not runs_on(hopper, set(), {"sm_100"})
    assert not runs_on(blackwell, set(), {"sm_90a"}) and runs_on(hopper, set(), {"sm_90a"})


@needs_nvcc
@pytest.mark.slow
def test_verify_reads_the_records_the_installer_wrote(tmp_path: Path) -> None:
    """A CUDA package built through the pipeline (the nvcc libraries of tests/test_archcheck.py: sm_90 SASS, and
    sm_90 SASS + compute_90 PTX), installed by py-rattler, which writes its conda-meta record: verify finds both
    libraries from that record; on a 10.0 GPU the one without PTX is named (the package still runs: its PTX does),
    on an 8.0 GPU both, and the package fails."""
    from tests.rattler_in_child import install_without_dependencies
    from tests.test_archcheck import built_through_the_pipeline

    tree = tmp_path / "tree"
    (tree / "lib").mkdir(parents=True)
    nvcc_library(tree / "lib", "sass90", ["arch=compute_90,code=sm_90"])
    nvcc_library(tree / "lib", "ptx90", ["arch=compute_90,code=[sm_90,compute_90]"])
    for source in (tree / "lib").glob("*.cu"):
        source.unlink()
    assert built_through_the_pipeline(tree, tmp_path / "built", "9.0").ok
    prefix = tmp_path / "env"
    install_without_dependencies(tmp_path / "built" / "out", "vision-like", "cuda130_0", prefix, tmp_path / "cache")
    assert (prefix / "conda-meta" / "vision-like-1.0-cuda130_0.json").is_file()
    torch = prefix / "lib" / HERE / "site-packages" / "torch"  # the probe's stand-in torch, outside any record
    torch.mkdir(parents=True)
    (torch / "__init__.py").write_text(TORCH)
    (torch / "version.py").write_text("__version__ = '2.9.0+cpu'\ncuda = None\n")
    code, out, err = verify(prefix, "--gpu-arch", "9.0")
    assert code == 0 and "vision-like-1.0-cuda130_0: CUDA code for the GPU (sm_90, from --gpu-arch) │ ok │ 2 libraries" in out, out + err
    code, out, err = verify(prefix, "--gpu-arch", "10.0")
    assert code == 0, out + err
    assert "sm_100, from --gpu-arch) │ ok │ 1 library with device code for sm_100; without code for sm_100" in out, out
    assert "lib/libsass90.so" in out and "lib/libptx90.so: PTX sm_90 x1" in out, out
    code, out, err = verify(prefix, "--gpu-arch", "8.0")
    assert code == ExitCode.AUDIT_FAILED, out + err
    assert "│ FAILED │ no SASS or PTX for sm_80 in lib/libptx90.so, lib/libsass90.so │" in out, out


@needs_nvcc
def test_a_library_whose_code_is_outside_nv_fatbin_passes_without_cuobjdump(libraries: Path, tmp_path: Path) -> None:
    """As CUDA 13's libcufft.so.12 (its sm_90 cubins in .ldata): before the fatbin reader, cuobjdump saw no code
    for sm_90 in it and verify failed the package (issue 41); now no CUDA tool is needed and the row says where."""
    prefix = prefix_with(tmp_path, libraries, [])
    shutil.copy(libraries / f"lib{MOVED}.so", prefix / "lib" / "libcufft.so.12")
    record = {"name": "nvidia-cufft", "files": ["lib/libcufft.so.12"]}
    (prefix / "conda-meta" / "nvidia-cufft-12.0.0.61-whl_py3.12_0.json").write_text(json.dumps(record))
    empty = tmp_path / "no-tools"
    empty.mkdir()
    code, out, err = verify(prefix, "--gpu-arch", "9.0", path=str(empty))
    assert code == 0, out + err
    assert ("nvidia-cufft-12.0.0.61-whl_py3.12_0: CUDA code for the GPU (sm_90, from --gpu-arch) │ ok │ 1 library "
            "with device code for sm_90; runs: lib/libcufft.so.12: cubin sm_90 x2 in .ldata") in out, out
    code, out, err = verify(prefix, "--gpu-arch", "8.0", path=str(empty))
    assert code == ExitCode.AUDIT_FAILED and "no SASS or PTX for sm_80 in lib/libcufft.so.12" in out, out + err


@needs_nvcc
def test_a_library_whose_fatbin_cannot_be_read_is_shown_as_not_listable_and_fails_nothing(
        libraries: Path, tmp_path: Path) -> None:
    prefix = prefix_with(tmp_path, libraries, ["torchvision-0.20.1-py312_cu124"])
    data = (libraries / "libsass90.so").read_bytes()
    (prefix / "lib" / "libcut.so").write_bytes(data[: data.index(b"\x50\xed\x55\xba") + 200])
    record = {"name": "cut", "files": ["lib/libcut.so"]}
    (prefix / "conda-meta" / "cut-1-0.json").write_text(json.dumps(record))
    code, out, err = verify(prefix, "--gpu-arch", "9.0")
    assert code == 0, out + err
    assert "cut-1-0: CUDA code for the GPU (sm_90, from --gpu-arch) │ ok │" in out, out
    assert "│ ok │ not listable (shown, not failed): lib/libcut.so" in out and "bytes past the" in out, out


@needs_nvcc
@pytest.mark.parametrize(("arch", "passes"), [("9.0", True), ("8.6", True), ("10.0", False), ("8.0", False)])
def test_a_package_passes_where_one_of_its_libraries_runs_and_names_the_others(
        arch: str, passes: bool, libraries: Path, tmp_path: Path) -> None:
    """As cuFFT 12.0.0.61 on the H200: libcufftw.so.12 holds one sm_75 cubin, libcufft.so.12 the whole range; a
    package of an sm_90 and an sm_86 library runs on 9.0 and 8.6 (the other named, not failed), on neither 10.0
    nor 8.0 (FAILED, both named)."""
    prefix = prefix_with(tmp_path, libraries, ["torchvision-0.20.1-py312_cu124"])
    shutil.copy(libraries / "libsass86.so", prefix / "lib" / "libsass86.so")
    record_path = prefix / "conda-meta" / "torchvision-0.20.1-py312_cu124.json"
    record = json.loads(record_path.read_text())
    record_path.write_text(json.dumps({**record, "files": [*record["files"], "lib/libsass86.so"]}))
    code, out, err = verify(prefix, "--gpu-arch", arch)
    sm = "sm_" + arch.replace(".", "")
    row = f"torchvision-0.20.1-py312_cu124: CUDA code for the GPU ({sm}, from --gpu-arch) │"
    if passes:
        other = "libsass86" if arch == "9.0" else "libsass90"
        assert code == 0, out + err
        assert f"{row} ok │ 1 library with device code for {sm}; without code for {sm} (shown, not failed" in out, out
        assert f"lib/{other}.so" in out
    else:
        assert code == ExitCode.AUDIT_FAILED, out + err
        assert f"{row} FAILED │ no SASS or PTX for {sm} in lib/libsass90.so, lib/libsass86.so" in out, out
