"""The torch_like C++ fixture (PyTorch's layout, not PyTorch) through the real pytorch recipe with the
embedded rattler-build engine: render → build against a channel of stand-in packages → RPATH audit →
local channel → install into a fresh prefix with py-rattler → import and run the C++ code. The CUDA variant
also bundles stand-ins for cuDNN, CUPTI and cuSPARSELt the way the official recipe did."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.rattler_in_child import solve_and_install
from tests.stubchannel import Stub, make_stub_channel, recipe_requirements, write_stub
from torchforge import localchannel, sourcestate
from torchforge.cli import main
from torchforge.elf import read_elf
from torchforge.flavours.official.recipe import pytorch_context
from torchforge.flavours.official.render import plan, render_files
from torchforge.templates import RecipeFormat
from torchforge.flavours.official.resolve import classify
from torchforge.flavours.official.variant import Options, Request, Selection

FIXTURE = Path(__file__).parent / "fixtures" / "torch_like"
REQUEST = ["--pytorch", "2.9.0", "--flavour", "official", "--cuda", "cpu", "--py", "3.11"]
# --source makes a custom build: its build string carries the hash of the settings (torchforge.flavours.official.resolve).
# A local source is identified by its content or git state (torchforge.sourcestate), as the CLI does.
SOURCE = Options(source=str(FIXTURE), source_identity=sourcestate.identity(str(FIXTURE)))
STEM = "pytorch-2.9.0-" + str(classify(Request("2.9.0", "cpu", "3.11", "linux-64", SOURCE)).build_string)


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
    package = built / "linux-64" / f"{STEM}.conda"
    assert package.is_file()
    repodata = json.loads((built / "linux-64" / "repodata.json").read_text())
    assert list(repodata["packages.conda"]) == [f"{STEM}.conda"]
    assert not list(built.glob(".torchforge-tmp-*"))
    # The engine recorded the variant's settings in info/about.json, where the reuse check reads them.
    assert json.loads(str(localchannel.about_extra(package)["torchforge_settings"])) == {"source": SOURCE.source_identity}
    # The pipeline publishes only after torchforge.rpath.audit passed; check the RPATH the recipe set.
    from torchforge.rpath import Layout, audit

    report = audit(package, Layout.CONDA)
    assert report.ok, report.findings
    prefix = tmp_path / "prefix"
    records = solve_and_install([built, stubs], ["pytorch"], prefix, cache=tmp_path / "cache")
    assert {r.name for r in records} >= {"pytorch", "python", "pytorch-mutex"}
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


# ---- bundled CUDA libraries: an official CUDA variant (2.5.1, CUDA 12.4) ------------------------------------
# torch_like links stand-ins for cuDNN (libcudnn.so.9, which needs libcudnn_graph.so.9), CUPTI (libcupti.so.12)
# and cuSPARSELt (libcusparseLt.so.0), built here with gcc (tests/fixtures/cuda_like). The recipe's bundling step
# (release/2.5:conda/pytorch-nightly/build.sh:63-67) must carry them: cuDNN under its own names, the others
# renamed <stem>-<sha8>.<rest> with DT_NEEDED rewritten.

CUDA_REQUEST = ["--pytorch", "2.5.1", "--cuda", "12.4", "--py", "3.11"]
# --source makes it a custom build (`_tf<hash>` before the build number); the rest is the official string.
CUDA_STEM = "pytorch-2.5.1-" + str(classify(Request("2.5.1", "12.4", "3.11", "linux-64", SOURCE)).build_string)
CUDA_ID = "pytorch-2.5.1-cu124-py311-linux_64"


def cuda_selection() -> Selection:
    return Selection.from_flags("2.5.1", "12.4", "3.11", None, Options(source=str(FIXTURE)))


@pytest.fixture(scope="module")
def cuda_like(tmp_path_factory: pytest.TempPathFactory) -> Path:
    sys.path.insert(0, str(FIXTURE.parent / "cuda_like"))
    try:
        import build as cuda_like_build  # tests/fixtures/cuda_like/build.py
    finally:
        sys.path.pop(0)
    return cuda_like_build.build(tmp_path_factory.mktemp("cuda_like"))


def stub_channel_for(selection: Selection, channel: Path) -> Path:
    """Stand-ins for every requirement of the selection's one pytorch recipe, plus its planned magma-cudaXYZ
    and pytorch-cuda packages themselves, so the pipeline reuses them instead of building them: these tests are
    about the pytorch package."""
    render_plan = plan(selection)
    (variant,) = render_plan.variants
    recipe = render_files(pytorch_context(variant), RecipeFormat.RATTLER_BUILD)["recipe.yaml"]
    make_stub_channel(channel, [*recipe_requirements(recipe), "pip"])
    for magma in render_plan.magma:
        write_stub(Stub(magma.name, magma.version, magma.build_string), channel / "linux-64")
    # pytorch-cuda too: torchforge's own would depend on NVIDIA's cuda-* packages, which no channel here has.
    for companion in render_plan.companions:
        if not companion.noarch:
            write_stub(Stub(companion.name, companion.version, companion.build_string), channel / "linux-64")
    localchannel.index(channel)
    return channel


@pytest.fixture(scope="module")
def cuda_stubs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return stub_channel_for(cuda_selection(), tmp_path_factory.mktemp("cuda-stubs"))


@pytest.fixture()
def cuda_env(cuda_like: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    # Forwarded through the recipe's script_env, as on a real build machine whose cuDNN is not in CUDA_HOME.
    for variable in ("CUDNN_LIB_DIR", "CUPTI_LIB_DIR", "CUSPARSELT_LIB_DIR"):
        monkeypatch.setenv(variable, str(cuda_like))
    return cuda_like


@pytest.mark.slow
def test_cuda_variant_bundles_the_libraries_and_imports_with_empty_ld_library_path(
        cuda_env: Path, cuda_stubs: Path, tmp_path: Path) -> None:
    from torchforge.rpath import Layout, audit

    out = tmp_path / "channel"
    code = main(["build", *CUDA_REQUEST, "--source", str(FIXTURE), "--out", str(out),
                 "--channel", f"file://{cuda_stubs}", "--config", str(offline_site(cuda_stubs)),
                 "--skip-preflight"])
    assert code == 0, (out / "logs" / f"{CUDA_ID}.log").read_text()[-3000:]
    package = out / "linux-64" / f"{CUDA_STEM}.conda"
    report = audit(package, Layout.CONDA)
    assert report.ok, report.findings
    prefix = tmp_path / "prefix"
    solve_and_install([out, cuda_stubs], ["pytorch"], prefix, cache=tmp_path / "cache")
    lib = prefix / "lib" / "python3.11" / "site-packages" / "torch" / "lib"
    names = sorted(p.name for p in lib.iterdir())
    # cuDNN keeps its names (its libraries load each other by name); CUPTI and cuSPARSELt get the hash.
    cupti = next(n for n in names if n.startswith("libcupti-"))
    cusparselt = next(n for n in names if n.startswith("libcusparseLt-"))
    digest = hashlib.sha256((cuda_env / "libcupti.so.12").read_bytes()).hexdigest()[:8]
    assert cupti == f"libcupti-{digest}.so.12" and re.fullmatch(r"libcusparseLt-[0-9a-f]{8}\.so\.0", cusparselt)
    assert {"libcudnn.so.9", "libcudnn_graph.so.9"} <= set(names)
    info = read_elf(lib / "libtorch_like.so")
    assert info is not None and info.needed[:3] == ("libcudnn.so.9", cupti, cusparselt)
    assert info.rpath == ("$ORIGIN", "$ORIGIN/../../../..") and not info.runpath
    # A clean process: no LD_LIBRARY_PATH, nothing from the build machine's directories.
    result = subprocess.run([str(prefix / "bin" / "python"), "-c",
                             "import torch; print(torch.cudnn_version(), torch.cudnn_create(), torch.ones_sum(2))"],
                            capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": ""})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["90100", "0", "2.0"]


@pytest.mark.slow
def test_the_same_build_without_the_bundling_step_fails_the_audit(
        cuda_env: Path, cuda_stubs: Path, tmp_path: Path) -> None:
    from torchforge.channels import SiteChannels
    from torchforge.engines.choice import select_engine
    from torchforge.pipeline import BuildSettings, Pipeline
    from torchforge.sequence import official_steps
    from torchforge.proc import Runner

    engine, _ = select_engine("rattler-build")
    # Without the recipe's import test (upstream built with --no-test, official-builds.md §1.6): the RPATH audit
    # alone has to stop the package.
    settings = BuildSettings(out=tmp_path / "channel", channels=(f"file://{cuda_stubs}",), test=False,
                             site_channels=SiteChannels(replace=(f"file://{cuda_stubs}",)))
    steps = official_steps(plan(cuda_selection()), engine, settings)
    pytorch = next(s for s in steps if s.kind == "pytorch")
    script = str(pytorch.files["build.sh"])
    start, end = script.index("# Bundled libraries"), script.index("# RPATH, official rules")
    without = dataclasses.replace(pytorch, files={**pytorch.files, "build.sh": script[:start] + script[end:]})
    results = Pipeline(engine, Runner(), settings).run([without if s is pytorch else s for s in steps])
    assert not results[-1].ok
    # libcudnn.so.9 and libcusparseLt.so.0 are provided neither by the package nor by a dependency;
    # libcupti.so.12 is (pytorch-cuda pulls cuda-cupti, torchforge/data/rpath.toml).
    assert "unresolved libcudnn.so.9" in results[-1].error and "libcusparseLt.so.0" in results[-1].error
    assert "libcupti.so.12" not in results[-1].error
    assert not list((tmp_path / "channel" / "linux-64").glob("pytorch-2.5.1-*"))


@pytest.mark.slow
def test_a_bundled_cudnn_other_than_the_build_string_names_stops_the_build(
        cuda_env: Path, tmp_path: Path) -> None:
    # 2.9.0 with CUDA 12.8 names cuDNN 9.10.2 (py3.11_cuda12.8_cudnn9.10.2_0); the stand-in reports 9.1.0.
    selection = Selection.from_flags("2.9.0", "12.8", "3.11", None, Options(source=str(FIXTURE)))
    stubs = stub_channel_for(selection, tmp_path / "stubs")
    out = tmp_path / "channel"
    code = main(["build", "--pytorch", "2.9.0", "--flavour", "official", "--cuda", "12.8", "--py", "3.11", "--source", str(FIXTURE),
                 "--out", str(out), "--channel", f"file://{stubs}", "--config", str(offline_site(stubs)),
                 "--skip-preflight"])
    assert code != 0
    log = (out / "logs" / "pytorch-2.9.0-cu128-py311-linux_64.log").read_text()
    assert "the bundled cuDNN reports version 90100, the build string names 91002" in log
    assert not list((out / "linux-64").glob("pytorch-2.9.0-*"))
