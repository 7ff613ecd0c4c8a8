"""`torchforge build --format wheel` on the torch_like fixture (PyTorch's layout, not PyTorch): pip wheel in
the current interpreter, repair into OUT/wheels, pip install into a fresh venv, import and run."""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from torchforge.cli import main
from torchforge.errors import ExitCode
from torchforge.flavours.official.render import plan
from torchforge.flavours.official.variant import Options, Selection
from torchforge.flavours.official.wheel import build_environment
from torchforge.wheelbuild import expand

FIXTURE = Path(__file__).parent / "fixtures" / "torch_like"
PY = f"{sys.version_info.major}.{sys.version_info.minor}"
CP = f"cp{sys.version_info.major}{sys.version_info.minor}"
REQUEST = ["build", "--format", "wheel", "--pytorch", "2.9.0", "--cuda", "cpu", "--py", PY, "--source", str(FIXTURE)]


def variant(cuda: str):  # type: ignore[no-untyped-def]
    (only,) = plan(Selection.from_flags("2.9.0", cuda, PY, None, Options())).variants
    return only


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel-out")
    assert main([*REQUEST, "--out", str(out)]) == 0
    return out / "wheels"


def test_expand_follows_the_shell_forms_the_recipes_use() -> None:
    scope = {"A": "1", "EMPTY": ""}
    assert expand("$A/${A}:${B:-x$A}:${EMPTY:-d}", scope) == "1/1:x1:d"


def test_build_environment_outside_conda() -> None:
    env = build_environment(variant("12.4"), {"CUDA_HOME": "/opt/cuda-12.4"}, jobs=3)
    assert env["CMAKE_PREFIX_PATH"] == sys.prefix
    assert "PACKAGE_TYPE" not in env and "CMAKE_LIBRARY_PATH" not in env
    assert (env["PYTORCH_BUILD_VERSION"], env["PYTORCH_BUILD_NUMBER"]) == ("2.9.0+cu124", "1")
    assert env["CUDA_HOME"] == "/opt/cuda-12.4" and env["NCCL_ROOT_DIR"] == "/opt/cuda-12.4"
    assert env["MAX_JOBS"] == "3" and env["USE_CUDA"] == "1"
    default = build_environment(variant("cpu"), {})
    assert default["MAX_JOBS"].isdigit() and default["PYTORCH_BUILD_VERSION"] == "2.9.0+cpu"
    assert not any("$" in value for value in default.values())


@pytest.mark.slow
def test_wheel_is_repaired_installs_into_a_fresh_venv_and_runs(wheels: Path, tmp_path: Path) -> None:
    (wheel,) = sorted(wheels.glob("*.whl"))
    assert re.fullmatch(rf"torch-2\.9\.0\+cpu-{CP}-{CP}-manylinux_\d+_\d+_x86_64\.whl", wheel.name)
    assert (wheels / "logs" / f"pytorch-2.9.0-cpu-py{CP[2:]}-linux_64.log").is_file()
    assert not list(wheels.glob(".torchforge-tmp-*"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
                    "--no-deps", "--no-index", str(wheel)], check=True, capture_output=True)
    result = subprocess.run([str(venv / "bin" / "python"), "-c",
                             "import torch; print(torch.ones_sum(4), torch.__version__, torch.__file__)"],
                            capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    value, version, location = result.stdout.split()
    assert (float(value), version) == (4.0, "2.9.0+cpu")
    assert Path(location).is_relative_to(venv)


@pytest.mark.slow
def test_second_run_reuses_the_wheel(wheels: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (wheel,) = sorted(wheels.glob("*.whl"))
    before = wheel.stat().st_mtime_ns
    assert main([*REQUEST, "--out", str(wheels.parent)]) == 0
    assert wheel.stat().st_mtime_ns == before


def test_dry_run_prints_pip_wheel_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*REQUEST, "--out", str(tmp_path / "out"), "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert "-m pip wheel" in err and "PYTORCH_BUILD_VERSION=2.9.0+cpu" in err and "--no-build-isolation" in err
    assert not (tmp_path / "out").exists()


def test_another_python_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    other = "3.10" if PY != "3.10" else "3.11"
    args = [*REQUEST, "--out", str(tmp_path / "out")]
    args[args.index(PY)] = other
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "builds with the current interpreter" in err
    assert "torchforge preflight" not in err  # refused before the machine is looked at
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_forced_rebuild_takes_every_object_from_the_compile_cache(tmp_path: Path) -> None:
    """`--format wheel` twice with one --cache, --force on the second, each from a clean copy of the source (pip
    builds in the tree): the pip engine's compiles go through ccache (setuptools' CC is the cache's wrapper), the
    first fills the cache, the rebuild compiles nothing; as for a conda build of the same plan."""
    source = Path(shutil.copytree(FIXTURE, tmp_path / "src", ignore=shutil.ignore_patterns("build", "*.egg-info")))
    out, cache = tmp_path / "out", tmp_path / "cache"
    args = [*REQUEST[:-1], str(source), "--out", str(out), "--cache", str(cache)]
    counts = []
    for extra in ([], ["--force"]):
        assert main([*args, *extra]) == 0
        log = (out / "wheels" / "logs" / f"pytorch-2.9.0-cpu-py{CP[2:]}-linux_64.log").read_text()
        found = re.search(rf"torchforge: compile cache {re.escape(str(cache))}/(wheel-\S+): host (\d+)/(\d+) reused; "
                          r".*compiled: (.*)", log)
        assert found, log[-3000:]
        counts.append((found[1], int(found[2]), int(found[3]), found[4]))
        assert "/ccache-compilers/CC/" in log  # setuptools compiled through route.sh's wrapper
        shutil.rmtree(source / "build", ignore_errors=True)
    (key, cold_hits, cold_calls, cold_compiled), (warm_key, warm_hits, warm_calls, warm_compiled) = counts
    assert key == warm_key and [p.name for p in cache.iterdir()] == [key]
    assert cold_hits == 0 < cold_calls and "csrc/torch_like.cpp" in cold_compiled and "csrc/module.cpp" in cold_compiled
    assert warm_hits == warm_calls == cold_calls and warm_compiled == "nothing"
    (wheel,) = (out / "wheels").glob("*.whl")
    assert wheel.name.startswith(f"torch-2.9.0+cpu-{CP}-{CP}-manylinux_")


def test_the_machine_checks_refuse_a_missing_source_as_for_a_conda_build(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Preflight runs before a wheel build as before a conda build: a --source that does not exist stops both
    with the same exit (9) and the same failed check, before anything is written."""
    missing = tmp_path / "nonexistent"
    asked = ["--pytorch", "2.9.0", "--cuda", "cpu", "--py", PY, "--source", str(missing)]
    codes, rows = [], []
    for fmt, extra in (("wheel", ["--format", "wheel"]), ("conda", ["--flavour", "official"])):
        codes.append(main(["build", *asked, *extra, "--out", str(tmp_path / fmt)]))
        err = " ".join(capsys.readouterr().err.split())
        rows.append(re.search(r"error: preflight: \d+ of \d+ checks failed \((\S+, )*source[,)]", err) is not None)
        assert not (tmp_path / fmt).exists()
    assert codes == [ExitCode.PREFLIGHT_FAILED] * 2 and rows == [True, True]


@pytest.mark.parametrize("flag", ["--container", "--magma-only"])
def test_conda_only_flags_are_refused_rather_than_ignored(
        flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*REQUEST, flag, "--out", str(tmp_path / "out")]) == ExitCode.USAGE
    assert f"{flag} applies to conda packages, not to --format wheel" in " ".join(capsys.readouterr().err.split())
    assert not (tmp_path / "out").exists()


def test_a_wheel_build_is_a_plan_of_wheel_recipes_that_names_the_pip_engine(tmp_path: Path) -> None:
    """--format wheel is a fact of the official plan (issue 43: one sequencer): one `wheel` recipe per variant,
    with the source pip builds and its variables in the recipes' shell forms; the plan names the pip engine, and
    solves nothing from a channel (pip installs no requirement). A conda build of the same request plans none."""
    from torchforge import sequence
    from torchforge.flavours.base import Request

    asked = Request("2.9.0", "cpu", PY, source=str(FIXTURE))
    wheels = sequence.plan("official", dataclasses.replace(asked, flavour_flags=(("--format wheel", True),)),
                           "rattler-build")
    (recipe,) = wheels.recipes
    assert (wheels.engine, recipe.kind, recipe.source) == ("pip", "wheel", str(FIXTURE.resolve()))
    assert recipe.stems == (f"torch-2.9.0+cpu-{CP}-{CP}",) and recipe.files == {} and recipe.channels == ()
    variables = dict(recipe.build_env)
    assert variables["PYTORCH_BUILD_VERSION"] == "2.9.0+cpu" and "PACKAGE_TYPE" not in variables
    assert "$" in variables["CMAKE_PREFIX_PATH"]  # evaluated when the step is made, in this interpreter
    assert wheels.needs.solves == () and wheels.needs.sources == (str(FIXTURE),)
    conda = sequence.plan("official", asked, "rattler-build")
    assert conda.engine is None and "wheel" not in {r.kind for r in conda.recipes} and conda.needs.solves
