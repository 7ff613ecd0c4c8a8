"""The official flavour's `--with torchvision,torchaudio` (PyTorch 2.4-2.5, issue 32): the pytorch channel's
package names, pinned to the planned pytorch file, checked against published names; the recipes rendered in the
official layout and read by the real rattler-build."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from torchforge.cli import main
from torchforge.errors import ExitCode

FIXTURE = Path(__file__).parent / "fixtures" / "official_stack_names.toml"
PUBLISHED = tomllib.loads(FIXTURE.read_text())["installed"]


def matrix_json(capsys: pytest.CaptureFixture[str], *argv: str) -> list[dict[str, object]]:
    assert main(["matrix", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("published", PUBLISHED, ids=lambda p: p["pytorch"])
def test_matrix_names_the_published_files_pinned_to_the_planned_pytorch(
        published: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    # pytorch-2.5.1-py3.12_cuda12.4_cudnn9.1.0_0 -> --pytorch 2.5.1 --cuda 12.4 --py 3.12
    version, build = published["pytorch"].removeprefix("pytorch-").split("-")  # also py3.10_cuda12.1_cudnn9_0
    python, cuda = build.split("_")[0].removeprefix("py"), build.split("_")[1].removeprefix("cuda")
    rows = matrix_json(capsys, "--pytorch", version, "--cuda", cuda, "--py", python,
                       "--platform", published.get("platform", "linux-64"), "--with", "torchvision,torchaudio")
    (pytorch,) = [r for r in rows if r["package"] == "pytorch"]
    assert f"pytorch-{version}-{pytorch['build_string']}" == published["pytorch"]
    stack = {r["package"]: r for r in rows if r.get("file")}
    assert {name: row["file"] for name, row in stack.items()} == {
        "torchvision": published["torchvision"], "torchaudio": published["torchaudio"]}
    assert {row["pytorch"] for row in stack.values()} == {published["pytorch"]}


def test_the_cpu_build_string_is_upstreams_cpu_form(capsys: pytest.CaptureFixture[str]) -> None:
    rows = matrix_json(capsys, "--pytorch", "2.4.1", "--cuda", "cpu", "--py", "3.11", "--with", "torchaudio")
    (audio,) = [r for r in rows if r.get("file")]
    # the form of the published torchaudio=2.0.2=py311_cpu (tests/fixtures/official_stack_names.toml)
    assert audio["file"] == "torchaudio-2.4.1-py311_cpu" and audio["pytorch"] == "pytorch-2.4.1-py3.11_cpu_0"


def rendered(folder: Path) -> dict[str, object]:
    """rattler-build's own render of a recipe folder (py-rattler-build)."""
    from rattler_build import Stage0Recipe, VariantConfig

    (variant,) = Stage0Recipe.from_file(folder / "recipe.yaml").render(VariantConfig())
    recipe = variant.recipe
    return {"name": recipe.package.name, "version": str(recipe.package.version), "string": recipe.build.string,
            **recipe.requirements.to_dict()}


def test_render_writes_both_recipes_in_the_official_layout_and_rattler_build_reads_them(tmp_path: Path) -> None:
    assert main(["render", "--pytorch", "2.5.1", "--cuda", "12.4", "--py", "3.12", "--with", "torchvision,torchaudio",
                 "--format", "rattler-build", "--out", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "magma-cuda124-2.6.1-linux_64", "pytorch-2.5.1-cu124-py312-linux_64",
        "torchaudio-2.5.1-cu124-py312-linux_64", "torchvision-0.20.1-cu124-py312-linux_64"]
    vision = rendered(tmp_path / "torchvision-0.20.1-cu124-py312-linux_64")
    assert (vision["name"], vision["version"], vision["string"]) == ("torchvision", "0.20.1", "py312_cu124")
    assert "pytorch ==2.5.1 py3.12_cuda12.4_cudnn9.1.0_0" in vision["host"]  # the planned file
    for spec in ("pytorch ==2.5.1", "pytorch-mutex ==1.0 cuda", "pytorch-cuda 12.4.*", "pillow !=8.3.*,>=5.3.0"):
        assert spec in vision["run"], vision["run"]
    assert vision["run_constraints"] == ["cpuonly <0"]
    audio = rendered(tmp_path / "torchaudio-2.5.1-cu124-py312-linux_64")
    assert audio["string"] == "py312_cu124" and "numpy" not in audio["run"]  # torchaudio 2.5.1's wheel needs torch only
    script = (tmp_path / "torchaudio-2.5.1-cu124-py312-linux_64" / "build.sh").read_text()
    assert "export USE_CUDA=1" in script and "export TORCH_CUDA_ARCH_LIST='5.0;6.0;6.1;7.0;7.5;8.0;8.6;9.0'" in script


def test_the_cpu_recipe_selects_the_cpu_mutex_and_constrains_cpuonly(tmp_path: Path) -> None:
    assert main(["render", "--pytorch", "2.5.1", "--cuda", "cpu", "--py", "3.12", "--with", "torchvision",
                 "--format", "rattler-build", "--out", str(tmp_path)]) == 0
    vision = rendered(tmp_path / "torchvision-0.20.1-cpu-py312-linux_64")
    assert vision["string"] == "py312_cpu" and vision["run_constraints"] == ["cpuonly"]
    assert "pytorch-mutex ==1.0 cpu" in vision["run"] and not any("pytorch-cuda" in s for s in vision["run"])
    assert "FORCE_CUDA" not in (tmp_path / "torchvision-0.20.1-cpu-py312-linux_64" / "build.sh").read_text()


def test_the_meta_yaml_pins_the_same_file_in_conda_builds_words(tmp_path: Path) -> None:
    assert main(["render", "--pytorch", "2.4.0", "--cuda", "12.1", "--py", "3.11", "--with", "torchvision",
                 "--format", "conda-build", "--out", str(tmp_path)]) == 0
    meta = (tmp_path / "torchvision-0.19.0-cu121-py311-linux_64" / "meta.yaml").read_text()
    assert "string: py311_cu121" in meta and "- pytorch 2.4.0 py3.11_cuda12.1_cudnn9.1.0_0" in meta
    assert "- pytorch-mutex 1.0 cuda" in meta and "- pytorch ==2.4.0" in meta and "- cpuonly <0" in meta


def test_build_plans_them_after_their_pytorch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["build", "--pytorch", "2.5.1", "--cuda", "cpu", "--py", "3.12", "--with", "torchvision,torchaudio",
                 "--dry-run", "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().err
    order = [printed.index(f"build {stem} ") for stem in (
        "pytorch-2.5.1-py3.12_cpu_0", "torchvision-0.20.1-py312_cpu", "torchaudio-2.5.1-py312_cpu")]
    assert order == sorted(order), printed


@pytest.mark.parametrize(("argv", "code", "message"), [
    (["--pytorch", "2.0.1", "--py", "3.11", "--with", "torchvision"], ExitCode.REFUSED,
     "--with has no facts for PyTorch 2.0.1's torchvision and torchaudio in the official flavour"),
    (["--pytorch", "2.5.1", "--py", "3.12", "--with", "torchtext"], ExitCode.USAGE, "--with names 'torchtext'"),
    (["--pytorch", "2.5.1", "--py", "3.12", "--platform", "osx-arm64", "--with", "torchvision"], ExitCode.REFUSED,
     "--with renders torchvision for linux-64, linux-aarch64, win-64, not osx-arm64"),
])
@pytest.mark.parametrize("command", ["matrix", "render"])
def test_what_the_official_flavour_cannot_plan_is_refused_with_what_would_work(
        command: str, argv: list[str], code: int, message: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    out = ["--out", str(tmp_path / "r")] if command == "render" else []
    assert main([command, *argv, "--cuda", "cpu", *out]) == code
    text = " ".join(capsys.readouterr().err.split())
    assert message in text and "what would work" in text and "Traceback" not in text
    assert not (tmp_path / "r").exists()  # nothing half-written


def test_a_release_the_pytorch_channel_never_published_takes_pypis_pairing_and_says_so(
        capsys: pytest.CaptureFixture[str]) -> None:
    """PyTorch 2.7.0 in the official shape (torchforge's hybrid): torchvision 0.22.0, the release PyPI's wheel pins
    to torch 2.7.0, with that wheel's run requirements, built against the planned pytorch file; a warning cites the
    table (before: refused)."""
    assert main(["matrix", "--pytorch", "2.7.0", "--flavour", "official", "--cuda", "cpu", "--py", "3.12", "--with",
                 "torchvision", "--json"]) == 0
    captured = capsys.readouterr()
    (row,) = [r for r in json.loads(captured.out) if r.get("package") == "torchvision"]
    assert (row["version"], row["file"], row["pytorch"]) == (
        "0.22.0", "torchvision-0.22.0-py312_cpu", "pytorch-2.7.0-py3.12_cpu_0")
    from torchforge.flavours.official import stack as officialstack
    from torchforge.flavours.official import pytorch_build
    from torchforge.flavours.official.render import plan
    from torchforge.flavours.official.variant import Options, Selection

    (variant,) = plan(Selection.from_flags("2.7.0", "cpu", "3.12", "linux-64", Options())).variants
    recipe = officialstack.plan("torchvision", pytorch_build(variant), (variant.id,))
    assert recipe.requires == ("numpy", "pillow !=8.3.*,>=5.3.0") and recipe.mutex
    assert "torchforge/data/stack_pairing.toml" in recipe.warnings[0]


def test_with_and_format_wheel_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["build", "--pytorch", "2.5.1", "--cuda", "cpu", "--py", "3.12", "--with", "torchvision",
                 "--format", "wheel", "--dry-run", "--out", str(tmp_path / "out")]) == ExitCode.USAGE
    assert "--with builds conda packages, not --format wheel" in capsys.readouterr().err


@pytest.mark.slow
def test_the_planned_recipe_builds_a_package_with_upstreams_name_and_pins(tmp_path: Path) -> None:
    """The torchvision recipe of the plan, built by the embedded rattler-build through the pipeline from a
    pure-Python source tree laid out as a release is (setup.py reads BUILD_VERSION; not torchvision), against a
    stand-in channel whose pytorch is the planned file pytorch-2.5.1-py3.11_cpu_0 (a build of the real pytorch
    2.5.1 is hours): the package is torchvision-0.20.1-py311_cpu and records upstream's pins."""
    import dataclasses
    import sys

    from tests.test_conda_forge_split import package_index
    from torchforge import standin
    from torchforge.flavours.official import stack as officialstack
    from torchforge.channels import SiteChannels
    from torchforge.engines.choice import select_engine
    from torchforge.flavours.base import Plan
    from torchforge.pipeline import BuildSettings, Pipeline, plan_steps
    from torchforge.proc import Runner
    from torchforge.flavours.official.render import plan
    from torchforge.flavours.official import pytorch_build
    from torchforge.templates import RecipeFormat
    from torchforge.flavours.official.variant import Options, Selection

    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    source = tmp_path / "src"
    (source / "torchvision").mkdir(parents=True)
    (source / "torchvision" / "__init__.py").write_text("__version__ = '0.20.1'\n")
    (source / "setup.py").write_text("import os\nfrom setuptools import setup\n"
                                     "setup(name='torchvision', version=os.environ['BUILD_VERSION'], packages=['torchvision'])\n")
    (variant,) = plan(Selection.from_flags("2.5.1", "cpu", python, "linux-64", Options())).variants
    recipe = officialstack.plan("torchvision", pytorch_build(variant), (variant.id,))
    stubs = tmp_path / "stubs"
    planned = officialstack.planned_recipe(recipe, RecipeFormat.RATTLER_BUILD, (stubs.as_uri(),), str(source))
    folder = tmp_path / "recipe"
    folder.mkdir()
    for name, text in planned.files.items():
        (folder / name).write_text(str(text))
    (folder / "variants.yaml").write_text("{}\n")
    specs = standin.rendered_recipe_requirements(folder, {"torchvision"})
    assert f"pytorch ==2.5.1 {variant.build_string}" in specs  # the stand-in is the planned pytorch file
    standin.make_stub_channel(stubs, specs)
    settings = BuildSettings(out=tmp_path / "out", site_channels=SiteChannels())
    engine, _ = select_engine("rattler-build")
    (result,) = Pipeline(engine, Runner(), settings).run(plan_steps(Plan("official", (planned,)), settings))
    assert result.ok, [log.read_text()[-3000:] for log in (tmp_path / "out" / "logs").glob("*")]
    index = package_index(tmp_path / "out" / "linux-64" / f"torchvision-0.20.1-py{python.replace('.', '')}_cpu.conda")
    assert index["build"] == f"py{python.replace('.', '')}_cpu"
    for spec in ("pytorch ==2.5.1", "pytorch-mutex ==1.0 cpu", "pillow !=8.3.*,>=5.3.0", "numpy"):
        assert spec in index["depends"], index["depends"]
    assert index["constrains"] == ["cpuonly"]
    from torchforge.pipeline import Action

    (again,) = plan_steps(Plan("official", (planned,)), settings)
    assert again.action is Action.REUSE  # the same settings (the same pytorch file): not built twice
    other = officialstack.planned_recipe(officialstack.plan("torchvision", pytorch_build(dataclasses.replace(
        variant, build_string=variant.build_string.replace("_0", "_1"))), (variant.id,)), RecipeFormat.RATTLER_BUILD,
        (stubs.as_uri(),), str(source))
    (rebuilt,) = plan_steps(Plan("official", (other,)), settings)
    assert rebuilt.action is Action.BUILD  # against another pytorch file: built again


@pytest.mark.parametrize("with_", [["--with", "torchvision"], []])
def test_doctor_says_the_arch_check_runs_for_a_cuda_plan_with_companions(with_: list[str], tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """The arch check lists the libraries of every CUDA package torchforge compiles after its build (pytorch's own,
    a companion's): doctor (and build's preflight) say so; a CPU plan has no such row. The channels are a local one
    holding what the pytorch recipe's requirements solve to; this machine has CUDA 13.0, not 12.4: exit 9 for that alone."""
    from tests.offline_site import offline_site
    from tests.test_doctor import requirements

    config = offline_site(tmp_path / "site", requirements("2.5.1", "12.4", "3.12"))
    code = main(["doctor", "--pytorch", "2.5.1", "--cuda", "12.4", "--py", "3.12", *with_, "--out", str(tmp_path),
                 "--config", str(config), "--json"])
    checks = {row["name"]: row for row in json.loads(capsys.readouterr().out)["checks"]}
    failed = {name for name, row in checks.items() if row["status"] == "fail"}
    assert code == ExitCode.PREFLIGHT_FAILED and failed and all(
        name.endswith("(CUDA 12.4)") or name.startswith("bundled ") for name in failed), failed
    channel_rows = [row for name, row in checks.items() if name.startswith(("channel ", "requirements "))]
    assert channel_rows and all(row["status"] == "ok" for row in channel_rows), channel_rows
    assert checks["arch check"]["status"] == "ok", checks.keys()
    cpu_config = offline_site(tmp_path / "site-cpu", requirements("2.5.1", "cpu", "3.12"))
    cpu_code = main(["doctor", "--pytorch", "2.5.1", "--cuda", "cpu", "--py", "3.12", *with_, "--out", str(tmp_path),
                     "--config", str(cpu_config), "--json"])
    cpu_checks = {row["name"] for row in json.loads(capsys.readouterr().out)["checks"]}
    assert cpu_code == 0 and "arch check" not in cpu_checks, cpu_checks
    # the plan's --with packages are named first, each with the pytorch file it is built against
    named = "torchvision-0.20.1-py312_cu124 (pytorch pytorch-2.5.1-py3.12_cuda12.4_cudnn9.1.0_0)"
    assert any(named in row["detail"] for row in checks.values()) == bool(with_), checks.get("--with")


def test_every_row_is_the_pairing_its_wheels_pin() -> None:
    """Each release's companion wheels (cited with file and sha256) require exactly that pytorch: the pairing of
    test-infra's release matrix, confirmed by the packages themselves."""
    from torchforge.flavours.official import stack as officialstack

    rows = officialstack.load().release
    assert [r.pytorch for r in rows][0] == "2.1.0" and [r.pytorch for r in rows][-1] == "2.5.1"
    for row in rows:
        for package in ("torchvision", "torchaudio"):
            cited = getattr(row, f"{package}_wheel")
            assert cited.startswith(f"{package}-{getattr(row, package)}-") and f"torch=={row.pytorch}" in cited, cited


def test_the_2_1_recipes_carry_that_releases_own_requirements(tmp_path: Path) -> None:
    assert main(["render", "--pytorch", "2.1.2", "--cuda", "11.8", "--py", "3.11", "--with", "torchvision",
                 "--format", "rattler-build", "--out", str(tmp_path)]) == 0
    vision = rendered(tmp_path / "torchvision-0.16.2-cu118-py311-linux_64")
    assert vision["string"] == "py311_cu118" and "pytorch-cuda 11.8.*" in vision["run"]
    assert "requests" in vision["run"]  # torchvision 0.16's wheels require it; 0.20's do not


@pytest.fixture(scope="module")
def conda_build_python() -> Path:
    from tests import tool_venvs

    if not tool_venvs.vendored_conda_present():
        pytest.skip(f"no conda wheels in {tool_venvs.VENDOR}: the meta.yaml check renders with the real conda-build")
    return tool_venvs.ensure("conda") / "python"


@pytest.mark.parametrize("cuda", ["12.4", "cpu"])
def test_conda_builds_render_of_the_meta_yaml_says_what_rattler_builds_render_of_the_recipe_yaml_says(
        cuda: str, tmp_path: Path, conda_build_python: Path) -> None:
    """The same package in either engine's format: the real conda-build's render of meta.yaml and the real
    rattler-build's of recipe.yaml give the same build string and requirements (rattler-build's exact
    `==V` and `==V BUILD` are conda-build's `V` and `V BUILD`)."""
    from tests.feedstock_oracle import render as conda_build_render

    folder = f"torchvision-0.20.1-{'cu124' if cuda != 'cpu' else 'cpu'}-py312-linux_64"
    for fmt in ("conda-build", "rattler-build"):
        assert main(["render", "--pytorch", "2.5.1", "--cuda", cuda, "--py", "3.12", "--with", "torchvision",
                     "--format", fmt, "--out", str(tmp_path / fmt)]) == 0
    theirs = conda_build_render(tmp_path / "conda-build" / folder, "linux-64", None)["torchvision"]["fields"]
    ours = rendered(tmp_path / "rattler-build" / folder)

    def conda_words(specs: list[str]) -> list[str]:
        return [spec.replace("pytorch-mutex ==1.0", "pytorch-mutex 1.0").replace("pytorch ==2.5.1 py", "pytorch 2.5.1 py")
                for spec in specs]

    assert theirs["build.string"] == ours["string"]
    assert theirs["requirements.host"] == conda_words(ours["host"])
    assert theirs["requirements.run"] == conda_words(ours["run"])
    assert theirs["requirements.run_constrained"] == ours["run_constraints"]


def test_the_windows_recipe_has_a_bld_bat_and_the_same_pins(tmp_path: Path) -> None:
    assert main(["render", "--pytorch", "2.5.1", "--cuda", "12.1", "--py", "3.10", "--platform", "win-64",
                 "--with", "torchaudio", "--format", "rattler-build", "--out", str(tmp_path)]) == 0
    folder = tmp_path / "torchaudio-2.5.1-cu121-py310-win_64"
    assert sorted(p.name for p in folder.iterdir()) == ["bld.bat", "recipe.yaml"]
    audio = rendered(folder)
    assert audio["string"] == "py310_cu121" and "pytorch ==2.5.1 py3.10_cuda12.1_cudnn9_0" in audio["host"]
    assert "file: bld.bat" in (folder / "recipe.yaml").read_text()
    assert 'set "USE_CUDA=1"' in (folder / "bld.bat").read_text()
