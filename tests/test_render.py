"""Rendered recipes: golden files, parsed by the real rattler-build and by ruamel, complete script_env,
all-or-nothing writes, and the same output from an installed wheel as from a checkout."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from rattler_build import Stage0Recipe
from ruamel.yaml import YAML

from tests.golden.regenerate import EXPECTED, case_plan, cases, render_case
from torchforge import data as tables
from torchforge.errors import RefusedError, UsageError
from torchforge.flavours.official.recipe import BUILD_TOOL_VARIABLES
from torchforge.flavours.official.render import RenderPlan, plan, recipe_folders, render_selection, write_folders
from torchforge.templates import RecipeFormat
from torchforge.flavours.official.resolved import Status
from torchforge.flavours.official.variant import Options, Request, Selection

REPO = Path(__file__).resolve().parent.parent
CASES = cases()


@pytest.mark.parametrize("fmt", list(RecipeFormat), ids=lambda f: f.value)
@pytest.mark.parametrize("case", sorted(CASES))
def test_golden(case: str, fmt: RecipeFormat) -> None:
    rendered = render_case(CASES[case], fmt)
    expected_root = EXPECTED / case / fmt.value
    assert sorted(rendered) == sorted(p.name for p in expected_root.iterdir()), "run `make goldens` and review"
    for folder, files in rendered.items():
        assert sorted(files) == sorted(p.name for p in (expected_root / folder).iterdir())
        for filename, content in files.items():
            assert content == (expected_root / folder / filename).read_text(), f"{folder}/{filename}: run `make goldens`"


def _official_plans() -> list[RenderPlan]:
    """Every official variant in the data (all releases x CUDA x Python), one Python per release to stay fast."""
    plans = []
    for key, release in tables.load().pytorch.releases.items():
        if not release.conda_official:
            continue
        cudas = ",".join([*(c for c, b in release.cuda.items() if b.conda), "cpu"])
        version = (tables.load().pytorch.patch_releases.get(key) or (f"{key}.0",))[-1]
        plans.append(plan(Selection.from_flags(version, cudas, release.python[1], None, Options())))
    return plans


def _official_selection_folders(fmt: RecipeFormat) -> dict[str, dict[str, str | bytes]]:
    folders: dict[str, dict[str, str | bytes]] = {}
    for render_plan in _official_plans():
        folders.update(recipe_folders(render_plan, fmt))
    return folders


def test_every_rendered_recipe_yaml_parses_with_rattler_build() -> None:
    """rattler-build itself reads each recipe and arrives at exactly the planned name-version-build."""
    checked = 0
    for render_plan in [*_official_plans(), *(case_plan(c) for c in CASES.values())]:
        planned = {m.id: m.filename_stem for m in render_plan.magma}
        planned.update({v.id: v.filename_stem for v in render_plan.variants})
        for name, files in recipe_folders(render_plan, RecipeFormat.RATTLER_BUILD).items():
            recipe = Stage0Recipe.from_yaml(str(files["recipe.yaml"]))
            rendered = recipe.render()[0].recipe.to_dict()
            package = rendered["package"]
            assert f"{package['name']}-{package['version']}-{rendered['build']['string']}" == planned[name], name
            checked += 1
    assert checked > 40


def test_meta_yaml_is_plain_yaml_with_the_official_fields() -> None:
    folders = render_case(CASES["pt251-cu124-py312"], RecipeFormat.CONDA_BUILD)
    meta = YAML(typ="safe").load(folders["pytorch-2.5.1-cu124-py312-linux_64"]["meta.yaml"])
    assert meta["package"] == {"name": "pytorch", "version": "2.5.1"}
    assert meta["build"]["string"] == "py3.12_cuda12.4_cudnn9.1.0_0"
    assert meta["build"]["detect_binary_files_with_prefix"] is False
    assert "magma-cuda124 ==2.6.1" in meta["requirements"]["host"]
    assert "pytorch-cuda >=12.4,<12.5" in meta["requirements"]["run"]
    assert "pytorch-mutex ==1.0 cuda" in meta["requirements"]["run"]
    assert meta["requirements"]["run_constrained"] == ["cpuonly <0"]
    magma = YAML(typ="safe").load(folders["magma-cuda124-2.6.1-linux_64"]["meta.yaml"])
    assert magma["package"] == {"name": "magma-cuda124", "version": "2.6.1"}
    assert magma["source"]["sha256"] == tables.load().magma.versions["2.6.1"].sha256
    assert magma["build"]["string"] == "1" and "requirements" not in magma


_VARIABLE = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)")


def test_build_scripts_read_only_exported_tool_or_script_env_variables() -> None:
    """conda-build scrubs the environment: a variable build.sh reads from outside must be in script_env."""
    folders = _official_selection_folders(RecipeFormat.CONDA_BUILD)
    for case in CASES.values():
        folders.update(render_case(case, RecipeFormat.CONDA_BUILD))
    checked = 0
    for name, files in folders.items():
        if "build.sh" not in files:
            continue
        meta = YAML(typ="safe").load(files["meta.yaml"])
        allowed = set(meta["build"].get("script_env", [])) | BUILD_TOOL_VARIABLES
        exported: set[str] = set()
        for line in str(files["build.sh"]).splitlines():
            code = line.split("#", 1)[0] if not line.lstrip().startswith("#!") else ""
            code = re.sub(r"'[^']*'", "", code)  # single-quoted text is not expanded ($ORIGIN)
            for variable in _VARIABLE.findall(code):
                # loop variables and the bundling function's locals and parameters are set in the script itself
                local = ("so", "nvcc_release", "header", "src", "var", "name", "new")
                assert variable in exported or variable in allowed or variable in local, (
                    f"{name}: build.sh reads ${variable}, which is neither exported before nor in script_env"
                )
            match = re.match(r"\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=", code)
            if match:
                exported.add(match.group(1))
        checked += 1
    assert checked > 20


def test_refused_selection_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "recipes"
    selection = Selection.from_flags("2.5.1", "12.4", "3.8,3.12", None, Options())
    with pytest.raises(RefusedError, match="1 of 2 variant"):
        render_selection(selection, out, RecipeFormat.CONDA_BUILD)
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []


def test_existing_folders_need_force_and_are_replaced_whole(tmp_path: Path) -> None:
    selection = Selection.from_flags("2.5.1", "cpu", "3.11", None, Options())
    _, written = render_selection(selection, tmp_path, RecipeFormat.CONDA_BUILD)
    stale = written[0] / "stale.txt"
    stale.write_text("from an earlier render")
    with pytest.raises(UsageError, match="already exist"):
        render_selection(selection, tmp_path, RecipeFormat.CONDA_BUILD)
    assert stale.exists()
    render_selection(selection, tmp_path, RecipeFormat.RATTLER_BUILD, force=True)
    assert not stale.exists() and (written[0] / "recipe.yaml").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [written[0].name]


def test_a_failure_while_writing_leaves_no_partial_folder(tmp_path: Path) -> None:
    # "sub" is written as a file, so "sub/b.txt" cannot be: the write fails after the good folder was staged
    folders = {"good": {"a.txt": "x"}, "bad": {"sub": "y", "sub/b.txt": "z"}}
    with pytest.raises(FileExistsError):
        write_folders(folders, tmp_path / "out")
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".torchforge")] == []


def test_patches_are_copied_and_listed(tmp_path: Path) -> None:
    patch = tmp_path / "fix.patch"
    patch.write_text("--- a/x\n+++ b/x\n")
    selection = Selection.from_flags("2.5.1", "cpu", "3.11", None, Options())
    _, written = render_selection(selection, tmp_path / "out", RecipeFormat.CONDA_BUILD, patches=[patch])
    meta = YAML(typ="safe").load((written[0] / "meta.yaml").read_text())
    assert meta["source"]["patches"] == ["fix.patch"]
    assert (written[0] / "fix.patch").read_text() == patch.read_text()


def test_source_override_to_a_local_checkout(tmp_path: Path) -> None:
    selection = Selection.from_flags("2.5.1", "cpu", "3.11", None, Options(source=str(tmp_path)))
    folders = recipe_folders(plan(selection), RecipeFormat.RATTLER_BUILD)
    recipe = YAML(typ="safe").load(folders["pytorch-2.5.1-cpu-py311-linux_64"]["recipe.yaml"])
    assert recipe["source"] == {"path": str(tmp_path.resolve())}


def test_source_edits_script_applies_the_seed_fix_and_is_idempotent(tmp_path: Path) -> None:
    folders = render_case(CASES["pt1130-cu118-py310-unofficial"], RecipeFormat.CONDA_BUILD)
    recipe = tmp_path / "recipe"
    recipe.mkdir()
    for filename, content in folders["pytorch-1.13.0-cu118-py310-linux_64"].items():
        (recipe / filename).write_text(str(content))
    src = tmp_path / "src"
    (src / "torch/utils").mkdir(parents=True)
    # Excerpts of PyTorch 1.13's files as quoted in seed 004_a620e0c82f5093d3.txt.
    (src / "torch/utils/cpp_extension.py").write_text(textwrap.dedent("""\
        CUDA_GCC_VERSIONS = {
            '11.7': ((6, 0, 0), (11, 5, 0)),
        }
        CUDA_CLANG_VERSIONS = {
            '11.7': ((6, 0, 0), (13, 0, 0)),
        }
        supported_arches = ['3.5', '3.7', '5.0', '5.2', '5.3', '6.0', '6.1', '6.2',
                            '7.0', '7.2', '7.5', '8.0', '8.6']
        """))
    (src / "setup.py").write_text("cmdclass = {\n    'install': install,\n}\n")
    command = [sys.executable, str(recipe / "source_edits.py"), str(recipe / "source_edits.json"), str(src)]
    for _ in range(2):  # the second run finds everything applied
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        assert result.returncode == 0, result.stdout + result.stderr
    namespace: dict[str, object] = {}
    exec((src / "torch/utils/cpp_extension.py").read_text(), namespace)
    assert namespace["CUDA_GCC_VERSIONS"]["11.8"] == ((6, 0, 0), (11, 5, 0))  # type: ignore[index]
    assert "8.9" in namespace["supported_arches"]  # type: ignore[operator]
    assert "setuptools.command.install.install" in (src / "setup.py").read_text()
    (src / "setup.py").write_text("cmdclass = {}\n")  # a source tree the fix does not fit: the build must stop
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    assert result.returncode == 1 and "FAILED: replace setup.py (missing-text)" in result.stdout


@pytest.mark.slow
def test_an_installed_wheel_renders_the_same_as_the_checkout(tmp_path: Path) -> None:
    wheel_dir, target = tmp_path / "wheel", tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheel_dir), str(REPO)],
                   check=True, capture_output=True)
    wheel = next(wheel_dir.glob("torchforge_conda-*.whl"))
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                   check=True, capture_output=True)
    assert (target / "torchforge" / "_templates" / "pytorch" / "meta.yaml.j2").is_file()
    out = tmp_path / "recipes"
    script = ("import sys; from torchforge.cli import main; "
              f"sys.exit(main(['render', '--pytorch', '1.13.0', '--cuda', '11.8', '--py', '3.10', '--out', {str(out)!r}]))")
    env = {**os.environ, "PYTHONPATH": str(target)}
    result = subprocess.run([sys.executable, "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    expected = EXPECTED / "pt1130-cu118-py310-unofficial" / "conda-build"
    for folder in expected.iterdir():
        for file in folder.iterdir():
            assert (out / folder.name / file.name).read_text() == file.read_text(), file


def test_status_counts_over_the_default_selection() -> None:
    statuses = {v.status for v in plan(Selection.from_flags(None, None, None, None, Options())).variants}
    assert statuses == {Status.OFFICIAL}


def test_win_recipe_has_bld_bat_windows_magma_and_bundled_dlls() -> None:
    folders = render_case(CASES["pt251-cu124-py312-win"], RecipeFormat.CONDA_BUILD)
    assert list(folders) == ["pytorch-2.5.1-cu124-py312-win_64"]  # no magma-cudaXYZ package on Windows
    files = folders["pytorch-2.5.1-cu124-py312-win_64"]
    assert "bld.bat" in files and "build.sh" not in files
    bat = str(files["bld.bat"])
    assert 'set "TORCH_CUDA_ARCH_LIST=5.0;6.0;6.1;7.0;7.5;8.0;8.6;9.0"' in bat
    # release/2.5:conda/pytorch-nightly/bld.bat:52-56 linked MAGMA 2.5.4 and never set USE_CUSPARSELT
    assert "https://s3.amazonaws.com/ossci-windows/magma_2.5.4_cuda124_release.7z" in bat
    assert "USE_MAGMA" not in bat and "USE_CUSPARSELT" not in bat
    # release/2.5:conda/pytorch-nightly/bld.bat:102-110: cuDNN, nvToolsExt, CUPTI and (if present) zlibwapi
    copies = [line for line in bat.splitlines() if "copy /y" in line]
    assert [re.search(r'copy /y "%\w+%\\([^"]+)"', c).group(1) for c in copies] == [  # type: ignore[union-attr]
        "cudnn*64_*.dll*", "nvToolsExt64_*.dll*", "cupti64_*.dll*", "zlibwapi.dll"]
    assert copies[-1].startswith('if exist "%ZLIB_BIN_DIR%')
    assert Request("2.5.1", "12.4", "3.12", "win-64").id == "pytorch-2.5.1-cu124-py312-win_64"


@pytest.mark.parametrize(("pytorch", "python", "numpy"), [
    ("2.5.1", "3.12", "2.0.1"),  # numpy 2.0.1.*
    ("2.4.1", "3.10", "2.0.0rc1"),  # numpy 2.0.0rc1.*
    ("1.11.0", "3.10", "1.21.2"),  # numpy >=1.21.2
    ("1.8.0", "3.8", "1.19"),  # numpy 1.19.*
    ("2.7.1", "3.13", None),  # no numpy rule covers Python 3.13: unpinned, so no version to give conda-build
])
def test_conda_build_config_gives_the_numpy_of_the_host_spec(pytorch: str, python: str, numpy: str | None) -> None:
    render_plan = plan(Selection.from_flags(pytorch, "cpu", python, None, Options()))
    (variant,) = render_plan.variants
    folders = recipe_folders(render_plan, RecipeFormat.CONDA_BUILD)
    config = YAML(typ="safe").load(folders[variant.id]["conda_build_config.yaml"])
    host = YAML(typ="safe").load(folders[variant.id]["meta.yaml"])["requirements"]["host"]
    assert config["python"] == [python] and config["target_platform"] == ["linux-64"]
    assert config.get("numpy") == ([numpy] if numpy else None)
    assert any(spec.split()[0] == "numpy" and (numpy is None) == (spec == "numpy") for spec in host)
