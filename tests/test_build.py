"""`torchforge build` end to end with the embedded rattler-build engine, on the magma_like CUDA fixture
(compiled by this machine's nvcc; no GPU needed), and the conda-build engine's exact invocation."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.cuda_standin import make_stand_in_toolkit
from tests.rattler_in_child import solve_and_install
from torchforge.cli import main
from torchforge.engines import BuildJob
from torchforge.engines.conda_build import CondaBuildEngine
from torchforge.flavours.official.magmasource import inspect
from torchforge.flavours.official.render import plan
from torchforge.templates import RecipeFormat
from torchforge.flavours.official.variant import Options, Selection

FIXTURE = Path(__file__).parent / "fixtures" / "magma_like"
NVCC_RELEASE = "13.0"  # the toolkit on this project's machines (nvcc 13.0 on PATH)


def cuobjdump() -> str:
    found = shutil.which("cuobjdump")
    if found:
        return found
    import nvidia  # the nvidia-cuda-cuobjdump wheel (test extra)

    for root in nvidia.__path__:
        candidate = Path(root) / "cu13" / "bin" / "cuobjdump"
        if candidate.is_file():
            return str(candidate)
    pytest.fail("cuobjdump not found: install the test extra (nvidia-cuda-cuobjdump)")


def nvcc_release() -> str | None:
    if shutil.which("nvcc") is None:
        return None
    output = subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout
    return output.split("release ")[1].split(",")[0] if "release " in output else None


needs_nvcc = pytest.mark.skipif(nvcc_release() != NVCC_RELEASE, reason=f"needs nvcc {NVCC_RELEASE} on PATH")

MAGMA_ARGS = ["--magma-only", "--pytorch", "2.13.0", "--cuda", NVCC_RELEASE, "--py", "3.12",
              "--arch-list", "8.0;9.0", "--magma-source", str(FIXTURE), "--skip-preflight"]
# A custom gencode list and a source tree: the build string carries the hash of those settings. The fixture's
# include/magma_types.h says 2.10.0, which PyTorch 2.13 accepts.
_MAGMA = plan(Selection("2.13.0", (NVCC_RELEASE,), ("3.12",), "linux-64",
                        Options(arch_list="8.0;9.0", magma_source=inspect(str(FIXTURE))))).magma[0]
MAGMA_STEM = _MAGMA.filename_stem


@pytest.fixture(scope="module")
def built_channel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if nvcc_release() != NVCC_RELEASE:
        pytest.skip(f"needs nvcc {NVCC_RELEASE} on PATH")
    channel = tmp_path_factory.mktemp("forge") / "channel"
    assert main(["build", *MAGMA_ARGS, "--out", str(channel)]) == 0
    return channel


@pytest.mark.slow
def test_fixture_goes_through_render_build_channel_install_with_exact_sm_targets(built_channel: Path, tmp_path: Path) -> None:
    package = built_channel / "linux-64" / f"{MAGMA_STEM}.conda"
    assert package.is_file()
    repodata = json.loads((built_channel / "linux-64" / "repodata.json").read_text())
    assert list(repodata["packages.conda"]) == [f"{MAGMA_STEM}.conda"]
    assert not list(built_channel.glob(".torchforge-tmp-*")), "staging folders must not stay in the channel"
    prefix = tmp_path / "prefix"
    solve_and_install([built_channel], ["magma-cuda130 ==2.10.0"], prefix, cache=tmp_path / "cache")
    library = prefix / "lib" / "libmagma.a"
    assert library.is_file() and (prefix / "include" / "magma.h").is_file()
    listing = subprocess.run([cuobjdump(), "--list-elf", str(library)], capture_output=True, text=True, check=True).stdout
    targets = sorted({line.rsplit(".", 2)[-2] for line in listing.splitlines() if line.startswith("ELF file")})
    assert targets == ["sm_80", "sm_90"]
    ptx = subprocess.run([cuobjdump(), "--list-ptx", str(library)], capture_output=True, text=True, check=False)
    assert "PTX file" not in ptx.stdout  # SASS only, as the official packages
    log = (built_channel / "logs" / "magma-cuda130-2.10.0-linux_64.log").read_text()
    assert log.count("source edit ok: replace control/get_batched_crossover.cpp (applied) [magma-getrf-nbparam]") == 4
    # only the library and its headers (with the generated one), static, as the official package
    (record,) = prefix.glob("conda-meta/magma-cuda130-*.json")
    files = sorted(json.loads(record.read_text())["files"])
    assert files == ["include/magma.h", "include/magma_config.h", "include/magma_types.h", "include/magma_v2.h",
                     "lib/libmagma.a"]


CONSUMER = Path(__file__).parent / "fixtures" / "magma_consumer"


@pytest.fixture(scope="module")
def installed_magma(built_channel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    prefix = tmp_path_factory.mktemp("consumer") / "prefix"
    solve_and_install([built_channel], ["magma-cuda130 ==2.10.0"], prefix, cache=prefix.parent / "cache")
    return prefix


@pytest.mark.slow
@pytest.mark.parametrize("found_through", ["MAGMA_HOME", "CMAKE_PREFIX_PATH"])
def test_a_cmake_consumer_finds_and_links_the_package_like_pytorch(installed_magma: Path, found_through: str,
                                                                   tmp_path: Path) -> None:
    """The installed package, found as PyTorch's FindMAGMA finds it, links with cuBLAS/cuSPARSE from a toolkit
    (stand-ins here: this machine has none) and runs: recnb 16 shows the getrf_nbparam edit is in the library."""
    toolkit = make_stand_in_toolkit(tmp_path / "cuda")
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}
    configure = ["cmake", "-S", str(CONSUMER), "-B", str(tmp_path / "build"), f"-DCUDAToolkit_ROOT={toolkit}"]
    if found_through == "MAGMA_HOME":
        env["MAGMA_HOME"] = str(installed_magma)
    else:
        configure.append(f"-DCMAKE_PREFIX_PATH={installed_magma}")
    result = subprocess.run(configure, env=env, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"MAGMA: {installed_magma}/lib/libmagma.a (headers {installed_magma}/include)" in result.stdout
    build = subprocess.run(["nice", "cmake", "--build", str(tmp_path / "build")], env=env, capture_output=True,
                           text=True, check=False)
    assert build.returncode == 0, build.stdout + build.stderr
    run = subprocess.run([str(tmp_path / "build" / "magma_consumer")], env=env, capture_output=True, text=True,
                         check=False)
    assert run.returncode == 0 and "dgetrf batched nb 128 recnb 16" in run.stdout, run.stdout + run.stderr


@pytest.mark.slow
@needs_nvcc
def test_ptx_is_added_only_for_an_arch_the_list_marks(tmp_path: Path) -> None:
    args = [arg if arg != "8.0;9.0" else "8.0;9.0+PTX" for arg in MAGMA_ARGS]
    channel = tmp_path / "channel"
    assert main(["build", *args, "--out", str(channel)]) == 0
    prefix = tmp_path / "prefix"
    solve_and_install([channel], ["magma-cuda130"], prefix, cache=tmp_path / "cache")
    ptx = subprocess.run([cuobjdump(), "--list-ptx", str(prefix / "lib" / "libmagma.a")], capture_output=True,
                         text=True, check=True).stdout
    assert {line.rsplit(".", 2)[-2] for line in ptx.splitlines() if line.startswith("PTX file")} == {"sm_90"}


@pytest.mark.slow
@needs_nvcc
def test_a_local_tarball_source_is_pinned_by_its_own_checksum_and_builds(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    import hashlib
    import tarfile

    tarball = tmp_path / "magma_like-2.10.0.tar.gz"
    with tarfile.open(tarball, "w:gz") as archive:
        archive.add(FIXTURE, arcname="magma_like")
    channel = tmp_path / "channel"
    args = [arg if arg != str(FIXTURE) else str(tarball) for arg in MAGMA_ARGS]
    assert main(["build", *args, "--out", str(channel)]) == 0
    # not the release tarball: a custom source, so the build string carries the settings' hash
    assert len(list(channel.glob("linux-64/magma-cuda130-2.10.0-tf*_0.conda"))) == 1
    assert "is not the MAGMA 2.10.0 release tarball" in capsys.readouterr().err
    recipe = (channel / "recipes" / "magma-cuda130-2.10.0-linux_64" / "recipe.yaml").read_text()
    assert f"url: {tarball.as_uri()}" in recipe
    assert f"sha256: {hashlib.sha256(tarball.read_bytes()).hexdigest()}" in recipe


@pytest.mark.slow
def test_rerunning_the_same_request_reuses_the_package(built_channel: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = (built_channel / "linux-64" / f"{MAGMA_STEM}.conda").stat().st_mtime_ns
    assert main(["build", *MAGMA_ARGS, "--out", str(built_channel)]) == 0
    captured = capsys.readouterr()
    assert f"reuse {MAGMA_STEM}: already in" in captured.err
    assert (built_channel / "linux-64" / f"{MAGMA_STEM}.conda").stat().st_mtime_ns == before


@needs_nvcc
def test_a_failed_build_publishes_nothing_and_explains(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    channel = tmp_path / "channel"
    # magma-cuda126 checks that nvcc is CUDA 12.6, like upstream's build.sh; this machine has 13.0.
    code = main(["build", "--magma-only", "--pytorch", "2.13.0", "--cuda", "12.6", "--py", "3.12",
                 "--magma-source", str(FIXTURE), "--skip-preflight", "--out", str(channel)])
    assert code == 6
    err = capsys.readouterr().err
    assert "nvcc at" in err and "is CUDA 13.0, this recipe is for CUDA 12.6" in err
    assert not list(channel.glob("linux-64/*.conda"))
    assert not list(channel.glob(".torchforge-tmp-*"))
    assert (channel / "logs" / "magma-cuda126-2.10.0-linux_64.log").is_file()
    # The log names folders under the work folder: the message says it is gone, and how to keep it.
    assert "its work folder" in err and "is removed; rerun with --keep-work" in err


@needs_nvcc
def test_a_failure_counts_the_planned_packages_not_only_the_attempted(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    # Four steps (pytorch-mutex, pytorch-cuda, magma-cuda126, pytorch): magma fails (nvcc is 13.0) and, without
    # --keep-going, its pytorch is never attempted.
    code = main(["build", "--pytorch", "2.13.0", "--flavour", "official", "--cuda", "12.6", "--py", "3.12", "--magma-source", str(FIXTURE),
                 "--source", str(FIXTURE), "--skip-preflight", "--out", str(tmp_path / "channel")])
    assert code == 6
    err = " ".join(capsys.readouterr().err.split())
    assert "1 of 4 planned package(s) failed, 1 not attempted after it" in err, err
    assert "--keep-going attempts the others past a failure" in err


@needs_nvcc
def test_keep_work_keeps_a_failed_builds_work_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    channel = tmp_path / "channel"
    code = main(["build", "--magma-only", "--pytorch", "2.13.0", "--cuda", "12.6", "--py", "3.12",
                 "--magma-source", str(FIXTURE), "--skip-preflight", "--out", str(channel), "--keep-work"])
    assert code == 6
    err = capsys.readouterr().err
    kept = channel / ".torchforge-kept" / "magma-cuda126-2.10.0-linux_64"
    assert f"its work folder is kept at {kept}" in " ".join(err.split()), err
    assert kept.is_dir() and any(kept.iterdir())
    assert not list(channel.glob(".torchforge-tmp-*"))


def test_pytorch_waits_for_its_magma_and_keep_going_continues(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """CUDA 12.6 magma fails (nvcc mismatch) so its pytorch is skipped; the cpu variant is still attempted."""
    if nvcc_release() is None:
        pytest.skip("needs nvcc")
    code = main(["build", "--pytorch", "2.13.0", "--flavour", "official", "--cuda", "12.6,cpu", "--py", "3.12", "--keep-going",
                 "--magma-source", str(FIXTURE), "--source", str(tmp_path / "no-such-source"),
                 "--skip-preflight", "--out", str(tmp_path / "channel")])
    assert code == 6
    out = capsys.readouterr().out
    rows = {line.split("│")[1].strip(): line for line in out.splitlines() if line.count("│") >= 4}
    cuda = next(row for stem, row in rows.items() if stem.startswith("pytorch-2.13.0-py3.12_cuda12.6"))
    cpu = next(row for stem, row in rows.items() if stem.startswith("pytorch-2.13.0-py3.12_cpu_tf"))  # --source: custom
    assert "skipped: magma-cuda126-2.10.0-linux_64 failed" in cuda
    logs = tmp_path / "channel" / "logs"
    assert not (logs / "pytorch-2.13.0-cu126-py312-linux_64.log").exists()  # waited: never started
    # --keep-going: the cpu variant was still built, and failed on its own (the missing source), not skipped.
    assert "skipped" not in cpu and "exited with status 1" in cpu
    assert "no-such-source" in (logs / "pytorch-2.13.0-cpu-py312-linux_64.log").read_text()


def test_dry_run_prints_the_exact_conda_build_commands_and_builds_nothing(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "channel"
    code = main(["build", "--engine", "conda-build", "--dry-run", "--cuda", "11.8", "--py", "3.10,3.11",
                 "--out", str(out), "--channel", "https://example.invalid/mirror"])
    assert code == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("[dry-run]")]
    # the companions pytorch-mutex (cuda) and pytorch-cuda 11.8, one magma-cuda118, then pytorch for two Pythons
    assert len(lines) == 5
    assert "recipes/pytorch-mutex-1.0-cuda-noarch " in lines[0] and "recipes/pytorch-cuda-11.8-7-linux_64 " in lines[1]
    lines = lines[2:]
    staging = f"{out}/.torchforge-tmp-staging-magma-cuda118-2.6.1-linux_64"
    # --croot: conda-build's work folders inside the staging folder, the compile cache's base_dir.
    assert lines[0].endswith(f"conda build {out}/recipes/magma-cuda118-2.6.1-linux_64 --output-folder "
                             f"{staging} --croot {staging}/work -c file://{out.resolve()} "
                             "-c https://example.invalid/mirror --override-channels --no-anaconda-upload")
    assert "--python 3.10" in lines[1] and "--python 3.11" in lines[2]
    assert "reuses the objects of pytorch-2.5.1-cu118-py310-linux_64" in err  # the plan's compile cache column
    assert f"compile cache {out}/.cache/compile/pytorch-2.5.1-cu118-linux_64-" in err
    assert not out.exists()


def test_conda_build_command_carries_script_env_values(tmp_path: Path) -> None:
    job = BuildJob(tmp_path / "recipe", tmp_path / "staging", ("file:///chan",), "3.12",
                   {"MAX_JOBS": "3", "CUDA_HOME": "/usr/local/cuda-12.4"}, test=False)
    command = CondaBuildEngine().command(job)
    assert command.argv == ("conda", "build", str(tmp_path / "recipe"), "--python", "3.12", "--output-folder",
                            str(tmp_path / "staging"), "-c", "file:///chan", "--override-channels",
                            "--no-anaconda-upload", "--no-test")
    assert command.env == {"MAX_JOBS": "3", "CUDA_HOME": "/usr/local/cuda-12.4"}
    assert CondaBuildEngine.recipe_format is RecipeFormat.CONDA_BUILD
