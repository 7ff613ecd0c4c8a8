"""The oracle of the conda-forge flavour's torchvision and torchaudio (tests/stack_oracle.py): for every release the
feedstock built and every one of its linux-64 job files (cpu and each CUDA, each Python), the real rattler-build
renders the feedstock's own recipe.yaml for that job and torchforge's recipe.yaml for the same job, bash runs both
build.sh files, and every field of every output and every exported variable must match unless
tests/data/stack_feedstock_differences.toml says why not (the same rules as tests/data/feedstock_differences.toml).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests import stack_oracle
from tests.stack_oracle import ARCH_LIST, StackJob, differences, pytorch_for, render_job
from tests.feedstock_oracle import compare
from tests.feedstock_rattler_render import normalised, render
from torchforge.errors import RefusedError
from torchforge.flavours.conda_forge import stack as conda_forge_stack

JOBS = stack_oracle.jobs()


def job(package: str, version: str, accel: str, python: str) -> StackJob:
    return next(j for j in JOBS if (j.package, j.version, j.accel, j.python) == (package, version, accel, python))


@pytest.mark.slow
@pytest.mark.parametrize("case", JOBS, ids=lambda case: case.id)
def test_recipe_yaml_matches_the_feedstocks_job(case: StackJob, tmp_path: Path) -> None:
    theirs, ours = render_job(case, tmp_path)
    different = [f"{f.output} {f.field}: {f.detail}" for f in compare(case, theirs, ours, differences())
                 if f.status == "different"]
    assert not different, "\n".join(different)


def test_every_cuda_and_python_job_of_a_release_is_a_case() -> None:
    """The cases are the snapshots' job files, not torchforge's table: 0.28.0's 12.9 and 13.0 jobs for 3.10-3.14."""
    cases = {(j.accel, j.python) for j in JOBS if (j.package, j.version) == ("torchvision", "0.28.0")}
    assert cases == {(a, p) for a in ("cpu", "12.9", "13.0") for p in ("3.10", "3.11", "3.12", "3.13", "3.14")}


def test_the_oracle_sees_a_changed_pin(tmp_path: Path) -> None:
    """A requirement torchforge drops is found: the comparison is not vacuous."""
    case = job("torchvision", "0.28.0", "13.0", "3.12")
    theirs, ours = render_job(case, tmp_path)
    ours["torchvision"]["fields"]["requirements.run"] = [
        s for s in ours["torchvision"]["fields"]["requirements.run"] if not s.startswith("pillow")]
    found = compare(case, theirs, ours, differences())
    assert [f.field for f in found if f.status == "different"] == ["requirements.run"]


def test_the_oracle_sees_a_variable_the_build_script_drops(tmp_path: Path) -> None:
    """build.sh is compared by what bash exports from it: one line less in torchforge's is a difference."""
    case = job("torchaudio", "2.10.0", "12.9", "3.12")
    theirs, ours = render_job(case, tmp_path)
    del ours["torchaudio"]["fields"]["script.env.CMAKE_GENERATOR"]
    found = compare(case, theirs, ours, differences())
    assert [f.field for f in found if f.status == "different"] == ["script.env.CMAKE_GENERATOR"]


def test_the_recipe_pins_the_exact_pytorch_and_takes_its_arch_list() -> None:
    pytorch = pytorch_for(job("torchvision", "0.28.0", "13.0", "3.12"))
    recipe = conda_forge_stack.plan("torchvision", pytorch)
    files = conda_forge_stack.recipe_files(recipe, "rattler-build")
    assert f"- pytorch ==2.13.0 {pytorch.build}" in files["recipe.yaml"]
    assert 'export TORCH_CUDA_ARCH_LIST="${CF_TORCH_CUDA_ARCH_LIST}"' in files["build.sh"]
    assert f'!= "{ARCH_LIST}"' in files["build.sh"]
    assert 'export FORCE_CUDA="1"' in files["build.sh"] and 'TORCHVISION_USE_NVJPEG="1"' in files["build.sh"]


# ---- issue 40 items 7-9, each also a case of the sweep above ----------------------------------------------

@pytest.mark.parametrize(("python", "pin"), [("3.12", "3.12.* *_cpython"), ("3.13", "3.13.* *_cp313"),
                                             ("3.14", "3.14.* *_cp314")])
def test_a_companion_takes_its_pythons_own_pin_from_the_feedstocks_job(python: str, pin: str,
                                                                       tmp_path: Path) -> None:
    """conda-forge's 3.13 and 3.14 pythons are `*_cp313`/`*_cp314` (the job files say so): a `*_cpython` pin
    finds no python to build with. The rendered host python is the feedstock job's own."""
    case = job("torchvision", "0.28.0", "12.9", python)
    theirs, ours = render_job(case, tmp_path)
    assert f"python {pin}" in theirs["torchvision"]["fields"]["requirements.host"]
    assert f"python {pin}" in ours["torchvision"]["fields"]["requirements.host"]


def test_a_python_the_feedstock_has_no_job_for_is_refused() -> None:
    pytorch = conda_forge_stack.PytorchBuild("2.13.0", "cpu_generic_torchforge_py39_h1234567_0", "linux-64", "3.9",
                                             None, None)
    with pytest.raises(RefusedError) as caught:
        conda_forge_stack.plan("torchvision", pytorch)
    assert "for Python 3.10, 3.11, 3.12, 3.13, 3.14, not 3.9" in caught.value.message


@pytest.mark.parametrize(("cuda", "sysroot"), [("12.9", "2.17"), ("13.0", "2.28")])
def test_a_companion_takes_the_sysroot_of_its_own_cudas_job(cuda: str, sysroot: str, tmp_path: Path) -> None:
    """Every CUDA job of a release is kept: a CUDA 12.9 torchvision is built with the 12.9 job's sysroot, not
    the newest job's (it would need a newer glibc than the pytorch it goes with)."""
    case = job("torchvision", "0.28.0", cuda, "3.12")
    theirs, ours = render_job(case, tmp_path)
    for side in (theirs, ours):
        assert f"sysroot_linux-64 {sysroot}" in side["torchvision"]["fields"]["requirements.build"]


def test_a_cuda_companion_for_a_cuda_the_feedstock_has_no_job_for_says_which_job_it_takes() -> None:
    pytorch = conda_forge_stack.PytorchBuild("2.13.0", "cuda126_generic_torchforge_py312_h1234567_0", "linux-64",
                                             "3.12", "12.6", ARCH_LIST)
    recipe = conda_forge_stack.plan("torchvision", pytorch)
    assert recipe.facts.variant["c_stdlib_version"] == "2.17"
    assert any("no CUDA 12.6 job" in w and "its CUDA 12.9 job" in w for w in recipe.warnings), recipe.warnings


def test_cuda_torchaudio_is_down_prioritised_as_the_feedstocks(tmp_path: Path) -> None:
    """The feedstock's `down_prioritize_variant` (52a1aa90 recipe/recipe.yaml:39) gives CUDA torchaudio the track
    feature torchaudio-p-0, so a solver prefers the cpu build where both fit; the cpu build has none."""
    theirs, ours = render_job(job("torchaudio", "2.10.0", "12.9", "3.13"), tmp_path / "cuda")
    assert theirs["torchaudio"]["fields"]["build.track_features"] == ["torchaudio-p-0"]
    assert ours["torchaudio"]["fields"]["build.track_features"] == ["torchaudio-p-0"]
    _, cpu = render_job(job("torchaudio", "2.10.0", "cpu", "3.13"), tmp_path / "cpu")
    assert "build.track_features" not in cpu["torchaudio"]["fields"]


def test_build_scripts_export_what_the_feedstocks_export(tmp_path: Path) -> None:
    """torchvision 0.25.0's build.sh sets CUDA_TOOLKIT_ROOT_DIR but not CUDA_HOME (8a86fda7 recipe/build.sh:6-23);
    torchaudio 2.10.0's sets BUILD_CPP_TEST, CMAKE_GENERATOR and the CMake compilers (52a1aa90 recipe/build.sh:29,
    41-43)."""
    _, vision = render_job(job("torchvision", "0.25.0", "12.9", "3.12"), tmp_path / "vision")
    exported = vision["torchvision"]["fields"]
    assert exported["script.env.CUDA_TOOLKIT_ROOT_DIR"] == "/prefix" and "script.env.CUDA_HOME" not in exported
    _, audio = render_job(job("torchaudio", "2.10.0", "13.0", "3.12"), tmp_path / "audio")
    exported = audio["torchaudio"]["fields"]
    assert (exported["script.env.BUILD_CPP_TEST"], exported["script.env.CMAKE_GENERATOR"]) == ("0", "Ninja")
    assert (exported["script.env.CMAKE_C_COMPILER"], exported["script.env.CMAKE_CXX_COMPILER"]) == \
        ("/build/bin/cc", "/build/bin/c++")


@pytest.fixture(scope="module")
def conda_build_python() -> Path:
    from tests import tool_venvs

    if not tool_venvs.vendored_conda_present():
        pytest.skip(f"no conda wheels in {tool_venvs.VENDOR}: the meta.yaml check renders with the real conda-build")
    return tool_venvs.ensure("conda") / "python"


@pytest.mark.parametrize(("package", "version", "accel"), [("torchvision", "0.28.0", "13.0"),
                                                           ("torchvision", "0.22.0", "12.9"),
                                                           ("torchaudio", "2.11.0", "12.9"),
                                                           ("torchaudio", "2.7.0", "cpu")])
def test_meta_yaml_says_what_recipe_yaml_says(package: str, version: str, accel: str, tmp_path: Path,
                                              conda_build_python: Path) -> None:
    """conda-build's render of torchforge's meta.yaml gives the fields rattler-build's render of its recipe.yaml
    gives (the same recipe for either engine)."""
    from tests.feedstock_oracle import render as conda_build_render

    recipe = conda_forge_stack.plan(package, pytorch_for(job(package, version, accel, "3.12")))
    folders = {}
    for engine in ("rattler-build", "conda-build"):
        folders[engine] = tmp_path / engine
        folders[engine].mkdir()
        for name, text in conda_forge_stack.recipe_files(recipe, engine).items():
            (folders[engine] / name).write_text(text, encoding="utf-8")
    ours = normalised(render(folders["rattler-build"]))[package]["fields"]
    # rattler-build's render leaves the test script's expressions for the test run to fill in
    ours["test.commands"] = [line.replace("${{ version }}", version) for line in ours.get("test.commands", [])]
    # rattler-build's exact `==V BUILD` is conda-build's `V BUILD` (the render helper does this for run only)
    ours["requirements.host"] = [re.sub(r"^(\S+) ==(\S+) (\S+)$", r"\1 \2 \3", spec) for spec in ours["requirements.host"]]
    theirs = normalised(conda_build_render(folders["conda-build"], "linux-64", None))[package]["fields"]
    different = {field: (ours.get(field), theirs.get(field)) for field in set(ours) | set(theirs)
                 if sorted(map(str, ours.get(field) or [])) != sorted(map(str, theirs.get(field) or []))
                 and ours.get(field) != theirs.get(field)}
    assert not different, different


def test_a_release_the_feedstock_has_no_recipe_for_takes_the_newest_recipe_with_its_own_source() -> None:
    pytorch = conda_forge_stack.PytorchBuild("2.14.0", "cpu_generic_torchforge_py312_h1234567_0", "linux-64",
                                             "3.12", None, None)
    recipe = conda_forge_stack.plan("torchvision", pytorch)
    assert (recipe.version, recipe.feedstock_version, recipe.build_number) == ("0.29.0", "0.28.0", 0)
    assert any("no recipe for torchvision 0.29.0" in w for w in recipe.warnings)
    text = conda_forge_stack.recipe_files(recipe, "rattler-build")["recipe.yaml"]
    assert "url: https://github.com/pytorch/vision/archive/refs/tags/v0.29.0.tar.gz" in text
    assert "sha256:" not in text and "# warning: conda-forge's torchvision-feedstock has no recipe" in text


def test_torchaudio_2_11_for_a_later_pytorch_says_where_its_pairing_comes_from() -> None:
    pytorch = conda_forge_stack.PytorchBuild("2.13.0", "cuda130_generic_torchforge_py312_h1234567_0", "linux-64",
                                             "3.12", "13.0", "9.0")
    recipe = conda_forge_stack.plan("torchaudio", pytorch)
    assert (recipe.version, recipe.feedstock_version) == ("2.11.0", "2.11.0")
    assert any("pytorch/audio#4225" not in w and "cited from the project" in w for w in recipe.warnings)
    files = conda_forge_stack.recipe_files(recipe, "rattler-build")
    assert "- pytorch ==2.13.0 cuda130_generic_torchforge_py312_h1234567_0" in files["recipe.yaml"]
    # the feedstock hard-codes its arch list; torchforge takes pytorch's
    assert 'export TORCH_CUDA_ARCH_LIST="${CF_TORCH_CUDA_ARCH_LIST}"' in files["build.sh"]
    assert "7.5;8.0;8.6" not in files["build.sh"]


def test_a_pytorch_before_the_pairing_table_is_refused() -> None:
    from torchforge.errors import ExitCode, RefusedError

    pytorch = conda_forge_stack.PytorchBuild("2.5.1", "cpu_0", "linux-64", "3.12", None, None)
    with pytest.raises(RefusedError) as caught:
        conda_forge_stack.plan("torchvision", pytorch)
    assert caught.value.exit_code == ExitCode.REFUSED and "2.5.1" in caught.value.message
