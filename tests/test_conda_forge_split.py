"""The conda-forge flavour built for real: libtorch's Python when --py leaves the feedstock's out, the
rattler-build recipe (libtorch once in a staging output, pytorch per Python, the metapackage), and the
PyTorch-layout fixture tests/fixtures/torch_split built through it, installed with a real solver next to
stand-ins of conda-forge's cuDNN/NCCL/MAGMA, imported, audited and consumed from CMake.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from torchforge.cli import main
from torchforge.flavours import conda_forge
from torchforge.recipe import Source
from torchforge.render import RecipeFormat

SOURCE = Source("git", "https://github.com/pytorch/pytorch", "v0")


def host_python(recipe: conda_forge.CondaForgeRecipe) -> list[str]:
    return [s for s in recipe.output("libtorch").requirements["host"] if s.split()[0] == "python"]


# ---- step 1: the Python libtorch is built with --------------------------------------------------------------


def test_libtorch_keeps_the_feedstocks_python_where_the_chosen_pythons_include_it() -> None:
    recipe = conda_forge.plan("2.13.0", "linux-64", "cpu", pythons=("3.11", "3.12"))
    assert host_python(recipe) == ["python 3.12"]
    assert recipe.libtorch_python == "3.12"
    assert json.loads(recipe.settings)["libtorch_python"] == "3.12"
    assert not [w for w in recipe.warnings if "Python" in w]


def test_libtorch_builds_with_the_first_chosen_python_when_the_feedstocks_is_left_out(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    recipe = conda_forge.plan("2.13.0", "linux-64", "13.0", pythons=("3.11", "3.13"))
    assert host_python(recipe) == ["python 3.11"]
    assert recipe.libtorch_python == "3.11"
    assert json.loads(recipe.settings)["libtorch_python"] == "3.11"
    # where the feedstock's pin was, and nothing else moved
    feedstock = conda_forge.plan("2.13.0", "linux-64", "13.0")
    assert [s for s in feedstock.output("libtorch").requirements["host"]] == [
        "python 3.12" if s == "python 3.11" else s for s in recipe.output("libtorch").requirements["host"]]
    warning = next(w for w in recipe.warnings if "Python 3.12" in w)
    assert "recipe/meta.yaml:" in warning and "--py 3.11,3.13" in warning and "Python 3.11" in warning
    # its run requirements name no Python: the host's python never reaches them
    assert "python *" in recipe.output("libtorch").requirements["ignore_run_exports"]
    assert not [s for s in recipe.output("libtorch").requirements["run"] if s.split()[0] == "python"]

    assert main(["render", "--flavour", "conda-forge", "--pytorch", "2.13.0", "--cuda", "cpu", "--py", "3.11",
                 "--out", str(tmp_path)]) == 0
    assert "libtorch builds with Python 3.11" in capsys.readouterr().err.replace("\n", " ")
    (folder,) = tmp_path.iterdir()
    meta = (folder / "meta.yaml").read_text()
    assert "    - python 3.11\n" in meta and "    - python 3.12\n" not in meta
    assert '\\"libtorch_python\\": \\"3.11\\"' in meta
