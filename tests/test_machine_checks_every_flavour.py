"""The machine checks run for the conda-forge flavour as for the official one (issue 30): `doctor` and `build`
fail before anything compiles where the build would, with the official flavour's exit codes, and `--jobs` sets
the builds' MAX_JOBS. Real CLI in a new process, real release names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.test_upload_helpers import cli
from torchforge import localchannel, sequence
from torchforge.config import load as load_site
from torchforge.flavours import Request
from torchforge.preflight import run_machine_checks
from torchforge.preflight.report import Machine, PreflightReport
from torchforge.preflight.table import load_table
from torchforge.proc import Runner

CONDA_FORGE = ("--pytorch", "2.13.0", "--cuda", "13.0", "--arch-list", "9.0", "--py", "3.12")
OFFICIAL = ("--pytorch", "2.5.1", "--cuda", "cpu", "--py", "3.12")


def air_gapped(tmp_path: Path) -> Path:
    """A site config that replaces every data channel with one indexed local channel (answers without network)."""
    channel = tmp_path / "mirror"
    channel.mkdir()
    localchannel.index(channel)
    config = tmp_path / "torchforge.toml"
    config.write_text(f'[channels]\nreplace = ["file://{channel}"]\n')
    return config


def checks(stdout: str) -> dict[str, dict[str, object]]:
    return {c["name"]: c for c in json.loads(stdout)["checks"]}


def test_conda_forge_doctor_passes_with_its_channel_answering(tmp_path: Path) -> None:
    result = cli("doctor", *CONDA_FORGE, "--json", "--config", str(air_gapped(tmp_path)), "--out", str(tmp_path / "o"))
    assert result.returncode == 0, result.stdout + result.stderr
    found = checks(result.stdout)
    assert found["flavour"]["detail"] == "conda-forge: 1 recipe(s), libtorch-2.13.0-cuda130-sm90-linux_64"
    assert found[f"channel file://{tmp_path / 'mirror'}"]["status"] == "ok"
    for name in ("platform", "engine", "output folder", "disk", "MAX_JOBS", "source"):
        assert found[name]["status"] == "ok", found[name]
    # conda-forge's nvcc is its cuda-nvcc package in the build environment, not this machine's
    assert not [name for name in found if name.startswith("nvcc")]


@pytest.mark.parametrize("flags", [CONDA_FORGE, OFFICIAL], ids=["conda-forge", "official"])
def test_doctor_fails_a_missing_source_with_the_preflight_exit_code(tmp_path: Path, flags: tuple[str, ...]) -> None:
    result = cli("doctor", *flags, "--source", str(tmp_path / "nonexistent"), "--config", str(air_gapped(tmp_path)),
                 "--out", str(tmp_path / "o"), "--json")
    assert result.returncode == 9, result.stdout + result.stderr
    source = checks(result.stdout)["source"]
    assert (source["status"], source["detail"]) == ("fail", f"{tmp_path / 'nonexistent'} does not exist")
    assert "source" in result.stderr.split("checks failed (", 1)[1]


@pytest.mark.parametrize("flags", [CONDA_FORGE, OFFICIAL], ids=["conda-forge", "official"])
def test_doctor_refuses_an_out_that_is_a_file(tmp_path: Path, flags: tuple[str, ...]) -> None:
    taken = tmp_path / "channel.txt"
    taken.write_text("not a channel\n")
    result = cli("doctor", *flags, "--out", str(taken), "--config", str(air_gapped(tmp_path)))
    assert result.returncode == 10, result.stdout + result.stderr  # errors.ExitCode.FILESYSTEM
    assert f"--out {taken} is a file" in result.stderr


def test_conda_forge_doctor_fails_when_its_channel_does_not_answer(tmp_path: Path) -> None:
    config = tmp_path / "torchforge.toml"
    config.write_text(f'[channels]\nreplace = ["file://{tmp_path / "gone"}"]\n')
    result = cli("doctor", *CONDA_FORGE, "--json", "--config", str(config), "--out", str(tmp_path / "o"))
    assert result.returncode == 9, result.stdout + result.stderr
    found = checks(result.stdout)
    assert found[f"channel file://{tmp_path / 'gone'}"] == {
        "name": f"channel file://{tmp_path / 'gone'}", "status": "fail",
        "detail": f"the folder {tmp_path / 'gone'} does not exist", "fix": found[f"channel file://{tmp_path / 'gone'}"]["fix"]}


def test_conda_forge_build_checks_the_machine_before_the_engine_runs(tmp_path: Path) -> None:
    out = tmp_path / "o"
    result = cli("build", *CONDA_FORGE, "--source", str(tmp_path / "nonexistent"), "--config",
                 str(air_gapped(tmp_path)), "--out", str(out), "--no-cache")
    assert result.returncode == 9, result.stdout + result.stderr
    assert "checks failed (source)" in result.stderr
    assert not (out / "recipes").exists()  # nothing was rendered for the engine


def test_jobs_sets_max_jobs_of_a_conda_forge_build(tmp_path: Path) -> None:
    out = tmp_path / "o"
    result = cli("build", "--pytorch", "2.13.0", "--cuda", "cpu", "--py", "3.12", "--jobs", "3", "--dry-run",
                 "--engine", "conda-build", "--out", str(out), "--no-cache")
    assert result.returncode == 0, result.stdout + result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("[dry-run]") and " conda build " in line]
    assert line.startswith("[dry-run] MAX_JOBS=3 conda build "), line


def _toolkit_rows(report: PreflightReport) -> list[tuple[str, str, str, str | None]]:
    """The rows of the checks of what the official flavour's build.sh takes from this machine."""
    prefixes = ("host compiler", "cuBLAS", "cuSPARSE", "cuDNN", "bundled ", "image (CUDA", "source",
                *load_table().tools)
    return [(c.name, c.status.value, c.detail, c.fix) for c in report.checks if c.name.startswith(prefixes)]


def test_the_official_plan_carries_its_toolkit_checks_as_neutral_needs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The official flavour's checks of this machine's CUDA libraries and of the files its recipes bundle read the
    neutral plan (MachineNeeds.cuda_uses, .host_libraries), not its variants (issue 30): the shared machine checks
    of the official plan give exactly the official preflight's rows. A toolkit with every library but cuBLAS, and
    cuDNN and NCCL where CUDNN_LIB_DIR and NCCL's variable say, as a user lays them out."""
    toolkit, cudnn = tmp_path / "cuda", tmp_path / "cudnn"
    for folder in (toolkit / "include", toolkit / "lib64", cudnn / "include", cudnn / "lib"):
        folder.mkdir(parents=True)
    for name, library in load_table().cuda_libraries.items():
        if name != "cuBLAS":
            root = cudnn if name == "cuDNN" else toolkit
            for header in library.headers:
                (root / "include" / header).write_text("/* stand-in */\n")
            for file in library.libraries:
                (root / ("lib" if name == "cuDNN" else "lib64") / f"{file}.9").write_bytes(b"\x7fELF")
    monkeypatch.setenv("CUDA_HOME", str(toolkit))
    monkeypatch.setenv("CUDNN_INCLUDE_DIR", str(cudnn / "include"))
    monkeypatch.setenv("CUDNN_LIB_DIR", str(cudnn / "lib"))
    machine = Machine(cores=32, mem_available_gib=128.0, platform="linux-64")
    source = str(Path(__file__).parent / "fixtures" / "torch_like")
    site = load_site(air_gapped(tmp_path))  # no network: every channel is one local folder
    for given in (None, source):  # the upstream git tree (git is needed) or a local one (it is not)
        request = Request("2.5.1", "12.4", "3.12", source=given)
        the_plan = sequence.plan("official", request, "conda-build")
        neutral = run_machine_checks(the_plan.needs, engine="auto", jobs=4, runner=Runner(), out=tmp_path / "o",
                                     machine=machine)
        rows = _toolkit_rows(neutral)
        # doctor's first row: the plan's own fact, worded as the official preflight words it
        first = sequence.machine_report(the_plan, engine="auto", jobs=4, out=tmp_path / "o", site=site,
                                       runner=Runner()).checks[0]
        assert (first.name, first.detail) == (
            "selection", "1 variant(s), 1 magma package(s)")
        found = {name: (status, detail) for name, status, detail, _ in rows}
        assert ("git" in found) and found["git"][1].startswith("not needed") is (given is not None), found
        assert found["source"][0] == "ok" and "cmake" in found, found
    assert found["cuBLAS (CUDA 12.4)"] == (
        "fail", f"cublas_v2.h, libcublas.so, libcublasLt.so not found in the toolkit at {toolkit} "
                "(needed by magma and pytorch)")
    assert found["cuSPARSE (CUDA 12.4)"][0] == "ok" and found["cuDNN (CUDA 12.4)"][0] == "ok"
    assert "host compiler (CUDA 12.4)" in found
    bundled = [name for name in found if name.startswith("bundled ")]
    assert bundled and found[next(n for n in bundled if "cudnn" in n)][0] == "ok", found
    # the conda-forge flavour's toolkit and tools are packages of its build environment: none of these rows
    conda_forge = sequence.plan("conda-forge", Request("2.13.0", "13.0", "3.12", arch_list="9.0"), "conda-build")
    assert [row[0] for row in _toolkit_rows(run_machine_checks(conda_forge.needs, engine="auto", jobs=4,
                                                               runner=Runner(), out=tmp_path / "o",
                                                               machine=machine))] == ["source"]


def test_the_official_plan_carries_its_requirement_solves_as_neutral_needs(tmp_path: Path) -> None:
    """The official flavour's check that each pytorch recipe's build and host requirements solve from its channels
    reads the neutral plan (MachineNeeds.solves), not its variants (issue 30): the shared machine checks of the
    official plan give its channel and requirement rows. A site config replacing every channel
    with an empty local one: the channel answers, and each requirement that no package meets is named."""
    site = load_site(air_gapped(tmp_path))
    request = Request("2.5.1", "cpu", "3.11,3.12")
    the_plan = sequence.plan("official", request, "conda-build")
    machine = Machine(cores=32, mem_available_gib=128.0, platform="linux-64")
    neutral = run_machine_checks(the_plan.needs, engine="auto", jobs=4, runner=Runner(), out=tmp_path / "o",
                                 machine=machine, site=site, check_channels=True)

    def rows(report: PreflightReport) -> list[tuple[str, str, str]]:
        return [(c.name, c.status.value, c.detail) for c in report.checks
                if c.name.startswith(("channel ", "requirements ("))]

    found = dict((name, (status, detail)) for name, status, detail in rows(neutral))
    assert found[f"channel file://{tmp_path / 'mirror'}"] == ("ok", "answers")
    for python in ("311", "312"):
        status, detail = found[f"requirements (pytorch-2.5.1-cpu-py{python}-linux_64)"]
        assert status == "fail" and "no package for" in detail and "python" in detail, detail


def test_official_doctor_is_the_shared_doctor_of_its_plan_and_refuses_a_refused_variant_first(
        tmp_path: Path) -> None:
    """`doctor` of the official flavour runs the shared checks of its plan (the official capability `own_checks`
    is gone): a variant upstream cannot build is refused (exit 4) before the machine is looked at, as `build` and
    every other command refuse it, and no table of checks is printed for a build that cannot happen."""
    result = cli("doctor", "--pytorch", "2.5.1", "--cuda", "12.4", "--py", "3.12", "--platform", "osx-arm64", "--json",
                 "--config", str(air_gapped(tmp_path)), "--out", str(tmp_path / "o"))
    assert result.returncode == 4, result.stdout + result.stderr
    assert result.stdout == "" and "osx-arm64 builds have no CUDA" in " ".join(result.stderr.split())
