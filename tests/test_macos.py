"""macOS recipes (osx-64 to 2.2, osx-arm64 from 1.13): CPU only, official build strings `py3.10_0`, the
requirements and environment of each era. They cannot be built here, so the rendered files are checked and
rattler-build parses every recipe.yaml for its target platform."""

from __future__ import annotations

import pytest
from packaging.version import Version
from rattler_build import PlatformConfig, RenderConfig, Stage0Recipe
from ruamel.yaml import YAML

from torchforge.flavours.official.render import plan, recipe_folders

from torchforge.templates import RecipeFormat
from torchforge.flavours.official.resolve import classify
from torchforge.flavours.official.resolved import Status
from torchforge.flavours.official.variant import Options, Request, Selection

CASES = [  # (version, python, platform): one per era and platform where upstream published conda packages
    ("1.4.0", "3.7", "osx-64"),
    ("1.7.1", "3.9", "osx-64"),
    ("1.9.1", "3.9", "osx-64"),
    ("1.12.1", "3.10", "osx-64"),
    ("2.2.2", "3.11", "osx-64"),
    ("1.13.1", "3.10", "osx-arm64"),
    ("2.1.2", "3.11", "osx-arm64"),
    ("2.5.1", "3.12", "osx-arm64"),
]


def _files(version: str, python: str, platform: str, fmt: RecipeFormat) -> dict[str, str | bytes]:
    (files,) = recipe_folders(plan(Selection(version, ("cpu",), (python,), platform)), fmt).values()
    return files


@pytest.mark.parametrize(("version", "python", "platform"), CASES)
def test_official_macos_recipes(version: str, python: str, platform: str) -> None:
    variant = classify(Request(version, "cpu", python, platform))
    assert variant.status is Status.OFFICIAL, variant.warnings
    assert variant.build_string == f"py{python}_0"
    meta = YAML(typ="safe").load(_files(version, python, platform, RecipeFormat.CONDA_BUILD)["meta.yaml"])
    run, host = meta["requirements"]["run"], meta["requirements"]["host"]
    assert meta["build"]["string"] == f"py{python}_0"
    assert not any(r.startswith(("pytorch-mutex", "cudatoolkit", "pytorch-cuda", "magma")) for r in run + host)
    assert "features" not in meta["build"]  # cpuonly was `# [not osx]`
    # Intel macs linked MKL ([x86_64] selectors); Apple silicon did not.
    assert any(r.startswith("mkl") for r in host) is (platform == "osx-64")
    constrained = meta["requirements"].get("run_constrained", [])
    assert constrained == (["cpuonly"] if Version(version) >= Version("1.10") else [])  # the mutex era
    script = _files(version, python, platform, RecipeFormat.CONDA_BUILD)["build.sh"]
    assert "export CXX=clang++" in str(script) and "export USE_DISTRIBUTED=1" in str(script)
    target = "11.0" if Version(version) >= Version("2.1") else "10.9"
    assert f"export MACOSX_DEPLOYMENT_TARGET={target}" in str(script)
    assert "patchelf" not in str(script) and "_GLIBCXX_USE_CXX11_ABI" not in str(script)


@pytest.mark.parametrize(("version", "python", "platform"), CASES)
def test_rattler_build_parses_the_macos_recipe_for_its_platform(version: str, python: str, platform: str) -> None:
    recipe = Stage0Recipe.from_yaml(str(_files(version, python, platform, RecipeFormat.RATTLER_BUILD)["recipe.yaml"]))
    config = RenderConfig(platform=PlatformConfig(target_platform=platform, build_platform=platform, host_platform=platform))
    rendered = recipe.render(render_config=config)[0].recipe.to_dict()
    assert rendered["build"]["string"] == f"py{python}_0"
    assert rendered["package"] == {"name": "pytorch", "version": version}


@pytest.mark.parametrize(
    ("request_", "status", "text"),
    [
        (Request("2.3.0", "cpu", "3.11", "osx-64"), Status.BUILDABLE, "exist for linux-64, win-64, osx-arm64 only, not osx-64"),
        (Request("1.12.1", "cpu", "3.10", "osx-arm64"), Status.BUILDABLE, "exist for linux-64, win-64, osx-64 only, not osx-arm64"),
        (Request("2.5.1", "12.4", "3.12", "osx-arm64"), Status.REFUSED, "osx-arm64 builds have no CUDA"),
    ],
)
def test_macos_outside_the_official_range(request_: Request, status: Status, text: str) -> None:
    variant = classify(request_)
    assert variant.status is status
    assert text in "; ".join(variant.refusals + variant.warnings)


def test_custom_macos_build_gets_a_settings_hash() -> None:
    variant = classify(Request("2.2.2", "cpu", "3.10", "osx-64", Options(extra_env=(("USE_MKLDNN", "0"),))))
    assert variant.build_string.startswith("py3.10_tf") and variant.build_string.endswith("_0")
