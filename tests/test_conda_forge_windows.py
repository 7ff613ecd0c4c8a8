"""The conda-forge flavour on win-64 (rendered, not built, here): for every release the rendered recipe, for the
feedstock's own CUDA and arch list, matches conda-forge/pytorch-cpu-feedstock's win-64 jobs at that release value
by value (torchforge/data/conda_forge.toml: .ci_support/win_64_*.yaml, the `[win]` selectors of meta.yaml, the
`set` lines of bld.bat, each with its commit:file:line); a CUDA and arch list conda-forge never built changes
exactly what should change; the real conda-build renders one recipe for win-64; a release without a win-64 job is
refused with the releases that have one."""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from tests.test_conda_forge_flavour import (
    KEYS, SOURCE, expected_specs, output_requirements, recipe_values, rendered_meta,
)
from torchforge.cli import main
from torchforge.errors import UsageError
from torchforge.flavours import conda_forge
from torchforge.sourcestate import Source

TABLE = conda_forge.load()
WIN = conda_forge.WINDOWS


def set_lines(bld_bat: str) -> dict[str, str]:
    """The `set "NAME=VALUE"` lines of bld.bat's environment block (before torchforge's own MAX_JOBS line)."""
    block = bld_bat[:bld_bat.index("if not defined MAX_JOBS")]
    return dict(re.findall(r'^set "([A-Za-z_]\w*)=(.*)"$', block, re.MULTILINE))


def win_cases() -> list[tuple[str, str]]:
    return [(version, accel) for version, release in TABLE.releases.items() if WIN in release.platforms
            for accel in [*release.platforms[WIN].cuda, "cpu"]]


def test_every_release_has_conda_forges_win64_jobs_with_visual_studio() -> None:
    """Read from the feedstock: every release 2.6.0-2.13.0 has win-64 jobs (blas mkl); vs2019 up to 2.7.0, vs2022
    from 2.7.1 (the CUDA 12.8 job); every fact cites a .ci_support file, meta.yaml or bld.bat line."""
    assert all(WIN in release.platforms for release in TABLE.releases.values())
    compilers = {v: r.platforms[WIN].ci_support["cpu"].c_compiler.value for v, r in TABLE.releases.items()}
    assert compilers["2.6.0"] == compilers["2.7.0"] == "vs2019" and compilers["2.13.0"] == "vs2022"
    assert TABLE.releases["2.6.0"].platforms[WIN].cuda == ("12.6",)
    assert TABLE.releases["2.13.0"].platforms[WIN].cuda == ("12.8", "13.0")
    for release in TABLE.releases.values():
        jobs = release.platforms[WIN]
        assert all(a.source.startswith("recipe/bld.bat:") for a in jobs.arch_list.values())
        assert all(e.source.startswith("recipe/bld.bat:") for e in jobs.recipe.env)
        assert all(ci.file.startswith(".ci_support/win_64_") and ci.c_compiler_version is None
                   for ci in jobs.ci_support.values())
    # bld.bat installs activation scripts from 2.10 on, as build.sh does on linux
    assert [v for v, r in TABLE.releases.items() if r.platforms[WIN].activation] == \
        ["2.10.0", "2.11.0", "2.12.0", "2.12.1", "2.13.0"]


@pytest.mark.parametrize(("version", "accel"), win_cases())
def test_the_win64_recipe_for_the_feedstocks_own_cuda_matches_the_feedstock_value_by_value(
        version: str, accel: str) -> None:
    release = TABLE.releases[version]
    jobs = release.platforms[WIN]
    cuda = None if accel == "cpu" else accel
    recipe = conda_forge.plan(version, WIN, accel)
    files = conda_forge.recipe_files(recipe, SOURCE)
    meta = rendered_meta(files)
    marker = TABLE.flavour.marker

    # build number: the feedstock's, +200 for CUDA, +100 for MKL (conda-forge builds MKL only on win-64)
    assert TABLE.flavour.blas[WIN] == "mkl"
    build = release.build_number + (200 if cuda else 0) + 100
    assert meta["build"]["number"] == build == recipe.build_number
    names = [meta["package"]["name"], *(o["name"] for o in meta["outputs"][1:])]
    assert names == [n for n in release.outputs(recipe.accel) if n not in TABLE.flavour.omitted_outputs]
    for output, found in output_requirements(meta).items():
        for key in KEYS:
            actual = [str(s).replace(f"_{marker}", "") for s in found[key]]
            assert actual == expected_specs(version, WIN, output, key, cuda, build), (output, key)
    requirements = output_requirements(meta)
    assert ("__cuda" in requirements["pytorch"]["run"]) == (cuda is not None)
    # the feedstock's selectors were read for Windows: no NCCL (none on Windows), no linux tools, sccache to build
    assert not any(s.split()[0] in ("nccl", "make", "rsync", "libcufile-dev") for r in requirements.values()
                   for k in KEYS for s in map(str, r[k]))
    assert "sccache" in requirements["libtorch"]["build"]
    word = f"cuda{cuda.replace('.', '')}" if cuda else "cpu"
    digest = hashlib.sha256(recipe.settings.encode()).hexdigest()[:7]  # torchforge's, where conda-build's hash goes
    assert meta["build"]["string"] == f"{word}_mkl_{marker}_h{digest}_{build}" == recipe.build_string("libtorch")
    assert meta["outputs"][1]["build"]["string"] == f"{word}_mkl_{marker}_py312_h{digest}_{build}" \
        == recipe.build_string("pytorch", "3.12")
    assert meta["outputs"][1]["script"] == "bld.bat"
    # the feedstock's own (2.10+: every job, CUDA or not; before: none), not a rule of torchforge's
    whitelist = expected_specs(version, WIN, "libtorch", "missing_dso_whitelist", cuda, build)
    assert meta["build"].get("missing_dso_whitelist") == (whitelist or None)
    assert not whitelist or whitelist == ["*/nvcuda.dll"]

    # bld.bat sets every variable the feedstock's bld.bat sets for this job, with its value, in its order
    wanted = {row.name: row.value.replace("{cuda}", cuda or "") for row in jobs.recipe.env
              if row.accel in (None, recipe.accel) and row.blas in (None, "mkl") and row.cuda in (None, cuda)}
    if cuda:
        wanted["TORCH_CUDA_ARCH_LIST"] = jobs.arch_list[cuda].value
    assert list(set_lines(files["bld.bat"]).items()) == list(wanted.items())
    assert "build.sh" not in files and "activate.sh" not in files

    # the activation variable carries the arch list (CUDA only), installed by libtorch's step and checked by its test
    if cuda:
        variable = jobs.activation.variable if jobs.activation else "CF_TORCH_CUDA_ARCH_LIST"
        assert f'set "{variable}={jobs.arch_list[cuda].value}"' in files["activate.bat"]
        assert f'set "{variable}="' in files["deactivate.bat"]
        assert f'if not "%{variable}%" == "{jobs.arch_list[cuda].value}" exit 1' in meta["test"]["commands"]
    else:
        assert "activate.bat" not in files and "deactivate.bat" not in files
    assert "if not exist %LIBRARY_BIN%\\torch_cpu.dll exit 1" in meta["test"]["commands"]

    # the job's variant: Visual Studio's compiler packages, its Pythons and pins, rendered for win-64
    config = YAML(typ="safe").load(files["conda_build_config.yaml"])
    ci = jobs.ci_support[accel]
    assert config["target_platform"] == ["win-64"]
    assert config["python"] == list(ci.python.variant)  # the job's values whole: 3.12.* *_cpython
    assert (config["c_compiler"], config["cxx_compiler"], config["c_stdlib"]) == \
        ([ci.c_compiler.value], [ci.cxx_compiler.value], [ci.c_stdlib.value])
    assert "c_compiler_version" not in config and "c_stdlib_version" not in config
    assert {p.name: [p.value] for p in ci.pins}.items() <= config.items()
    assert config["cuda_compiler_version"] == [cuda or "None"]


def _values(accel: str, arch: str | None) -> dict[str, object]:
    files = conda_forge.recipe_files(conda_forge.plan("2.9.1", WIN, accel, arch), SOURCE)
    bld_bat = files["bld.bat"]
    return {**recipe_values(files, set_lines(bld_bat)), "test.libtorch": tuple(rendered_meta(files)["test"]["commands"]),
            "activate": files["activate.bat"].split("\n", 2)[2],
            "bld.bat.steps": bld_bat[bld_bat.index("if not defined MAX_JOBS"):]}


def test_a_cuda_and_arch_list_conda_forge_never_built_changes_exactly_what_should_change_on_win64() -> None:
    feedstock = _values("12.8", None)
    custom = _values("12.4", "7.0;8.6")
    changed = {k for k in feedstock.keys() | custom.keys() if feedstock.get(k) != custom.get(k)}
    assert changed == {
        "libtorch.host", "pytorch.host",  # cuda-version 12.4
        "libtorch.run_constrained",  # the pairing pin names the cuda124 build
        "env.TORCH_CUDA_ARCH_LIST", "env.CUDA_VERSION", "activate", "test.libtorch",
        "config.cuda_compiler_version", "config.torch_cuda_arch_list",
        "string.libtorch", "string.pytorch", "string.pytorch-gpu", "extra.cuda",
    }  # Visual Studio stays the job's (no GCC limit to apply), and so do bld.bat's steps
    assert "cuda-version 12.4" in custom["libtorch.host"] and "cuda-version 12.8" not in custom["libtorch.host"]
    assert custom["env.TORCH_CUDA_ARCH_LIST"] == "7.0;8.6" and custom["env.CUDA_VERSION"] == "12.4"
    assert custom["config.c_compiler"] == feedstock["config.c_compiler"] == ("vs2022",)
    assert re.fullmatch(r"cuda124_mkl_torchforge_py312_h[0-9a-f]{7}_305", str(custom["string.pytorch"]))
    assert 'if not "%CF_TORCH_CUDA_ARCH_LIST%" == "7.0;8.6" exit 1' in custom["test.libtorch"]


@pytest.mark.parametrize(("cuda", "studio", "warning"), [
    ("12.4", "vs2022", None),  # nvcc 12.4 takes every VS 2022 (_MSC_VER up to 1949)
    ("11.8", "vs2022", "nvcc 11.8 accepts MSVC _MSC_VER up to 1939: build with a vs2022 toolset no newer than that"),
    ("11.5", "vs2019", "nvcc 11.5 accepts MSVC _MSC_VER 1910-1929: the compilers are vs2019, not the feedstock's vs2022"),
])
def test_visual_studio_follows_what_nvcc_of_the_requested_cuda_accepts(
        cuda: str, studio: str, warning: str | None) -> None:
    """As GCC on linux: the job's Visual Studio (vs2022 for 2.9.1), unless nvcc refuses its MSVC (cuda.toml msvc
    against flavour.visual_studio)."""
    recipe = conda_forge.plan("2.9.1", WIN, cuda, "7.0;8.6")
    config = YAML(typ="safe").load(conda_forge.recipe_files(recipe, SOURCE)["conda_build_config.yaml"])
    assert config["c_compiler"] == config["cxx_compiler"] == [studio]
    msvc = [w for w in recipe.warnings if "MSVC" in w]
    assert len(msvc) == (1 if warning else 0) and all(w.startswith(warning or "") for w in msvc)
    assert f"Visual Studio's {studio} toolchain" in recipe.warnings[-1]


def test_render_writes_the_windows_files_and_build_says_to_build_them_on_windows(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["render", "--flavour", "conda-forge", "--platform", "win-64", "--pytorch", "2.13.0", "--cuda",
                 "13.0", "--arch-list", "8.6;12.0", "--out", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err.replace("\n", " ")
    assert "win-64 is rendered, not built, by torchforge" in err and "vs2022" in err
    folder = tmp_path / "out" / "libtorch-2.13.0-cuda130-sm86_120-win_64"
    assert sorted(p.name for p in folder.iterdir()) == ["activate.bat", "bld.bat", "conda_build_config.yaml",
                                                         "deactivate.bat", "meta.yaml", "retarget_cmake_cache.py"]
    assert set_lines((folder / "bld.bat").read_text())["TORCH_CUDA_ARCH_LIST"] == "8.6;12.0"
    # build: refused at once (exit 2, nothing written), with what would work
    assert main(["build", "--flavour", "conda-forge", "--platform", "win-64", "--pytorch", "2.13.0",
                 "--out", str(tmp_path / "ch")]) == 2
    err = capsys.readouterr().err.replace("\n", " ")
    assert "does not build win-64 recipes" in err and "on a Windows machine" in err
    assert not (tmp_path / "ch").exists()


def test_doctor_says_the_win64_recipes_are_built_on_windows(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no conda here: the recipes are for Windows anyway
    # this machine is linux-64: the platform check fails, and the flavour's row says where they are built
    assert main(["doctor", "--flavour", "conda-forge", "--platform", "win-64", "--pytorch", "2.6.0", "--json"]) == 9
    checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    assert checks["platform"]["status"] == "fail" and "asked for win-64" in checks["platform"]["detail"]
    detail = checks["win-64"]["detail"]
    assert detail.count("win-64 is rendered, not built, by torchforge") == 2  # CUDA 12.6 and cpu
    assert "libtorch-2.6.0-cpu-win_64: " in detail and "Visual Studio's vs2019 toolchain" in detail


def test_a_release_without_a_win64_job_is_refused_with_the_releases_that_have_one() -> None:
    """The feedstock built win-64 for every release so far; where a release has none, the data says so
    (not_built) and render refuses, naming the releases that have one."""
    release = TABLE.releases["2.6.0"]
    without = release.model_copy(update={"platforms": {p: j for p, j in release.platforms.items() if p != WIN},
                                         "not_built": {WIN: "no .ci_support/win_64_*.yaml at this commit"}})
    table = TABLE.model_copy(update={"releases": {**TABLE.releases, "2.6.0": without}})
    assert conda_forge.check_invariants(table) == []
    with pytest.raises(UsageError) as refused:
        conda_forge.platform_jobs(table, "2.6.0", WIN)
    assert "no win-64 build of PyTorch 2.6.0 (no .ci_support/win_64_*.yaml at this commit" in refused.value.message
    assert refused.value.hint == "--platform win-64 renders PyTorch " + ", ".join(RELEASES[1:])
    assert conda_forge.platform_jobs(table, "2.6.0", "linux-64") is release.platforms["linux-64"]
    # a release that neither describes win-64 nor says why is inconsistent data
    silent = TABLE.model_copy(update={"releases": {**TABLE.releases, "2.6.0": without.model_copy(update={"not_built": {}})}})
    assert any("must name each of linux-64, linux-aarch64, win-64 once" in p for p in conda_forge.check_invariants(silent))


RELEASES = list(TABLE.releases)


def test_each_python_reuses_libtorchs_cmake_cache_with_only_pythons_version_changed(tmp_path: Path) -> None:
    """retarget_cmake_cache.py, run by this Python on a cache like libtorch's on Windows (built with 3.12)."""
    files = conda_forge.recipe_files(conda_forge.plan("2.13.0", WIN, "cpu"), SOURCE)
    (tmp_path / "retarget_cmake_cache.py").write_text(files["retarget_cmake_cache.py"])
    (tmp_path / "old.txt").write_text(
        "Python_EXECUTABLE:FILEPATH=C:/b/_h_env/python.exe\n"
        "Python_LIBRARY:FILEPATH=C:/b/_h_env/libs/python312.lib\n"
        "_Python_INTERPRETER_PROPERTIES:INTERNAL=Python;3;12;8;64;;cp312-win_amd64;C:/b/Lib\n"
        "PYTHON_VERSION:STRING=v3.12.8()\n"
        "CUDNN_VERSION:STRING=9.3.12\nMKL_VERSION:STRING=2025.3.12\n")
    subprocess.run([sys.executable, "retarget_cmake_cache.py", "old.txt", "new.txt"], cwd=tmp_path, check=True)
    x, y, z = sys.version_info[:3]
    assert (tmp_path / "new.txt").read_text() == (
        "Python_EXECUTABLE:FILEPATH=C:/b/_h_env/python.exe\n"
        f"Python_LIBRARY:FILEPATH=C:/b/_h_env/libs/python{x}{y}.lib\n"
        f"_Python_INTERPRETER_PROPERTIES:INTERNAL=Python;{x};{y};{z};64;;cp{x}{y}-win_amd64;C:/b/Lib\n"
        f"PYTHON_VERSION:STRING=v{x}.{y}.{z}()\n"
        "CUDNN_VERSION:STRING=9.3.12\nMKL_VERSION:STRING=2025.3.12\n")


def test_feedstock_patches_on_windows_bring_msys2_patch_and_are_applied_once() -> None:
    recipe = conda_forge.plan("2.13.0", WIN, "13.0")
    files = conda_forge.recipe_files(recipe, SOURCE, feedstock_patches=True)
    meta = rendered_meta(files)
    paths = [p for _, _, p in recipe.feedstock_patches]
    assert [s["sha256"] for s in meta["source"][1:]] == [s for _, s, _ in recipe.feedstock_patches]
    assert any("win-CUDA" in p for p in paths)  # the CUDA job's Windows patch (a [cuda] row)
    assert not any("win-CUDA" in p for _, _, p in conda_forge.plan("2.13.0", WIN, "cpu").feedstock_patches)
    assert "m2-patch" in meta["requirements"]["build"]
    assert "m2-patch" not in rendered_meta(conda_forge.recipe_files(recipe, SOURCE))["requirements"]["build"]
    users = conda_forge.recipe_files(recipe, Source("git", SOURCE.location, "v2.13.0", patches=("fix.patch",)))
    assert "m2-patch" in rendered_meta(users)["requirements"]["build"]  # conda-build applies it with patch.exe
    applied = re.findall(r"^    patch -p1 .* -i conda-forge-patches\\(.*)$", files["bld.bat"], re.MULTILINE)
    assert applied == [p.replace("/", "\\") for p in paths]
    assert "if not exist conda-forge-patches\\.applied (" in files["bld.bat"]


# ---- conda render (the real conda-build), for win-64 on this linux machine ---------------------------------


def windows_stand_in_specs(files: dict[str, str], own: set[str]) -> set[str]:
    """What a stand-in channel must hold for conda-build to solve build and host for win-64: every spec, with
    conda_build_config's pins applied to bare names, and the compilers as conda-build names them for win-64
    (vs2022_win-64, vs_win-64, cuda-nvcc_win-64 X.Y)."""
    config = YAML(typ="safe").load(files["conda_build_config.yaml"])
    compilers = {"c": config["c_compiler"][0], "cxx": config["cxx_compiler"][0], "cuda": "cuda-nvcc"}
    specs = {"pip", *(f"python {p}" for p in config["python"])}
    for requirements in output_requirements(rendered_meta(files)).values():
        for spec in (str(s) for key in ("build", "host", "run") for s in requirements[key]):
            fields = spec.split()
            name = fields[0]
            if name in own or name.startswith(("__", "pin_")) or name == "python":
                continue
            if name == "compiler":
                version = f" {config['cuda_compiler_version'][0]}" if fields[1] == "cuda" else ""
                specs.add(f"{compilers[fields[1]]}_win-64{version}")
            elif name == "stdlib":
                specs.add(f"{config['c_stdlib'][0]}_win-64")
            elif fields[1:] in ([], ["*"]) and name.replace("-", "_") in config:
                version = str(config[name.replace("-", "_")][0])
                specs.add(f"{name} {version}")
            elif len(fields) == 3 and fields[1] == "*":
                specs.add(f"{name} 1.0 0{fields[2].strip('*')}")
            else:
                specs.add(spec)
    return specs


@pytest.mark.slow
@pytest.mark.parametrize(("version", "accel", "arch"), [("2.13.0", "13.0", "8.6;12.0"), ("2.6.0", "cpu", None)],
                         ids=["2.13.0-cu130-vs2022", "2.6.0-cpu-vs2019"])
def test_conda_render_accepts_a_win64_recipe_and_names_the_planned_packages(
        version: str, accel: str, arch: str | None, tmp_path: Path) -> None:
    from tests.condabuild import HOW_TO_GET_ONE, find_conda_tool, run_conda
    from tests.stubchannel import make_stub_channel

    tool = find_conda_tool()
    if tool is None:
        pytest.skip(HOW_TO_GET_ONE)
    recipe = conda_forge.plan(version, WIN, accel, arch, ("3.12",))
    files = conda_forge.recipe_files(recipe, SOURCE)
    folder = tmp_path / "recipes" / recipe.id
    folder.mkdir(parents=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    specs = windows_stand_in_specs(files, {o.name for o in recipe.outputs})
    # build is solved for this machine's subdir (conda-build's build_platform), host for win-64
    make_stub_channel(tmp_path / "stubs", sorted(specs), ("linux-64", "win-64"), runnable=False)
    result = run_conda(tool, tmp_path / "conda", "render", str(folder), "--override-channels",
                       "-c", f"file://{tmp_path / 'stubs'}", "--output")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    paths = [Path(line) for line in result.stdout.split() if line.endswith(".conda")]
    assert {p.parent.name for p in paths} == {"win-64"}
    stem = re.escape(f"{version}-{recipe.tag}_mkl_torchforge")
    metapackage = "pytorch-gpu" if recipe.cuda else "pytorch-cpu"
    patterns = [rf"libtorch-{stem}_h[0-9a-f]{{7}}_{recipe.build_number}",
                rf"pytorch-{stem}_py312_h[0-9a-f]{{7}}_{recipe.build_number}",
                rf"{metapackage}-{stem}_h[0-9a-f]{{7}}_{recipe.build_number}"]
    names = [p.name.removesuffix(".conda") for p in paths]
    assert len(names) == 3 and all(re.fullmatch(p, n) for p, n in zip(patterns, names)), names
