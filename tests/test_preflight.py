"""Preflight against this machine's real tools (nvcc 13.0, gcc 12, cmake, git; no conda, no GPU), real git
repositories with submodules, and small executables standing in for nvidia-smi / conda on PATH."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from torchforge.errors import DataError, ExitCode, PreflightError, RefusedError, UsageError
from torchforge.buildmemory import read_mem_available_gib
from torchforge.preflight.report import Level, Machine, PreflightReport, report_table
from torchforge.preflight.table import (
    MIN_FREE_VARIABLE, PreflightTable, choose_max_jobs, load_table, memory_jobs, parse_table)
from tests.official_report import official_report
from tests.cuda_standin import REAL_CUDA, make_stand_in_toolkit, path_without

HAVE_NVCC = shutil.which("nvcc") is not None
HAVE_GCC = shutil.which("gcc") is not None
BIG_MACHINE = Machine(cores=32, mem_available_gib=128.0, platform="linux-64")


def _release(output: str) -> str:
    return output.split("release ", 1)[1].split(",", 1)[0]


NVCC_RELEASE = _release(subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout) if HAVE_NVCC else None
GCC_MAJOR = int(subprocess.run(["gcc", "-dumpfullversion"], capture_output=True, text=True).stdout.split(".")[0]) if HAVE_GCC else None


# The folders of the libraries CUDA recipes bundle point at stand-in files (tests/conftest.py), so the checks
# other tests look at are not drowned by this machine's missing cuDNN; the bundled-library tests look at them.
pytestmark = pytest.mark.usefixtures("bundled_libraries")


def _preflight(cuda: str, *, pytorch: str = "2.9.0", python: str = "3.12", platform: str | None = None,
               engine: str = "auto", source: str | None = None, jobs: int | None = None,
               machine: Machine = BIG_MACHINE, out: Path | None = None, magma_only: bool = False) -> PreflightReport:
    return official_report(pytorch, cuda, python, platform=platform, source=source, out=out, engine=engine, jobs=jobs,
                           machine=machine, magma_only=magma_only)


def _executable(folder: Path, name: str, body: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("#!/bin/sh\n" + body, encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


# ---- MAX_JOBS (pure) -------------------------------------------------------------------------------------


def test_max_jobs_is_limited_by_memory_for_nvcc() -> None:
    # 64 GiB, 8 GiB per nvcc job after a 2 GiB reserve: 7 jobs, although 62 cores would allow the CI cap of 18
    assert choose_max_jobs(64, 64.0, cuda=True) == 7
    assert memory_jobs(64.0, cuda=True) == 7


def test_max_jobs_is_capped_like_the_official_ci() -> None:
    assert choose_max_jobs(64, 512.0, cuda=True) == 18  # min(nproc-2, 18)
    assert choose_max_jobs(12, 512.0, cuda=True) == 10  # nproc - 2
    assert choose_max_jobs(64, 512.0, cuda=True, aarch64=True) == 5  # aarch64 CUDA: 5
    assert choose_max_jobs(64, 512.0, cuda=False, aarch64=True) == 18  # the aarch64 cap is for CUDA builds


def test_cpu_builds_budget_less_memory_per_job() -> None:
    assert choose_max_jobs(16, 34.0, cuda=False) == 8  # (34-2)/4
    assert choose_max_jobs(16, 34.0, cuda=True) == 4  # (34-2)/8


def test_max_jobs_is_never_below_one() -> None:
    assert choose_max_jobs(2, 512.0, cuda=True) == 1  # 2 cores - 2 reserved
    assert choose_max_jobs(16, 4.0, cuda=True) == 1  # memory for 0 jobs: still 1, with a warning in the report
    assert memory_jobs(4.0, cuda=True) == 0


def test_unknown_memory_falls_back_to_cores() -> None:
    assert choose_max_jobs(8, None, cuda=True) == 6


def test_mem_available_is_read_from_meminfo(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24575556 kB\nMemFree:        23011036 kB\nMemAvailable:   23428112 kB\n", encoding="ascii")
    assert read_mem_available_gib(meminfo) == pytest.approx(23428112 / 1024**2)
    assert read_mem_available_gib(tmp_path / "missing") is None


def test_the_data_table_says_where_its_numbers_come_from() -> None:
    table = load_table()
    assert "official-builds.md §3.2" in table.meta.source and "seed 001" in table.meta.source
    assert set(table.tools) == {"cmake", "git", "patchelf"}


def test_a_bad_preflight_table_is_a_data_error() -> None:
    text = (Path(__file__).parent.parent / "torchforge" / "data" / "preflight.toml").read_text(encoding="utf-8")
    with pytest.raises(DataError, match="gib_per_job_cuda must be positive"):
        parse_table(text.replace("gib_per_job_cuda = 8.0", "gib_per_job_cuda = 0.0"))
    with pytest.raises(DataError, match="does not match its schema"):
        parse_table(text.replace("[disk]", "[disks]"))


# ---- nvcc and host compiler against the real toolchain ---------------------------------------------------


@pytest.mark.skipif(not (HAVE_NVCC and HAVE_GCC), reason="needs nvcc and gcc on PATH")
def test_the_machines_own_cuda_passes_nvcc_and_compiler_checks() -> None:
    report = _preflight(NVCC_RELEASE or "")
    nvcc = report.check(f"nvcc (CUDA {NVCC_RELEASE})")
    assert nvcc.status is Level.OK and f"release {NVCC_RELEASE}" in nvcc.detail
    assert report.check(f"host compiler (CUDA {NVCC_RELEASE})").status is Level.OK
    assert report.engine in ("conda-build", "rattler-build")


@pytest.mark.skipif(NVCC_RELEASE == "11.8" or GCC_MAJOR is None or GCC_MAJOR <= 11, reason="needs nvcc != 11.8 and gcc > 11")
def test_cuda_11_8_reports_nvcc_mismatch_and_gcc_too_new_together() -> None:
    report = _preflight("11.8", pytorch="2.5.1", python="3.10")
    nvcc = report.check("nvcc (CUDA 11.8)")
    gcc = report.check("host compiler (CUDA 11.8)")
    assert nvcc.status is Level.FAIL and "needs CUDA 11.8" in nvcc.detail and "cuda-11.8" in (nvcc.fix or "")
    assert gcc.status is Level.FAIL and "GCC <= 11" in gcc.detail and "gcc-11" in (gcc.fix or "")
    assert not report.ok
    # everything else was still checked
    assert {"cmake", "git", "patchelf", "disk", "MAX_JOBS", "source", "driver"} <= {c.name for c in report.checks}
    with pytest.raises(PreflightError, match=r"checks failed \(nvcc \(CUDA 11.8\), host compiler \(CUDA 11.8\)"):
        report.raise_if_failed()


def test_cpu_only_selection_checks_no_cuda_toolchain() -> None:
    report = _preflight("cpu", pytorch="2.5.1", python="3.10")
    names = {c.name for c in report.checks}
    assert not any(n.startswith(("nvcc", "host compiler", "driver")) for n in names)


def test_a_missing_nvcc_is_reported_with_its_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("gcc", "cmake", "git"):
        if shutil.which(tool):
            (bin_dir / tool).symlink_to(shutil.which(tool) or "")
    monkeypatch.setenv("PATH", str(bin_dir))
    check = _preflight("13.0").check("nvcc (CUDA 13.0)")
    assert check.status is Level.FAIL and check.detail == "nvcc is not on PATH"


def test_git_is_needed_only_to_clone_a_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A CI job in an image without git builds a local --source (found running the emitted GitLab pipeline in
    the local Debian images, which carry no git); the upstream default is cloned, so there git must exist."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("gcc", "cmake"):
        if shutil.which(tool):
            (bin_dir / tool).symlink_to(shutil.which(tool) or "")
    monkeypatch.setenv("PATH", str(bin_dir))
    local = _preflight("cpu", source=str(Path(__file__).parent / "fixtures" / "torch_like")).check("git")
    assert local.status is Level.OK and local.detail.startswith("not needed: no source is cloned")
    cloned = _preflight("cpu").check("git")
    assert cloned.status is Level.FAIL and cloned.fix == "install git (apt install git)"


# ---- CUDA libraries --------------------------------------------------------------------------------------


@pytest.mark.skipif(not HAVE_NVCC, reason="needs nvcc")
def test_a_toolkit_without_cublas_fails_with_what_would_fix_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The machine's nvcc without cuBLAS and cuSPARSE (and no cuDNN): the project's machines, made the same way on
    # one whose toolkit has them, so this runs (and means the same) on both.
    toolkit = make_stand_in_toolkit(tmp_path / "cuda", cublas=False)
    monkeypatch.setenv("CUDA_HOME", str(toolkit))
    for variable in ("CUDNN_INCLUDE_DIR", "CUDNN_LIB_DIR"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr("torchforge.preflight.load_table", _without_system_cudnn(tmp_path / "system"))
    report = _preflight(NVCC_RELEASE or "")
    cublas, cusparse = report.check(f"cuBLAS (CUDA {NVCC_RELEASE})"), report.check(f"cuSPARSE (CUDA {NVCC_RELEASE})")
    assert cublas.status is Level.FAIL and f"not found in the toolkit at {toolkit}" in cublas.detail
    assert "needed by magma and pytorch" in cublas.detail
    dash = (NVCC_RELEASE or "").replace(".", "-")
    assert f"libcublas-dev-{dash}" in (cublas.fix or "") and f"libcusparse-dev-{dash}" in (cusparse.fix or "")
    cudnn = report.check(f"cuDNN (CUDA {NVCC_RELEASE})")
    assert cudnn.status is Level.FAIL and "CUDNN_INCLUDE_DIR" in (cudnn.fix or "")
    magma_only = _preflight(NVCC_RELEASE or "", magma_only=True)
    assert not any(c.name.startswith("cuDNN") for c in magma_only.checks)  # MAGMA does not link cuDNN


@pytest.mark.skipif(not HAVE_NVCC, reason="needs nvcc")
def test_a_complete_toolkit_and_cudnn_from_its_own_folders_pass(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    toolkit = make_stand_in_toolkit(tmp_path / "cuda")
    monkeypatch.setenv("CUDA_HOME", str(toolkit))
    cudnn = make_stand_in_toolkit(tmp_path / "cudnn-home", cudnn=True)  # cuDNN elsewhere, as PyTorch allows
    monkeypatch.setenv("CUDNN_INCLUDE_DIR", str(cudnn / "include"))
    monkeypatch.setenv("CUDNN_LIB_DIR", str(cudnn / "lib"))
    report = _preflight(NVCC_RELEASE or "")
    for name in ("cuBLAS", "cuSPARSE", "cuDNN"):
        assert report.check(f"{name} (CUDA {NVCC_RELEASE})").status is Level.OK, report.check(f"{name} (CUDA {NVCC_RELEASE})")
    # Without CUDNN_LIB_DIR only the system folders are left: empty ones fail, ones holding cuDNN pass, on any
    # machine (the table's real system folders are replaced by folders of this test).
    monkeypatch.delenv("CUDNN_LIB_DIR")
    system = tmp_path / "system"
    monkeypatch.setattr("torchforge.preflight.load_table", _without_system_cudnn(system))
    assert _preflight(NVCC_RELEASE or "").check(f"cuDNN (CUDA {NVCC_RELEASE})").status is Level.FAIL
    (system / "lib" / "libcudnn.so").symlink_to(cudnn / "lib" / "libcudnn.so")
    assert _preflight(NVCC_RELEASE or "").check(f"cuDNN (CUDA {NVCC_RELEASE})").status is Level.OK


def _without_system_cudnn(system: Path) -> Callable[[], PreflightTable]:
    """load_table with cuDNN's system folders replaced by `system`/include and `system`/lib (made empty)."""
    (system / "include").mkdir(parents=True, exist_ok=True)
    (system / "lib").mkdir(parents=True, exist_ok=True)
    table = load_table()
    cudnn = table.cuda_libraries["cuDNN"].model_copy(update={"system_include": (str(system / "include"),),
                                                             "system_library": (str(system / "lib"),)})
    changed = table.model_copy(update={"cuda_libraries": {**table.cuda_libraries, "cuDNN": cudnn}})
    return lambda: changed


# ---- tools -----------------------------------------------------------------------------------------------


@pytest.mark.skipif(not (HAVE_NVCC and HAVE_GCC and shutil.which("git")), reason="needs nvcc, gcc and git")
def test_a_path_without_cmake_reports_cmake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("nvcc", "gcc", "git"):
        (bin_dir / tool).symlink_to(shutil.which(tool) or "")
    monkeypatch.setenv("CUDA_HOME", str(make_stand_in_toolkit(tmp_path / "cuda", cudnn=True)))
    monkeypatch.setenv("PATH", str(bin_dir))
    report = _preflight(NVCC_RELEASE or "")
    cmake = report.check("cmake")
    assert cmake.status is Level.FAIL and "cmake" in cmake.detail and "install cmake" in (cmake.fix or "")
    assert report.check("git").status is Level.OK
    assert report.check(f"nvcc (CUDA {NVCC_RELEASE})").status is Level.OK
    assert [c.name for c in report.failures] == ["cmake"]


# ---- engine ----------------------------------------------------------------------------------------------


def test_engine_auto_without_conda_is_the_embedded_rattler_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import rattler_build

    monkeypatch.setenv("PATH", path_without("conda", tmp_path / "bin"))  # as on a machine without conda

    report = _preflight("cpu", pytorch="2.5.1", python="3.10")
    assert report.engine == "rattler-build"
    assert rattler_build.rattler_build_version() in report.check("engine").detail
    forced = _preflight("cpu", pytorch="2.5.1", python="3.10", engine="conda-build")
    assert forced.check("engine").status is Level.FAIL and "--engine rattler-build" in (forced.check("engine").fix or "")


def test_engine_auto_prefers_conda_build_when_conda_has_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A stand-in `conda` that answers `conda build --version` the way conda-build does.
    _executable(tmp_path / "bin", "conda", 'if [ "$1 $2" = "build --version" ]; then echo "conda-build 24.9.0"; exit 0; fi\nexit 1\n')
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    report = _preflight("cpu", pytorch="2.5.1", python="3.10")
    assert report.engine == "conda-build"
    assert report.check("engine").detail.startswith("conda-build 24.9.0")


def test_unknown_engine_fails() -> None:
    assert _preflight("cpu", pytorch="2.5.1", python="3.10", engine="make").check("engine").status is Level.FAIL


# ---- disk, jobs, platform, selection ---------------------------------------------------------------------


def test_disk_check_uses_the_out_folders_file_system(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MIN_FREE_VARIABLE)  # the data's estimate, as for a user who set nothing
    report = _preflight("cpu", pytorch="2.5.1", python="3.10", out=tmp_path / "not" / "yet" / "there")
    assert str(tmp_path) in report.check("disk").detail
    strict = load_table().model_copy(update={"disk": load_table().disk.model_copy(update={"min_free_gib_cpu": 1e9})})
    monkeypatch.setattr("torchforge.preflight.load_table", lambda: strict)
    failed = _preflight("cpu", pytorch="2.5.1", python="3.10", out=tmp_path).check("disk")
    assert failed.status is Level.FAIL and "estimate" in (failed.fix or "")


def test_the_free_space_a_build_needs_can_be_set_in_the_environment(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    free = shutil.disk_usage(tmp_path).free / 1024**3
    monkeypatch.setenv(MIN_FREE_VARIABLE, f"{free * 4:.0f}")  # more than there is: the row fails and says why
    failed = _preflight("13.0", out=tmp_path).check("disk")
    assert failed.status is Level.FAIL and f"need {free * 4:.0f} GiB" in failed.detail
    assert MIN_FREE_VARIABLE in (failed.fix or "") and "estimate" not in (failed.fix or "")
    monkeypatch.setenv(MIN_FREE_VARIABLE, "0.5")  # less than there is: a CUDA plan passes whatever the table says
    assert _preflight("13.0", out=tmp_path).check("disk").status is Level.OK
    for bad in ("lots", "-3", "nan", "inf"):
        monkeypatch.setenv(MIN_FREE_VARIABLE, bad)
        with pytest.raises(UsageError, match=f"{MIN_FREE_VARIABLE}='{bad}' is not a number of GiB") as raised:
            _preflight("13.0", out=tmp_path)
        assert raised.value.exit_code == 2 and "unset it" in (raised.value.hint or "")


def test_jobs_override_is_used_and_warned_when_memory_does_not_allow_it() -> None:
    small = Machine(cores=32, mem_available_gib=34.0, platform="linux-64")  # 4 nvcc jobs fit
    report = _preflight("13.0", jobs=16, machine=small)
    assert report.max_jobs == 16
    check = report.check("MAX_JOBS")
    assert check.status is Level.WARN and "--jobs 4" in (check.fix or "")
    fine = _preflight("13.0", jobs=3, machine=small)
    assert fine.max_jobs == 3 and fine.check("MAX_JOBS").status is Level.OK


def test_memory_based_max_jobs_lands_in_the_report() -> None:
    report = _preflight("13.0", machine=Machine(cores=32, mem_available_gib=34.0, platform="linux-64"))
    assert report.max_jobs == 4
    assert "limited by memory" in report.check("MAX_JOBS").detail
    starved = _preflight("13.0", machine=Machine(cores=32, mem_available_gib=5.0, platform="linux-64"))
    assert starved.max_jobs == 1 and starved.check("MAX_JOBS").status is Level.WARN


def test_a_foreign_platform_fails_and_skips_the_gcc_check() -> None:
    # A CUDA variant: on linux-64 the host compiler is checked against nvcc's limit; on win-64 (MSVC) it is not.
    linux = _preflight("12.4", pytorch="2.5.1", python="3.12", platform="linux-64")
    assert "host compiler (CUDA 12.4)" in {c.name for c in linux.checks}
    report = _preflight("12.4", pytorch="2.5.1", python="3.12", platform="win-64")
    assert report.check("platform").status is Level.FAIL
    assert "asked for win-64" in report.check("platform").detail
    assert not [c.name for c in report.checks if c.name.startswith("host compiler")]


def test_a_refused_variant_is_refused_before_the_machine_is_checked() -> None:
    # CUDA 10.2 is not a build of PyTorch 2.9: refused (exit 4) with its reason, as every command refuses it; a
    # buildable selection's first row says what it plans.
    with pytest.raises(RefusedError) as refused:
        _preflight("10.2")
    assert refused.value.exit_code == ExitCode.REFUSED and "10.2" in str(refused.value)
    first = _preflight("13.0").checks[0]
    assert (first.name, first.status, first.detail) == ("selection", Level.OK, "1 variant(s), 1 magma package(s)")


# ---- source tree -----------------------------------------------------------------------------------------


def _git(*args: str, cwd: Path) -> None:
    subprocess.run(["git", "-c", "protocol.file.allow=always", "-c", "user.email=t@t", "-c", "user.name=t",
                    "-c", "init.defaultBranch=main", *args], cwd=cwd, check=True, capture_output=True)


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_source_with_submodules_not_checked_out_fails_until_updated(tmp_path: Path) -> None:
    dep = tmp_path / "dep"
    dep.mkdir()
    _git("init", cwd=dep)
    (dep / "CMakeLists.txt").write_text("project(dep)\n", encoding="utf-8")
    _git("add", ".", cwd=dep)
    _git("commit", "-m", "dep", cwd=dep)
    upstream = tmp_path / "upstream"
    upstream.mkdir()
    _git("init", cwd=upstream)
    (upstream / "setup.py").write_text("", encoding="utf-8")  # a source tree (preflight refuses any other folder)
    _git("add", "setup.py", cwd=upstream)
    _git("submodule", "add", str(dep), "third_party/dep", cwd=upstream)
    _git("commit", "-m", "with submodule", cwd=upstream)
    clone = tmp_path / "clone"
    _git("clone", str(upstream), str(clone), cwd=tmp_path)  # no --recursive: third_party/dep stays empty

    check = _preflight("cpu", pytorch="2.5.1", python="3.10", source=str(clone)).check("source")
    assert check.status is Level.FAIL
    assert "1 of 1 submodules not checked out: third_party/dep" in check.detail
    assert "git submodule update --init --recursive" in (check.fix or "")

    _git("submodule", "update", "--init", "--recursive", cwd=clone)
    check = _preflight("cpu", pytorch="2.5.1", python="3.10", source=str(clone)).check("source")
    assert check.status is Level.OK and "all 1 submodules" in check.detail


def test_source_without_gitmodules_checks_third_party(tmp_path: Path) -> None:
    (tmp_path / "third_party" / "gloo").mkdir(parents=True)
    (tmp_path / "third_party" / "fmt").mkdir()
    (tmp_path / "third_party" / "fmt" / "CMakeLists.txt").write_text("", encoding="utf-8")
    (tmp_path / "setup.py").write_text("", encoding="utf-8")
    check = _preflight("cpu", pytorch="2.5.1", python="3.10", source=str(tmp_path)).check("source")
    assert check.status is Level.FAIL and "gloo" in check.detail and "fmt" not in check.detail


def test_missing_source_path_fails_and_urls_are_not_checked(tmp_path: Path) -> None:
    assert _preflight("cpu", pytorch="2.5.1", python="3.10", source=str(tmp_path / "nope")).check("source").status is Level.FAIL
    url = _preflight("cpu", pytorch="2.5.1", python="3.10", source="https://example.invalid/pytorch.tar.gz").check("source")
    assert url.status is Level.OK


# ---- driver via a stand-in nvidia-smi ----------------------------------------------------------------------

# seed 004 ran driver 535.98; the stand-in answers the query the way nvidia-smi's csv,noheader format does.
_SMI_535 = 'echo "535.98, NVIDIA GeForce RTX 3090"\n'


def _smi_path(tmp_path: Path, body: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _executable(tmp_path / "smi", "nvidia-smi", body)
    monkeypatch.setenv("PATH", f"{tmp_path / 'smi'}{os.pathsep}{os.environ['PATH']}")


def test_no_nvidia_smi_is_not_a_problem_for_building(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", path_without("nvidia-smi", tmp_path / "bin"))  # as on a machine without a GPU driver
    driver = _preflight("13.0").check("driver")
    assert driver.status is Level.OK and "no nvidia-smi" in driver.detail


def test_driver_535_against_cuda_12_8_and_13_0(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)
    _smi_path(tmp_path, _SMI_535, monkeypatch)
    report = _preflight("12.8,13.0")
    minor = report.check("driver (CUDA 12.8)")
    assert minor.status is Level.WARN
    assert "535.98 < 570.124.06" in minor.detail and "minor-version" in minor.detail and "error 222" in minor.detail
    too_old = report.check("driver (CUDA 13.0)")
    assert too_old.status is Level.WARN and "error 35" in too_old.detail
    assert "error 804" in (too_old.fix or "") and "error 803" in (too_old.fix or "")


def test_driver_new_enough_is_ok_but_a_compat_libcuda_on_the_path_warns_of_804(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _smi_path(tmp_path, 'echo "580.95.05, NVIDIA GeForce RTX 5090"\n', monkeypatch)
    monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)
    assert _preflight("13.0").check("driver (CUDA 13.0)").status is Level.OK
    monkeypatch.setenv("LD_LIBRARY_PATH", "/usr/local/cuda/compat:/usr/lib")
    check = _preflight("13.0").check("driver (CUDA 13.0)")
    assert check.status is Level.WARN and "error 804" in check.detail and "/usr/local/cuda/compat" in check.detail


def test_nvml_mismatch_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _smi_path(tmp_path, 'echo "Failed to initialize NVML: Driver/library version mismatch"\nexit 18\n', monkeypatch)
    check = _preflight("13.0").check("driver")
    assert check.status is Level.FAIL and "reboot" in (check.fix or "")


# ---- the table -------------------------------------------------------------------------------------------


def test_report_table_has_one_row_per_check() -> None:
    report = _preflight("cpu", pytorch="2.5.1", python="3.10")
    table = report_table(report)
    assert table.row_count == len(report.checks) > 5
    columns = {column.header: list(column.cells) for column in table.columns}
    # Row i is check i: its name, its status word and its detail, in that order.
    assert columns["check"] == [c.name for c in report.checks]
    assert [cell.split("]")[1].split("[")[0] for cell in columns["status"]] == [c.status.value for c in report.checks]
    assert columns["detail"] == [c.detail for c in report.checks]
    assert columns["what would work"] == [c.fix or "" for c in report.checks]
    assert f"MAX_JOBS {report.max_jobs}" in str(table.title)


# ---- bundled libraries -----------------------------------------------------------------------------------


def test_bundled_libraries_found_in_their_folders(bundled_libraries: Path) -> None:
    report = _preflight("12.4", pytorch="2.5.1")
    checks = {c.name: c for c in report.checks if c.name.startswith("bundled ")}
    assert list(checks) == ["bundled libcudnn*.so.9", "bundled libcupti.so.12", "bundled libcusparseLt.so.0"]
    assert all(c.status is Level.OK and str(bundled_libraries) in c.detail for c in checks.values())


def test_a_missing_bundled_library_fails_before_the_build_and_names_the_variable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "libcudnn.so.8").touch()  # cuDNN 8 where the 2.5 recipe bundles cuDNN 9
    monkeypatch.setenv("CUDNN_LIB_DIR", str(tmp_path))
    report = _preflight("12.4", pytorch="2.5.1")
    check = report.check("bundled libcudnn*.so.9")
    assert check.status is Level.FAIL and str(tmp_path) in check.detail and "CUDNN_LIB_DIR" in (check.fix or "")
    assert report.check("bundled libcupti.so.12").status is Level.OK
    with pytest.raises(PreflightError, match=r"bundled libcudnn\*\.so\.9"):
        report.raise_if_failed()


def test_cpu_and_static_cudnn_variants_bundle_nothing() -> None:
    for report in (_preflight("cpu", pytorch="2.5.1"), _preflight("11.3", pytorch="1.10.2", python="3.9")):
        assert not [c for c in report.checks if c.name.startswith("bundled ")]


# ---------------------------------------------------------------- what a dry run checks: no tool, only paths

def _dry_run(*args: str, wrap: str | None = None) -> "subprocess.CompletedProcess[str]":
    import shlex
    import sys

    from tests.test_upload_helpers import ROOT, cli_env

    argv = [sys.executable, "-m", "torchforge.cli", "build", "--dry-run", "--pytorch", "2.5.1", "--cuda", "cpu",
            "--py", "3.11", *args]
    if wrap is not None:  # a shell line run first in a private user and mount namespace
        argv = ["unshare", "-rm", "sh", "-c", f"{wrap} && exec {shlex.join(argv)}"]
    return subprocess.run(argv, env=cli_env(), cwd=ROOT, capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)


def table_rows(printed: str) -> dict[str, str]:
    """check -> its detail, from the preflight table as printed (220 columns when not a terminal): a detail
    wrapped over several lines is joined, so a message does not depend on where a long path made it wrap."""
    rows: dict[str, str] = {}
    name = ""
    for line in printed.splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if len(cells) >= 3:
            name = cells[0] or name
            rows[name] = " ".join(filter(None, (rows.get(name, ""), cells[2])))
    return rows


@pytest.mark.parametrize("kind", ["empty folder", "empty file", "no setup.py"])
def test_an_unusable_source_fails_preflight_even_in_a_dry_run(kind: str, tmp_path: Path) -> None:
    source = tmp_path / "src"
    if kind == "empty file":
        source.write_bytes(b"")
    else:
        source.mkdir()
        if kind == "no setup.py":
            (source / "README.md").write_text("notes\n")
    done = _dry_run("--source", str(source), "--out", str(tmp_path / "ch"))
    assert done.returncode == 9, done.stderr
    expected = {"empty folder": "is an empty folder", "empty file": "is an empty file",
                "no setup.py": "has no setup.py or pyproject.toml"}[kind]
    assert expected in " ".join(done.stderr.split()), done.stderr
    assert not (tmp_path / "ch").exists()


def test_a_dry_run_for_a_platform_this_host_cannot_build_fails_preflight(tmp_path: Path) -> None:
    done = _dry_run("--platform", "osx-arm64", "--out", str(tmp_path / "ch"))
    assert done.returncode == 9, done.stderr
    assert "asked for osx-arm64" in " ".join(done.stderr.split())


def test_a_dry_run_into_a_read_only_out_fails_preflight(tmp_path: Path) -> None:
    mount = tmp_path / "ro"
    mount.mkdir()
    done = _dry_run("--out", str(mount / "ch"), wrap=f"mount -t tmpfs -o ro tmpfs {mount}")
    assert done.returncode == 9, done.stderr
    # the detail names tmp_path twice, and wraps where its length (pytest's numbering) makes it wrap
    assert table_rows(done.stderr)["output folder"].endswith(f"{mount} is on a read-only file system"), done.stderr


def test_a_dry_run_of_a_good_request_still_passes(tmp_path: Path) -> None:
    done = _dry_run("--source", str(Path(__file__).parent / "fixtures" / "torch_like"), "--out", str(tmp_path / "ch"))
    assert done.returncode == 0, done.stderr
