"""The torch_like C++ fixture (PyTorch's layout, not PyTorch) through the real pytorch recipe with the
embedded rattler-build engine: render → build against a channel of stand-in packages → RPATH audit →
local channel → install into a fresh prefix with py-rattler → import and run the C++ code."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import pytest

from tests.stubchannel import make_stub_channel, recipe_requirements
from torchforge import localchannel
from torchforge.cli import main
from torchforge.elf import read_elf
from torchforge.recipe import pytorch_context
from torchforge.render import RecipeFormat, plan, render_files
from torchforge.resolve import classify
from torchforge.variant import Options, Request, Selection

FIXTURE = Path(__file__).parent / "fixtures" / "torch_like"
REQUEST = ["--pytorch", "2.9.0", "--cuda", "cpu", "--py", "3.11"]
# --source makes a custom build: its build string carries the hash of the settings (torchforge.resolve).
STEM = "pytorch-2.9.0-" + str(classify(Request("2.9.0", "cpu", "3.11", "linux-64", Options(source=str(FIXTURE)))).build_string)


def rendered_recipe() -> str:
    selection = Selection.from_flags("2.9.0", "cpu", "3.11", None, Options(source=str(FIXTURE)))
    (variant,) = plan(selection).variants
    return render_files(pytorch_context(variant), RecipeFormat.RATTLER_BUILD)["recipe.yaml"]


@pytest.fixture(scope="module")
def stubs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    channel = tmp_path_factory.mktemp("stubs")
    # `pip` is what rattler-build's python test (`pip check`) adds to the recipe's own requirements.
    make_stub_channel(channel, [*recipe_requirements(rendered_recipe()), "pip"])
    return channel


def offline_site(stubs: Path) -> Path:
    """torchforge.toml of a site without internet: the stand-in channel replaces every data channel."""
    config = stubs.parent / f"{stubs.name}-torchforge.toml"
    config.write_text(f'[channels]\nreplace = ["file://{stubs}"]\n')
    return config


@pytest.fixture(scope="module")
def built(stubs: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    channel = tmp_path_factory.mktemp("forge") / "channel"
    code = main(["build", *REQUEST, "--source", str(FIXTURE), "--out", str(channel),
                 "--config", str(offline_site(stubs)), "--skip-preflight"])
    assert code == 0, (channel / "logs" / "pytorch-2.9.0-cpu-py311-linux_64.log").read_text()[-3000:]
    return channel


def test_stub_versions_follow_the_specs(stubs: Path) -> None:
    names = sorted(p.name for p in (stubs / "linux-64").glob("*.conda"))
    assert "pytorch-mutex-1.0-cpu.conda" in names and "blas-1.0-mkl.conda" in names
    assert "setuptools-72.1.0-stub_0.conda" in names and "python-3.11-stub_0.conda" in names
    assert "llvm-openmp-15.0-stub_0.conda" in names  # `<16` asks for a lower version


@pytest.mark.slow
def test_torch_like_builds_through_the_pytorch_recipe_and_imports_after_install(
        built: Path, stubs: Path, tmp_path: Path) -> None:
    import rattler

    package = built / "linux-64" / f"{STEM}.conda"
    assert package.is_file()
    repodata = json.loads((built / "linux-64" / "repodata.json").read_text())
    assert list(repodata["packages.conda"]) == [f"{STEM}.conda"]
    assert not list(built.glob(".staging-*"))
    # The engine recorded the variant's settings in info/about.json, where the reuse check reads them.
    assert json.loads(str(localchannel.about_extra(package)["torchforge_settings"])) == {"source": str(FIXTURE)}
    # The pipeline publishes only after torchforge.rpath.audit passed; check the RPATH the recipe set.
    from torchforge.rpath import Layout, audit

    report = audit(package, Layout.CONDA)
    assert report.ok, report.findings
    records = asyncio.run(rattler.solve([str(built), str(stubs)], ["pytorch"], platforms=["linux-64", "noarch"]))
    assert {r.name.normalized for r in records} >= {"pytorch", "python", "pytorch-mutex"}
    prefix = tmp_path / "prefix"
    asyncio.run(rattler.install(records, target_prefix=prefix, cache_dir=tmp_path / "cache", show_progress=False))
    extension = next((prefix / "lib" / "python3.11" / "site-packages" / "torch").glob("_C*.so"))
    info = read_elf(extension)
    assert info is not None and not info.runpath  # the recipe's patchelf loop forces DT_RPATH
    assert "$ORIGIN/lib" in info.rpath
    result = subprocess.run([str(prefix / "bin" / "python"), "-c",
                             "import torch; print(torch.ones_sum(3), torch.__version__, torch.__file__)"],
                            capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    value, version, location = result.stdout.split()
    assert (float(value), version) == (3.0, "2.9.0")
    assert Path(location).is_relative_to(prefix)


@pytest.mark.slow
def test_second_identical_build_reuses_the_package(built: Path, stubs: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    before = (built / "linux-64" / f"{STEM}.conda").stat().st_mtime_ns
    assert main(["build", *REQUEST, "--source", str(FIXTURE), "--out", str(built),
                 "--config", str(offline_site(stubs)), "--skip-preflight"]) == 0
    assert f"reuse {STEM}: already in" in capsys.readouterr().err
    assert (built / "linux-64" / f"{STEM}.conda").stat().st_mtime_ns == before
