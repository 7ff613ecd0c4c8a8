"""Extensions planned up front, in the request's own plan (torchforge/extensions/plan.py): one recipe per SPEC and
pytorch package of the plan, pinned to that package's file and built after its recipe; shown by `build --dry-run`
and `matrix` without downloading or running anything; resolved (sdist, pip's metadata, recipe files) when built.
Real sdists (tests/fixtures/sdists), the official and conda-forge flavours' real plans."""

from __future__ import annotations

import dataclasses
import gzip
import json
import subprocess
import tarfile
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from tests.pkgfactory import make_package
from tests.test_upload_helpers import cli
from torchforge import sequence
from torchforge.errors import UsageError
from torchforge.extensions.plan import with_extensions
from torchforge.extensions.recipe import PytorchBuild, build_string
from torchforge.flavours.base import Plan, Request
from torchforge.localchannel import index

SCATTER = Path(__file__).parent / "fixtures" / "sdists" / "torch_scatter-2.1.2.tar.gz"
CPU_REQUEST = ("--pytorch", "2.13.0", "--cuda", "cpu", "--py", "3.11", "--flavour", "official")
# the official flavour's pytorch package of that request (tests/golden: py3.11_cpu_0)
CPU_PYTORCH = PytorchBuild("2.13.0", "py3.11_cpu_0", "linux-64", "3.11", None)


def test_a_dry_run_shows_the_extension_after_its_pytorch_pinned_to_that_build(tmp_path: Path) -> None:
    """`build --dry-run --extension torch-scatter==2.1.2`: its step follows the pytorch step, its build string names
    that pytorch build, and it says what is resolved at build time; nothing is downloaded or created for it."""
    cache = tmp_path / "cache"
    result = cli("build", "--dry-run", *CPU_REQUEST, "--out", str(tmp_path / "out"),
                 "--extension", "torch-scatter==2.1.2", env={"XDG_CACHE_HOME": str(cache)})
    assert result.returncode == 0, result.stderr
    stem = f"torch-scatter-2.1.2-{build_string(CPU_PYTORCH, '', 0)}"
    assert stem.startswith("torch-scatter-2.1.2-pt2.13.0_cpu_") and stem.endswith("_py311_0")
    text = result.stderr
    assert text.index("pytorch-2.13.0-py3.11_cpu_0 ") < text.index(f"{stem} ") < text.index(f"build {stem} (")
    assert "sdist and" in text and "requirements resolved when it is built" in text  # the table folds the column
    assert "for pytorch 2.13.0 py3.11_cpu_0, after recipe" in " ".join(text.split())
    assert f"--recipe {tmp_path / 'out'}/recipes/{stem} " in text  # the engine's command for it, after pytorch's
    assert not cache.exists() and not (tmp_path / "out").exists()


def test_matrix_lists_an_extension_per_pytorch_package_pinned_to_its_file() -> None:
    """conda-forge flavour, two Pythons in one recipe: one extension row per pytorch output, each pinned to that
    output's planned version and build string, after the recipe that makes it."""
    result = cli("matrix", "--json", "--pytorch", "2.7.1", "--cuda", "12.8", "--py", "3.12,3.13", "--arch-list", "9.0",
                 "--flavour", "conda-forge", "--extension", "torch-scatter==2.1.2")
    assert result.returncode == 0, result.stderr
    rows = [row for row in json.loads(result.stdout) if row.get("kind") == "extension"]
    request = Request("2.7.1", "12.8", "3.12,3.13", arch_list="9.0")
    planned = sequence.plan("conda-forge", request, "rattler-build").pytorch_builds()
    assert len(planned) == 2 and len(rows) == 2
    for row, (recipe, pytorch) in zip(rows, planned):
        assert row["pytorch"] == f"2.7.1 {pytorch.build}" and pytorch.build.startswith("cuda128_")
        assert (row["python"], row["cuda"], row["arch_list"], row["needs"]) == (pytorch.python, "12.8", "9.0",
                                                                                [recipe.id])
        assert row["build_string"] == build_string(pytorch, "9.0", 0)
        assert row["build_string"].startswith("pt2.7.1_cu128_") and row["sdist"] == "torch-scatter==2.1.2"
    assert rows[0]["build_string"] != rows[1]["build_string"]
    # conda-forge's recipes take nvcc from its packages; a CUDA extension takes this machine's: preflight checks it
    without = sequence.plan("conda-forge", request, "rattler-build")
    assert not without.needs.toolkit_on_host
    with_scatter = sequence.plan("conda-forge", dataclasses.replace(request, extensions=("torch-scatter==2.1.2",)),
                                 "rattler-build")
    assert with_scatter.needs.toolkit_on_host and with_scatter.needs.cuda_versions == ("12.8",)
    assert with_scatter.needs.arch_checked


def test_the_planned_recipe_resolves_when_built_and_pins_the_planned_pytorch(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The official plan of a CPU request with a local sdist: named from its PKG-INFO when planned; its files,
    read as the pipeline reads them before the build, pin that pytorch file in host and run and record the settings
    the reuse check compared (pip reads the metadata in the cached venv with torch 2.13.0)."""
    _metadata_venv(tmp_path, monkeypatch)
    the_plan = sequence.plan("official", Request("2.13.0", "cpu", "3.11", extensions=(str(SCATTER),)), "rattler-build")
    pytorch_recipe, extension = the_plan.recipes[-2:]
    stem = f"torch-scatter-2.1.2-{build_string(CPU_PYTORCH, '', 0)}"
    assert (extension.kind, extension.stems, extension.needs) == ("extension", (stem,), (pytorch_recipe.id,))
    assert pytorch_recipe.stems == ("pytorch-2.13.0-py3.11_cpu_0",)
    recipe = YAML(typ="safe").load(str(extension.files["recipe.yaml"]).replace("${{", "'${{").replace("}}", "}}'"))
    pin = "pytorch ==2.13.0 py3*11_cpu_0"
    assert recipe["requirements"]["host"] == ["python 3.11.*", "setuptools", "wheel", "pip", pin]
    assert recipe["requirements"]["run"][:2] == ["python 3.11.*", pin]
    assert recipe["build"]["string"] == stem.rsplit("-", 1)[-1]
    assert recipe["extra"]["torchforge_settings"] == extension.settings
    assert json.loads(extension.settings)["sdist"].startswith("sha256:")


def test_an_extension_that_cannot_resolve_stops_the_build_before_the_first_step(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Resolved late, checked early: a build whose extension cannot resolve (here its local sdist changed after the
    plan named it) fails before the pytorch step it follows is built: no log, nothing in the channel."""
    from torchforge.engines.rattler_build import RattlerBuildEngine
    from torchforge.pipeline import BuildSettings, Pipeline, plan_steps
    from torchforge.proc import Runner

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    sdist = tmp_path / SCATTER.name
    sdist.write_bytes(SCATTER.read_bytes())
    the_plan = sequence.plan("official", Request("2.13.0", "cpu", "3.11", extensions=(str(sdist),)), "rattler-build")
    sdist.write_bytes(gzip.compress(gzip.decompress(SCATTER.read_bytes()), mtime=1))  # same files, other bytes
    settings = BuildSettings(out=tmp_path / "out")
    steps = plan_steps(the_plan, settings)
    assert [s.kind for s in steps][-2:] == ["pytorch", "extension"]
    with pytest.raises(UsageError, match="the source changed after it was planned"):
        Pipeline(RattlerBuildEngine(), Runner(), settings).run(steps)
    assert not (tmp_path / "out" / "logs").exists() and not (tmp_path / "out" / "linux-64").exists()


def _metadata_venv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The user cache under tmp_path, its torch 2.13.0 metadata venv the suite's (the same packages)."""
    from tests.tool_venvs import ensure

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    venvs = tmp_path / "cache" / "torchforge" / "extensions"
    venvs.mkdir(parents=True)
    (venvs / "metadata-torch-2.13.0").symlink_to(ensure("torchcpu").parent)


def test_a_git_tag_that_moved_is_planned_and_resolved_from_its_new_tree(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """git+URL@TAG is named from the tree's PKG-INFO when planned; once the tag moves to another commit, the next
    plan resolves it from a fresh clone of the new tree, not from the clone the last build left in the cache."""
    _metadata_venv(tmp_path, monkeypatch)
    channel = tmp_path / "chan"
    make_package(channel / "linux-64", "pytorch", "2.13.0", "whl_py3.11_cpu_0", depends=["python >=3.11,<3.12.0a0"])
    index(channel)
    with tarfile.open(SCATTER) as tar:
        tar.extractall(tmp_path / "src", filter="data")
    tree = tmp_path / "src" / "torch_scatter-2.1.2"
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", "-C", str(tree)]
    request = Request(extensions=(f"git+file://{tree}@v2.1.2",))
    planned = []
    for argv in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "import"], ["tag", "v2.1.2"]):
        subprocess.run([*git, *argv], check=True)
    for change in ("first", "second"):
        if change == "second":  # the tag moves: another tree of the same name and version
            (tree / "README.md").write_text("moved\n")
            for argv in (["commit", "-qam", "moved"], ["tag", "-f", "v2.1.2"]):
                subprocess.run([*git, *argv], check=True, capture_output=True)
        (extension,) = with_extensions(Plan("official", ()), request, "conda-build", channel=channel).recipes
        recipe = YAML(typ="safe").load(str(extension.files["meta.yaml"]))
        assert extension.stems[0].startswith("torch-scatter-2.1.2-pt2.13.0_cpu_")
        assert recipe["extra"]["torchforge_settings"] == extension.settings
        planned.append((extension.settings, recipe["source"]["sha256"]))
    assert planned[0][0] != planned[1][0] and planned[0][1] != planned[1][1]
    assert json.loads(planned[1][0])["sdist"] == f"sha256:{planned[1][1]}"


def test_a_plan_without_pytorch_takes_the_output_channels_or_says_what_is_missing(tmp_path: Path) -> None:
    """--magma-only plans no pytorch: the extension is for the output channel's one pytorch package (as before
    the plan had them); none there, or no channel, is a usage error naming what would work."""
    request = Request(extensions=(str(SCATTER),))
    with pytest.raises(UsageError, match="plans no pytorch package"):
        with_extensions(Plan("official", ()), request, "conda-build")
    with pytest.raises(UsageError, match="0 pytorch packages"):
        with_extensions(Plan("official", ()), request, "conda-build", channel=tmp_path)
    make_package(tmp_path / "linux-64", "pytorch", "2.13.0", "whl_py3.11_cpu_0", depends=["python >=3.11,<3.12.0a0"])
    index(tmp_path)
    (extension,) = with_extensions(Plan("official", ()), request, "conda-build", channel=tmp_path).recipes
    in_channel = PytorchBuild("2.13.0", "whl_py3.11_cpu_0", "linux-64", "3.11", None)
    assert extension.stems == (f"torch-scatter-2.1.2-{build_string(in_channel, '', 0)}",)
    assert extension.needs == () and extension.channels == (tmp_path.resolve().as_uri(),)


def test_a_wheel_build_refuses_extensions(tmp_path: Path) -> None:
    """--format wheel builds pip wheels, not the conda packages an extension pins: exit 2 and what works, first."""
    result = cli("build", "--dry-run", *CPU_REQUEST, "--format", "wheel", "--out", str(tmp_path / "out"),
                 "--extension", "torch-scatter==2.1.2")
    assert result.returncode == 2, result.stderr
    assert "--extension builds conda packages, not --format wheel" in result.stderr and "--format conda" in result.stderr
    assert "Traceback" not in result.stderr and "build plan" not in result.stderr and not (tmp_path / "out").exists()


def test_doctor_with_a_cuda_extension_checks_this_machines_toolkit(tmp_path: Path) -> None:
    """The conda-forge flavour's own recipes take nvcc from packages; a CUDA extension compiles with this machine's
    toolkit: `doctor --extension` checks it, and fails where there is none."""
    import os
    import sys

    from tests.offline_site import offline_site

    request = ("doctor", "--pytorch", "2.13.0", "--cuda", "13.0", "--arch-list", "9.0", "--py", "3.12", "--json",
               "--out", str(tmp_path / "channel"), "--config", str(offline_site(tmp_path / "site", [])))

    def rows(done: subprocess.CompletedProcess[str]) -> dict[str, str]:
        return {r["name"]: r["status"] for r in json.loads(done.stdout)["checks"]}

    plain_run, extension_run = cli(*request), cli(*request, "--extension", "torch-scatter==2.1.2")
    assert plain_run.returncode == 0 and extension_run.returncode == 0, plain_run.stderr + extension_run.stderr
    plain, with_extension = rows(plain_run), rows(extension_run)
    assert set(plain.values()) == set(with_extension.values()) == {"ok"}  # the local channel answers
    # the arch check of pytorch's own libraries runs (read in-process); only an extension compiles with this nvcc
    assert "nvcc (CUDA 13.0)" not in plain and plain["arch check"] == "ok"
    assert with_extension["nvcc (CUDA 13.0)"] == "ok" and with_extension["arch check"] == "ok"
    # no toolkit on this machine: the extension's build would fail, so doctor does (exit 9), naming nvcc
    bare = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "CUDA_HOME": str(tmp_path / "no-cuda"),
            "CUDA_PATH": str(tmp_path / "no-cuda")}
    done = cli(*request, "--extension", "torch-scatter==2.1.2", env={**os.environ, **bare})
    assert done.returncode == 9 and rows(done)["nvcc (CUDA 13.0)"] == "fail", done.stdout[-2000:]


@pytest.mark.parametrize("flavour", ["official", "conda-forge"])
def test_an_extension_inherits_its_pytorchs_arch_list_from_the_plan(flavour: str) -> None:
    """`matrix --extension` without --arch-list: the extension is built for the arch list the flavour resolved for
    its pytorch recipe (it was '' before, so the sdist's own list was built and nothing arch-checked); every
    CUDA pytorch recipe of either flavour carries that list."""
    sdist = next((Path(__file__).parent / "fixtures" / "sdists").glob("causal_conv1d-*.tar.gz"))
    done = cli("matrix", "--pytorch", "2.13.0", "--cuda", "13.0", "--py", "3.12", "--flavour", flavour,
               "--extension", str(sdist), "--json")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    (extension,) = [row for row in rows if row.get("kind") == "extension"]
    the_plan = sequence.plan(flavour, Request("2.13.0", "13.0", "3.12"), "rattler-build")
    (pytorch,) = [build for _, build in the_plan.pytorch_builds()]
    assert pytorch.arch_list and extension["arch_list"] == pytorch.arch_list
    assert all(r.arch_list == pytorch.arch_list for r in the_plan.recipes if r.pytorch)
    # --arch-list overrides it for the pytorch and its extension alike
    done = cli("matrix", "--pytorch", "2.13.0", "--cuda", "13.0", "--py", "3.12", "--flavour", flavour,
               "--arch-list", "9.0", "--extension", str(sdist), "--json")
    assert [r["arch_list"] for r in json.loads(done.stdout) if r.get("kind") == "extension"] == ["9.0"]


def test_a_conda_forge_shaped_pytorch_in_the_channel_is_found_by_its_python_abi(tmp_path: Path) -> None:
    """The quick start's own channel (the conda-forge flavour's pytorch) pins Python as conda-forge does, by
    `python_abi 3.11.* *_cp311` beside a bare `python`: an extension is planned for it (it said "no python pin")."""
    build = "cpu_mkl_torchforge_py311_hc7cc015_102"
    make_package(tmp_path / "linux-64", "pytorch", "2.13.0", build,
                 depends=["libtorch ==2.13.0 cpu_mkl_torchforge_hc7cc015_102", "python", "python_abi 3.11.* *_cp311"])
    index(tmp_path)
    (extension,) = with_extensions(Plan("official", ()), Request(extensions=(str(SCATTER),)), "rattler-build",
                                   channel=tmp_path).recipes
    assert extension.python == "3.11" and extension.stems[0].endswith("_py311_0")
    assert json.loads(extension.settings)["pytorch"] == f"2.13.0 {build}"


def test_standin_channel_with_an_extension_stands_in_for_its_build_and_stated_requirements(tmp_path: Path) -> None:
    """torch-scatter 2.1.2 (no pyproject.toml: setuptools and wheel) and mamba-ssm 2.3.2.post1 (its PKG-INFO states
    its requirements): their recipes' packages are in the channel, read without running either setup.py."""
    mamba = SCATTER.with_name("mamba_ssm-2.3.2.post1.tar.gz")
    done = cli("standin-channel", "--pytorch", "2.13.0", "--cuda", "cpu", "--py", "3.11", "--out", str(tmp_path / "s"),
               "--extension", str(SCATTER), "--extension", str(mamba))
    assert done.returncode == 0, done.stderr[-2000:]
    names = {json.loads((tmp_path / "s" / "linux-64" / "repodata.json").read_text())["packages.conda"][f]["name"]
             for f in json.loads((tmp_path / "s" / "linux-64" / "repodata.json").read_text())["packages.conda"]}
    assert {"setuptools", "wheel", "pip", "einops", "transformers", "tilelang", "ninja"} <= names
    text = " ".join(done.stderr.split())
    assert f"--extension {SCATTER}: its run requirements are its setup.py's to say" in text
    assert f"--extension {mamba}:" not in text
