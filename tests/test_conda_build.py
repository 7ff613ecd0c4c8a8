"""The real conda-build (tests/condabuild.py: the machine's conda, or conda 26.7.1 + conda-build 26.7.1 from
../shared/vendor): `conda render` accepts every recipe torchforge writes and computes the planned build string;
`torchforge build --engine conda-build` builds the magma_like and torch_like fixtures (cpu, and CUDA against the
magma it has just built), the pipeline checks, audits and publishes them, and a real `conda create --offline`
installs them into environments where the fixture imports and runs. `--engine auto` and `doctor` read one probe."""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.condabuild import HOW_TO_GET_ONE, CondaTool, find_conda_tool, run_conda
from tests.golden.regenerate import EXPECTED, cases
from tests.stubchannel import make_stub_channel, recipe_requirements
from tests.test_build import cuobjdump, nvcc_release
from tests.test_torch_like import offline_site
from tests.test_upload_helpers import cli
from torchforge.cli import main
from tests.official_report import selection_from_flags
from torchforge.diagnose import explain_log
from torchforge.flavours.official.render import RenderPlan, plan, recipe_folders, write_folders
from torchforge.templates import RecipeFormat
from torchforge.rpath import Layout, audit
from torchforge.flavours.official.variant import Options, Selection

FIXTURES = Path(__file__).parent / "fixtures"
NVCC_RELEASE = "13.0"

# A wide matrix rendered fresh (the goldens add 15 more recipes): releases 1.9 to 2.7, cpu and CUDA 11.1 to
# 12.8, Python 3.8 to 3.13, linux-64, win-64 and linux-aarch64 (server and Jetson), official and buildable.
FRESH = (
    ("1.9.0", "11.1,cpu", "3.9", None, None),
    ("1.12.1", "11.3,cpu", "3.10", None, None),
    ("2.0.1", "11.8", "3.9", None, None),
    ("2.1.2", "12.1,cpu", "3.11", "win-64", None),
    ("2.4.1", "12.4", "3.12", "linux-aarch64", None),
    ("2.7.1", "12.8", "3.13", None, None),
    ("2.0.1", "11.8", "3.8", "linux-aarch64", "xavier"),
)


@dataclass(frozen=True)
class Planned:
    folder: str  # the recipe folder (variant or magma id)
    stem: str  # name-version-build torchforge planned
    subdir: str
    golden: str | None  # the golden case whose files on disk are rendered, None for a fresh recipe


def _planned(render_plan: RenderPlan, golden: str | None) -> list[Planned]:
    found = [Planned(m.id, m.filename_stem, "linux-64", golden) for m in render_plan.magma]
    return found + [Planned(v.id, v.filename_stem, v.request.platform, golden) for v in render_plan.variants]


def _fresh_plans() -> list[RenderPlan]:
    return [plan(Selection.from_flags(pt, cuda, py, platform, Options(jetson=jetson)))
            for pt, cuda, py, platform, jetson in FRESH]


def _golden_plans() -> dict[str, RenderPlan]:
    return {name: plan(Selection.from_flags(case["pytorch"], case["cuda"], case["python"], case.get("platform"),
                                            Options(jetson=case.get("jetson"), arch_list=case.get("arch_list"))))
            for name, case in cases().items()}


RECIPES = [p for name, rp in _golden_plans().items() for p in _planned(rp, name)] + \
          [p for rp in _fresh_plans() for p in _planned(rp, None)]
SUBDIRS = tuple(sorted({r.subdir for r in RECIPES}))


# ---- the tool ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def conda_tool() -> CondaTool:
    tool = find_conda_tool()
    if tool is None:
        pytest.skip(HOW_TO_GET_ONE)
    return tool


@pytest.fixture
def conda_env(conda_tool: CondaTool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """This test's process environment set for conda (torchforge's runner passes it to `conda build`)."""
    env = conda_tool.env(tmp_path / "conda")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


# ---- torchforge build --engine conda-build ------------------------------------------------------------------
# Two independent builds (no shared state, so xdist may run them side by side): CUDA (magma_like, then torch_like
# against that magma) and cpu (torch_like, then the rerun). Each one is a chain of checks on the same build.

TORCH_LIKE, MAGMA_LIKE = str(FIXTURES / "torch_like"), str(FIXTURES / "magma_like")
# PyTorch 2.13 accepts MAGMA 2.10, which magma_like stands for.
PYTORCH = "2.13.0"
COMMON = ["--engine", "conda-build", "--pytorch", PYTORCH, "--flavour", "official", "--py", "3.11", "--source", TORCH_LIKE, "--skip-preflight"]
CUDA_ARGS = [*COMMON, "--cuda", NVCC_RELEASE, "--arch-list", "8.0;9.0", "--magma-source", MAGMA_LIKE]
CPU_ARGS = [*COMMON, "--cuda", "cpu"]


@dataclass(frozen=True)
class Forge:
    out: Path  # the output channel
    stubs: Path  # stand-ins for every requirement except what is built here (magma, companions)
    tool: CondaTool
    site: Path  # torchforge.toml: the stand-ins replace every data channel (no network here)
    planned: dict[str, Planned]  # every package of the plan (companions, magma, pytorch) by id


def _plan(args: list[str]) -> RenderPlan:
    """What `torchforge build ARGS` plans, through the command's own flag parsing."""
    def flag(name: str) -> str | None:
        return args[args.index(name) + 1] if name in args else None

    return plan(selection_from_flags(flag("--pytorch"), flag("--cuda"), flag("--py"), None, flag("--arch-list"),
                                     source=flag("--source"), magma_source=flag("--magma-source")))


def _forge(tool: CondaTool, root: Path, args: list[str]) -> Forge:
    """`torchforge build ARGS` in a new process, as a user runs it, against stand-ins for its requirements."""
    render_plan = _plan(args)
    # magma and the companions (pytorch-mutex, cpuonly, pytorch-cuda) are built here, so they get no stand-in.
    built_here = {"magma-"} | {c.name + " " for c in render_plan.companions}
    specs = {"pip"}  # real conda makes every python depend on pip
    for files in recipe_folders(render_plan, RecipeFormat.CONDA_BUILD).values():
        specs.update(s for s in recipe_requirements(str(files["meta.yaml"])) if not (s + " ").startswith(tuple(built_here)))
    make_stub_channel(root / "stubs", sorted(specs))
    bundled = {name: value for files in recipe_folders(render_plan, RecipeFormat.CONDA_BUILD).values()
               for name, value in _bundle_stand_ins(str(files.get("build.sh", "")), root / "bundled").items()}
    planned = [Planned(c.id, c.filename_stem, c.subdir, None) for c in render_plan.companions]
    forge = Forge(root / "out", root / "stubs", tool, offline_site(root / "stubs"),
                  {p.folder: p for p in [*planned, *_planned(render_plan, None)]})
    result = cli("build", *args, "--config", str(forge.site), "--out", str(forge.out),
                 env={**tool.env(root / "conda"), **bundled}, timeout=1800)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "using conda-build (--engine)" in result.stderr
    assert not list(forge.out.glob(".staging-*"))
    return forge


# The runner's log line: `$ [NAME=VALUE ...] conda build RECIPE ...` (the recipe's script_env values first).
_CONDA_BUILD_LINE = re.compile(r"^\$ (?:\S+=\S* )*conda build ", re.MULTILINE)
_BUNDLE_LOOP = re.compile(r'^for src in "\$\{(\w+):-[^}]*\}"/(\S+); do$', re.MULTILINE)
_CUDNN_CHECK = re.compile(r'torch/lib/(\S+)" (\d+) <<')


def _bundle_stand_ins(build_sh: str, folder: Path) -> dict[str, str]:
    """gcc-built shared libraries under the names a CUDA recipe bundles into torch/lib (cuDNN, cuSPARSELt ...;
    this machine has none), cuDNN answering cudnnGetVersion with the version the build string names, and the
    recipe's folder variables pointing at them."""
    checked = dict(_CUDNN_CHECK.findall(build_sh))
    env: dict[str, str] = {}
    for variable, pattern in _BUNDLE_LOOP.findall(build_sh):
        folder.mkdir(parents=True, exist_ok=True)
        name = pattern.replace("*", "")
        code = checked.get(name)
        source = folder.parent / f"{name}.c"  # not beside the libraries: the recipe globs that folder
        # cuDNN's entry points with its C signatures (the torch_like fixture calls them), NOT cuDNN.
        source.write_text("#include <stddef.h>\n" + (
            f"size_t cudnnGetVersion(void) {{ return {code}; }}\n"
            "int cudnnCreate(void **handle) { static int token; *handle = &token; return 0; }\n"
            "int cudnnDestroy(void *handle) { return handle == NULL; }\n" if code else
            "void torchforge_stand_in(void) {}\n"))
        subprocess.run(["gcc", "-shared", "-fPIC", f"-Wl,-soname,{name}", str(source), "-o", str(folder / name)],
                       check=True)
        env[variable] = str(folder)
    return env


def _published(forge: Forge, build_line: re.Pattern[str] = _CONDA_BUILD_LINE) -> None:
    """Exactly the planned packages are in the channel, RPATH-clean, built by conda-build with its test phase
    (`build_line`: the runner's log line of the build command)."""
    for subdir in {p.subdir for p in forge.planned.values()}:
        repodata = json.loads((forge.out / subdir / "repodata.json").read_text())
        assert sorted(repodata["packages.conda"]) == \
            sorted(f"{p.stem}.conda" for p in forge.planned.values() if p.subdir == subdir)
    for package in forge.planned.values():
        report = audit(forge.out / package.subdir / f"{package.stem}.conda", Layout.CONDA)
        assert report.ok, report.findings
    for variant in (v for v in forge.planned if v.startswith(f"pytorch-{PYTORCH}-")):
        log = _log(forge, variant)
        assert build_line.search(log) and "TEST END" in log  # conda-build's own test phase ran `import torch`
        # conda_build_config.yaml gives numpy, so conda-build does not fall back to its default.
        assert "variant is still conda-build's default" not in log


def _log(forge: Forge, variant: str) -> str:
    return (forge.out / "logs" / f"{variant}.log").read_text()


def _create(forge: Forge, scratch: Path, spec: str) -> Path:
    """A real `conda create --offline` from the output channel and the stand-ins; returns the prefix."""
    prefix = scratch / "env"
    result = run_conda(forge.tool, scratch / "conda", "create", "--offline", "--yes", "--quiet", "-p", str(prefix),
                       "--override-channels", "-c", f"file://{forge.out}", "-c", f"file://{forge.stubs}", spec)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return prefix


def _imports_and_runs(forge: Forge, scratch: Path, stem: str) -> Path:
    name, version, build = stem.split("-")
    prefix = _create(forge, scratch, f"{name} =={version} {build}")
    meta = json.loads((prefix / "conda-meta" / f"{stem}.json").read_text())
    assert meta["channel"].startswith(f"file://{forge.out}/")
    # Nothing on LD_LIBRARY_PATH: the extension finds torch/lib through the RPATH the recipe set.
    result = subprocess.run([str(prefix / "bin" / "python"), "-c",
                             "import torch; print(torch.ones_sum(3), torch.__version__, torch.__file__)"],
                            capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    value, got_version, location = result.stdout.split()
    assert (float(value), got_version) == (3.0, version)
    assert Path(location).is_relative_to(prefix)
    return prefix


def _bundled_cudnn_loads(prefix: Path) -> None:
    """The bundled cuDNN stand-in is the one the build string names (cudnn9.20.0 -> 92000), loaded from torch/lib."""
    result = subprocess.run([str(prefix / "bin" / "python"), "-c",
                             "import torch; print(torch.cudnn_version(), torch.cudnn_create())"],
                            capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["92000", "0"]



needs_nvcc = pytest.mark.skipif(nvcc_release() != NVCC_RELEASE,
                                reason=f"needs nvcc {NVCC_RELEASE} on PATH (magma_like is compiled for sm_80 and sm_90)")


@needs_nvcc
@pytest.mark.slow
def test_cuda_magma_like_then_torch_like_against_it_built_published_installed_and_run(
        conda_tool: CondaTool, tmp_path: Path) -> None:
    forge = _forge(conda_tool, tmp_path / "forge", CUDA_ARGS)
    (magma_id,) = (i for i in forge.planned if i.startswith("magma-cuda130-"))
    torch_id = f"pytorch-{PYTORCH}-cu130-py311-linux_64"
    assert torch_id in forge.planned
    _published(forge)
    # The pytorch build's host environment took magma-cuda130 from the output channel, just built.
    log = _log(forge, torch_id)
    host = log[log.index("## Package Plan ##"):]
    magma_line = next(line for line in host.splitlines() if line.strip().startswith("magma-cuda130"))
    magma_build = forge.planned[magma_id].stem.removeprefix("magma-cuda130-")
    assert magma_build in magma_line and forge.out.name in magma_line
    assert "source edit ok: replace control/get_batched_crossover.cpp (applied)" in _log(forge, magma_id)
    name, version, build = forge.planned[magma_id].stem.rsplit("-", 2)
    prefix = _create(forge, tmp_path / "magma-env", f"{name} =={version} {build}")
    library = prefix / "lib" / "libmagma.a"
    assert library.is_file() and (prefix / "include" / "magma.h").is_file()
    listing = subprocess.run([cuobjdump(), "--list-elf", str(library)], capture_output=True, text=True,
                             check=True).stdout
    assert sorted({line.rsplit(".", 2)[-2] for line in listing.splitlines() if line.startswith("ELF file")}) == \
        ["sm_80", "sm_90"]
    prefix = _imports_and_runs(forge, tmp_path / "torch-env", forge.planned[torch_id].stem)
    _bundled_cudnn_loads(prefix)


@pytest.mark.slow
def test_cpu_torch_like_built_published_installed_and_run_then_a_rerun_reuses_it(
        conda_tool: CondaTool, conda_env: dict[str, str], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    forge = _forge(conda_tool, tmp_path / "forge", CPU_ARGS)
    cpu = forge.planned[f"pytorch-{PYTORCH}-cpu-py311-linux_64"].stem
    assert cpu.startswith(f"pytorch-{PYTORCH}-py3.11_cpu_") and cpu.endswith("_0")  # `_tf<hash>`: a custom source
    _published(forge)
    _imports_and_runs(forge, tmp_path / "torch-env", cpu)
    before = (forge.out / "linux-64" / f"{cpu}.conda").stat().st_mtime_ns
    assert main(["build", *CPU_ARGS, "--config", str(forge.site), "--out", str(forge.out)]) == 0
    assert f"reuse {cpu}: already in" in capsys.readouterr().err
    assert (forge.out / "linux-64" / f"{cpu}.conda").stat().st_mtime_ns == before


@needs_nvcc
@pytest.mark.slow
def test_a_failing_conda_build_publishes_nothing_leaves_no_staging_and_is_explained(
        conda_tool: CondaTool, conda_env: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    site = tmp_path / "torchforge.toml"
    site.write_text("[channels]\nreplace = []\n")  # offline: magma needs no channel
    # magma-cuda126 checks that nvcc is CUDA 12.6, like upstream's build.sh; this machine has 13.0.
    code = main(["build", "--engine", "conda-build", "--magma-only", "--pytorch", PYTORCH, "--cuda", "12.6",
                 "--py", "3.11", "--magma-source", MAGMA_LIKE, "--skip-preflight", "--config", str(site),
                 "--out", str(out)])
    assert code == 6
    err = capsys.readouterr().err
    assert f"is CUDA {NVCC_RELEASE}, this recipe is for CUDA 12.6" in err
    assert not list(out.glob("*/*.conda")) and not list(out.glob("*/*.tar.bz2"))
    assert not list(out.glob(".staging-*"))
    (log,) = (out / "logs").glob("magma-cuda126-*.log")
    assert _CONDA_BUILD_LINE.search(log.read_text())
    assert [d.id for d in explain_log(log)] == ["recipe-nvcc-mismatch"]


# ---- one probe for --engine auto and doctor ------------------------------------------------------------------


def _engine_row(doctor_stdout: str) -> dict[str, str]:
    report = json.loads(doctor_stdout)
    return next(c for c in report["checks"] if c["name"] == "engine")


DOCTOR = ("doctor", "--pytorch", "2.5.1", "--cuda", "cpu", "--py", "3.11", "--json")
DRY_BUILD = ("build", "--pytorch", "2.5.1", "--cuda", "cpu", "--py", "3.11", "--dry-run")


@pytest.mark.slow
def test_auto_and_doctor_both_pick_the_conda_build_that_runs(conda_env: dict[str, str], tmp_path: Path) -> None:
    doctor = cli(*DOCTOR, "--out", str(tmp_path / "out"), env=conda_env)
    row = _engine_row(doctor.stdout)
    assert row["status"] == "ok" and row["detail"].startswith("conda-build ") and "auto" in row["detail"]
    version = row["detail"].split()[1]
    build = cli(*DRY_BUILD, "--out", str(tmp_path / "out"), env=conda_env)
    assert build.returncode == 0, build.stderr
    assert f"using conda-build {version} (`conda build --version` runs)" in build.stderr
    assert "[dry-run] conda build " in build.stderr


BROKEN_CONDAS = {
    # a conda whose Python environment was removed: the interpreter line points nowhere
    "bad-interpreter": ("#!/nonexistent/envs/base/bin/python\nprint('never')\n",
                        "does not start: its interpreter /nonexistent/envs/base/bin/python does not exist"),
    # a conda that starts and fails (half-removed install, broken condarc)
    "fails": ("#!/bin/sh\necho 'CondaError: cannot read /opt/conda/.condarc' >&2\nexit 1\n",
              "`conda build --version` exited with status 1: CondaError: cannot read /opt/conda/.condarc"),
}


@pytest.mark.parametrize(("script", "why"), list(BROKEN_CONDAS.values()), ids=list(BROKEN_CONDAS))
def test_a_conda_on_path_that_does_not_run_is_reported_and_the_embedded_engine_is_used(
        script: str, why: str, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "conda").write_text(script)
    (bin_dir / "conda").chmod(0o755)
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    doctor = cli(*DOCTOR, "--out", str(tmp_path / "out"), env=env)
    row = _engine_row(doctor.stdout)
    assert row["status"] == "warn" and row["detail"].startswith("embedded rattler-build ")
    assert f"`conda` at {bin_dir / 'conda'} is on PATH but {why}" in row["detail"]
    build = cli(*DRY_BUILD, "--out", str(tmp_path / "out"), env=env)
    assert build.returncode == 0, build.stderr
    assert f"using the embedded rattler-build engine (`conda` at {bin_dir / 'conda'} is on PATH but {why}" \
        in build.stderr
    assert "torchforge.engines.rattler_worker" in build.stderr and "[dry-run] conda build" not in build.stderr
    # without preflight the engine is refused at once (with it, preflight's engine row fails among the rest)
    forced = cli(*DRY_BUILD[:-1], "--engine", "conda-build", "--skip-preflight", "--out", str(tmp_path / "out"),
                 env=env)
    assert forced.returncode == 5 and "is on PATH but" in forced.stderr


# ---- conda render ------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def render_inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(folder of the fresh recipes, a channel of metadata-only stand-ins for every recipe's requirements,
    conda's scratch folder for the renders of this worker).

    The renders share one package cache: it can only hold packages of that one stand-in channel, so nothing
    stale can leak into a solve, and extracting the stand-ins again for every recipe doubles the time."""
    root = tmp_path_factory.mktemp("render")
    for render_plan in _fresh_plans():
        write_folders(recipe_folders(render_plan, RecipeFormat.CONDA_BUILD), root / "fresh")
    specs = {"pip"}  # real conda makes every python depend on pip (add_pip_as_python_dependency)
    for meta in [*(root / "fresh").glob("*/meta.yaml"), *EXPECTED.glob("*/conda-build/*/meta.yaml")]:
        specs.update(recipe_requirements(meta.read_text()))
    make_stub_channel(root / "stubs", sorted(specs), SUBDIRS, runnable=False)
    return root / "fresh", root / "stubs", root / "conda"


@pytest.mark.slow
@pytest.mark.parametrize("recipe", RECIPES, ids=[f"{r.golden or 'fresh'}-{r.folder}" for r in RECIPES])
def test_conda_render_accepts_the_recipe_and_computes_the_planned_build_string(
        recipe: Planned, conda_tool: CondaTool, render_inputs: tuple[Path, Path, Path]) -> None:
    fresh, stubs, scratch = render_inputs
    folder = EXPECTED / recipe.golden / "conda-build" / recipe.folder if recipe.golden else fresh / recipe.folder
    assert (folder / "meta.yaml").is_file()
    # --output: the package path conda-build would write, after solving build and host (it fails when it cannot).
    result = run_conda(conda_tool, scratch, "render", str(folder), "--override-channels", "-c", f"file://{stubs}",
                       "--output")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    package = Path(result.stdout.strip().splitlines()[-1])
    assert (package.parent.name, package.name.removesuffix(".conda").removesuffix(".tar.bz2")) == \
        (recipe.subdir, recipe.stem)


def test_the_render_matrix_is_wide() -> None:
    assert len(RECIPES) >= 25 and {"linux-64", "win-64", "linux-aarch64"} <= set(SUBDIRS)
    builds = [r.stem.rsplit("-", 1)[1] for r in RECIPES if r.stem.startswith("pytorch-")]
    assert any("_cpu_" in b for b in builds) and any("_cuda" in b for b in builds)
    assert len({r.stem.split("-")[1] for r in RECIPES if r.stem.startswith("pytorch-")}) >= 8
