"""The conda-forge flavour built for real: libtorch's Python when --py leaves the feedstock's out, the
rattler-build recipe (libtorch once in a staging output, pytorch per Python, the metapackage), and the
PyTorch-layout fixture tests/fixtures/torch_split built through it, installed with a real solver next to
stand-ins of conda-forge's cuDNN/NCCL/MAGMA, imported, audited and consumed from CMake.
"""

from __future__ import annotations

import json
import re
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


# ---- step 2: the rattler-build recipe -------------------------------------------------------------------------


def rattler_files(recipe: conda_forge.CondaForgeRecipe, source: Source = SOURCE) -> dict[str, str]:
    return conda_forge.recipe_files(recipe, source, recipe_format=RecipeFormat.RATTLER_BUILD)


def rattler_render(files: dict[str, str], folder: Path) -> list:
    """The real rattler-build's render of the recipe folder (py-rattler-build, with its variants.yaml)."""
    from rattler_build import Stage0Recipe, VariantConfig

    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    return Stage0Recipe.from_file(folder / "recipe.yaml").render(VariantConfig.from_file(folder / "variants.yaml"))


def rendered_spec(spec: object) -> str:
    """A rendered requirement back in the data's notation (`pin_subpackage libtorch exact`)."""
    if isinstance(spec, dict):
        ((function, args),) = spec.items()
        return f"{function} {args['name']}" + (" exact" if args.get("exact") else "")
    return str(spec)


def planned_spec(spec: str) -> str:
    """A planned requirement as rattler-build renders it: conda-build's implicit `X.Y` -> `X.Y.*` made explicit,
    pins without their bound (rendered lazily)."""
    parts = spec.split()
    if parts[0] in ("pin_subpackage", "pin_compatible"):
        return " ".join(parts[:2] + (["exact"] if parts[2:] == ["exact"] else []))
    return conda_forge._explicit_version(spec)


CASES = [("2.6.0", "12.6", None, ("3.12",)), ("2.13.0", "13.0", None, ("3.11", "3.12")),
         ("2.13.0", "cpu", None, ("3.11",)), ("2.9.1", "12.4", "7.0;8.6", ("3.11",))]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-{c[2] or 'feedstock'}")
def test_rattler_build_renders_the_planned_outputs_with_the_planned_build_strings_and_requirements(
        case, tmp_path: Path) -> None:
    version, accel, arch, pythons = case
    recipe = conda_forge.plan(version, "linux-64", accel, arch, pythons)
    variants = rattler_render(rattler_files(recipe), tmp_path)
    rendered: dict[tuple[str, str | None], object] = {}
    for variant in variants:
        python = variant.variant.get("python")
        rendered[(variant.recipe.package.name, python if variant.recipe.package.name == "pytorch" else None)] = variant
    expected = {(o.name, p if o.name == "pytorch" else None) for o in recipe.outputs for p in pythons}
    assert set(rendered) == expected
    for (name, python), variant in rendered.items():
        output = recipe.output(name)
        planned = output.build_string.replace("{{ CONDA_PY }}", (python or "").replace(".", ""))
        assert re.fullmatch(rf"{re.escape(planned)}_h[0-9a-f]{{7}}_{recipe.build_number}", variant.recipe.build.string)
        assert variant.recipe.build.number == recipe.build_number
        requirements = variant.recipe.to_dict()["requirements"]
        if name == "libtorch":  # its build and host are the staging output's, built once
            (staging,) = variant.recipe.staging_caches
            assert staging.name == "libtorch-build"
            requirements = {**requirements, **staging.requirements.to_dict()}
        for key, rattler_key in (("build", "build"), ("host", "host"), ("run", "run"),
                                 ("run_constrained", "run_constraints")):
            got = [rendered_spec(s) for s in requirements.get(rattler_key, [])]
            # compilers and the sysroot come out resolved from the variant keys (gcc_linux-64 14.*)
            want = [planned_spec(s) for s in output.requirements[key] if s.split()[0] not in ("compiler", "stdlib")]
            assert [s for s in got if not s.split()[0].endswith("_linux-64")] == want, (name, key)
        exports = [rendered_spec(s) for s in requirements.get("run_exports", {}).get("weak", [])]
        assert exports == [planned_spec(s) for s in output.requirements["run_exports"]]
    libtorch = rendered[("libtorch", None)]
    assert libtorch.variant.get("torch_cuda_arch_list") == (recipe.arch_list or "None")  # part of libtorch's hash
    build = libtorch.recipe.staging_caches[0].requirements.to_dict()["build"]
    compilers = [s for s in build if str(s).endswith(".*") and "_linux-64" in str(s)]
    assert [c.split()[0] for c in compilers] == ["sysroot_linux-64", "gcc_linux-64", "gxx_linux-64",
                                                  *(["cuda-nvcc_linux-64"] if recipe.cuda else [])]


def test_the_rattler_build_recipe_builds_libtorch_once_and_each_python_from_it() -> None:
    recipe = conda_forge.plan("2.13.0", "linux-64", "13.0", "9.0", ("3.11", "3.12"))
    files = rattler_files(recipe)
    assert sorted(files) == ["activate.sh", "build.sh", "deactivate.sh", "recipe.yaml", "variants.yaml"]
    assert files["variants.yaml"] == conda_forge.recipe_files(recipe, SOURCE)["conda_build_config.yaml"]
    doc = YAML(typ="safe").load(files["recipe.yaml"])
    staging, *packages = doc["outputs"]
    assert staging["staging"]["name"] == "libtorch-build"
    assert staging["build"]["script"] == {"file": "build.sh", "env": {"TORCHFORGE_OUTPUT": "libtorch"}}
    assert "python 3.12.*" in staging["requirements"]["host"]  # the feedstock's, chosen too: libtorch keeps it
    assert [p["package"]["name"] for p in packages] == ["libtorch", "pytorch", "pytorch-gpu"]
    assert packages[0]["inherit"] == "libtorch-build"  # libtorch: the staging files and its host's run_exports
    assert packages[1]["inherit"] == {"from": "libtorch-build", "run_exports": False}
    assert packages[1]["build"]["script"]["env"] == {"TORCHFORGE_OUTPUT": "pytorch"}
    assert "inherit" not in packages[2]
    assert doc["extra"]["torchforge_settings"] == recipe.settings
