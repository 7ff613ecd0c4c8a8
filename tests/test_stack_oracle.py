"""The oracle of the conda-forge flavour's torchvision and torchaudio: for every release the feedstock built and
each of its linux-64 jobs (cpu, newest CUDA), the real rattler-build renders the feedstock's own recipe.yaml for
that job and torchforge's recipe.yaml for the same job, and every field of every output must match unless
tests/data/stack_feedstock_differences.toml says why not (the same rules as tests/data/feedstock_differences.toml).
"""

from __future__ import annotations

import re
import shutil
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.feedstock_oracle import Job, compare
from tests.feedstock_rattler_render import normalised, render
from tests.test_stack_feedstock import DIFFERENCES, SNAPSHOTS
from torchforge import stackpairing
from torchforge.flavours.conda_forge import stack as conda_forge_stack

ARCH_LIST = "8.0;9.0+PTX"
CASES = [(package, version, accel) for package in ("torchvision", "torchaudio")
         for version, release in getattr(conda_forge_stack.load(), package).items()
         for accel in ("cpu", "cuda") if getattr(release, accel) is not None]


def pytorch_for(package: str, version: str, job: str) -> conda_forge_stack.PytorchBuild:
    """The pytorch package PyPI pairs the release with, for the job's CUDA and Python 3.12."""
    row = next(r for r in getattr(stackpairing.table(), package) if r.version == version)
    lower = next(iter(Requirement(row.requires or "").specifier)).version
    release = ".".join((lower.split(".") + ["0", "0"])[:3])
    cuda = re.search(r"cuda_compiler_version(\d+\.\d+)", job)
    tag = f"cuda{cuda.group(1).replace('.', '')}" if cuda else "cpu"
    return conda_forge_stack.PytorchBuild(release, f"{tag}_generic_torchforge_py312_h1234567_0", "linux-64", "3.12",
                                          cuda.group(1) if cuda else None, ARCH_LIST if cuda else None)


def rendered_pair(package: str, version: str, accel: str, scratch: Path) -> tuple[dict, dict]:
    release = getattr(conda_forge_stack.load(), package)[version]
    facts = getattr(release, accel)
    theirs = scratch / "feedstock"
    shutil.copytree(SNAPSHOTS / package / release.commit / "recipe", theirs)
    shutil.copy(SNAPSHOTS / package / release.commit / ".ci_support" / facts.job, theirs / "variants.yaml")
    recipe = conda_forge_stack.plan(package, pytorch_for(package, version, facts.job))
    assert recipe.version == version and recipe.feedstock_version == version
    ours = scratch / "torchforge"
    ours.mkdir()
    for name, text in conda_forge_stack.recipe_files(recipe, "rattler-build").items():
        (ours / name).write_text(text, encoding="utf-8")
    return normalised(render(theirs)), normalised(render(ours))


def differences() -> dict:
    listed = tomllib.loads(DIFFERENCES.read_text(encoding="utf-8"))
    return {kind: listed.get(kind, []) for kind in ("rewrite", "item", "output")}


@pytest.mark.parametrize(("package", "version", "accel"), CASES)
def test_recipe_yaml_matches_the_feedstocks_job(package: str, version: str, accel: str, tmp_path: Path) -> None:
    theirs, ours = rendered_pair(package, version, accel, tmp_path)
    job = Job(version, "linux-64", accel)
    different = [f"{f.output} {f.field}: {f.detail}" for f in compare(job, theirs, ours, differences())
                 if f.status == "different"]
    assert not different, "\n".join(different)


def test_the_oracle_sees_a_changed_pin(tmp_path: Path) -> None:
    """A requirement torchforge drops is found: the comparison is not vacuous."""
    theirs, ours = rendered_pair("torchvision", "0.28.0", "cuda", tmp_path)
    ours["torchvision"]["fields"]["requirements.run"] = [
        s for s in ours["torchvision"]["fields"]["requirements.run"] if not s.startswith("pillow")]
    found = compare(Job("0.28.0", "linux-64", "cuda"), theirs, ours, differences())
    assert [f.field for f in found if f.status == "different"] == ["requirements.run"]


def test_the_recipe_pins_the_exact_pytorch_and_takes_its_arch_list() -> None:
    pytorch = pytorch_for("torchvision", "0.28.0", "linux_64_cuda_compiler_version13.0python3.12.yaml")
    recipe = conda_forge_stack.plan("torchvision", pytorch)
    files = conda_forge_stack.recipe_files(recipe, "rattler-build")
    assert f"- pytorch ==2.13.0 {pytorch.build_string}" in files["recipe.yaml"]
    assert 'export TORCH_CUDA_ARCH_LIST="${CF_TORCH_CUDA_ARCH_LIST}"' in files["build.sh"]
    assert f'!= "{ARCH_LIST}"' in files["build.sh"]
    assert 'export FORCE_CUDA="1"' in files["build.sh"] and 'TORCHVISION_USE_NVJPEG="1"' in files["build.sh"]


@pytest.fixture(scope="module")
def conda_build_python() -> Path:
    from tests import tool_venvs

    if not tool_venvs.vendored_conda_present():
        pytest.skip(f"no conda wheels in {tool_venvs.VENDOR}: the meta.yaml check renders with the real conda-build")
    return tool_venvs.ensure("conda") / "python"


@pytest.mark.parametrize(("package", "version", "accel"), [("torchvision", "0.28.0", "cuda"),
                                                           ("torchvision", "0.22.0", "cuda"),
                                                           ("torchaudio", "2.11.0", "cuda"),
                                                           ("torchaudio", "2.7.0", "cpu")])
def test_meta_yaml_says_what_recipe_yaml_says(package: str, version: str, accel: str, tmp_path: Path,
                                              conda_build_python: Path) -> None:
    """conda-build's render of torchforge's meta.yaml gives the fields rattler-build's render of its recipe.yaml
    gives (the same recipe for either engine)."""
    from tests.feedstock_oracle import render as conda_build_render

    facts = getattr(getattr(conda_forge_stack.load(), package)[version], accel)
    recipe = conda_forge_stack.plan(package, pytorch_for(package, version, facts.job))
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
