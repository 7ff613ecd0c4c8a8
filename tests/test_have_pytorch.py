"""`--for SPEC` (issue 38): companions and extensions for a pytorch package a channel already has, typed as a user
types them. The channel here holds a package named and indexed as `torchforge repack` names the real torch 2.13.0
CPU wheel (pytorch-2.13.0-whl_py3.12_cpu_0, requiring python 3.12 and no libtorch): planning reads only its index
record, so no 200 MB wheel is repacked for these (tests/test_have_pytorch_stack.py builds from the real one)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.condabuild import find_conda_tool
from tests.pkgfactory import make_package
from tests.test_build import needs_nvcc
from tests.test_upload_helpers import cli
from torchforge.localchannel import index

ROOT = Path(__file__).resolve().parent.parent
SCATTER = ROOT / "tests" / "fixtures" / "sdists" / "torch_scatter-2.1.2.tar.gz"
REPACKED = "pytorch-2.13.0-whl_py3.12_cpu_0"
FOR = "pytorch ==2.13.0 whl_*"


def _channel(folder: Path, *builds: str, requirements: tuple[str, ...] = ("filelock", "networkx")) -> Path:
    """pytorch packages requiring python, filelock and networkx, and packages of `requirements`."""
    for build in builds:
        make_package(folder / "linux-64", name="pytorch", version="2.13.0", build=build,
                     depends=("python >=3.12,<3.13.0a0", "filelock", "networkx >=2.5.1"))
    for name in requirements:
        make_package(folder / "noarch", name=name, version="3.0", build="pyhd8ed1ab_0", subdir="noarch")
    index(folder)
    return folder


@pytest.fixture(scope="module")
def channel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _channel(tmp_path_factory.mktemp("have") / "chan", "whl_py3.12_cpu_0")


def _steps(stdout_and_err: str) -> list[str]:
    """The package column of `build --dry-run`'s plan table."""
    return [cells[2].strip() for line in stdout_and_err.splitlines()
            if (cells := line.split("│")) and len(cells) > 3 and cells[1].strip().isdigit()]


def _why(stdout_and_err: str) -> list[str]:
    """The "why / needs" column of `build --dry-run`'s plan table, one text per step: a cell wrapped over several
    lines is joined, so what is checked does not depend on where a long temporary path made the table wrap."""
    rows: list[list[str]] = []
    for line in stdout_and_err.splitlines():
        cells = line.split("│")
        if len(cells) > 5:
            if cells[1].strip().isdigit():
                rows.append([])
            if rows and cells[4].strip():
                rows[-1].append(cells[4].strip())
    return [" ".join(row) for row in rows]


@pytest.mark.parametrize("flavour", ["official", "conda-forge"])
def test_no_pytorch_source_build_is_planned_for_a_channels_pytorch(flavour: str, channel: Path, tmp_path: Path) -> None:
    """Before --for, the only route planned a pytorch source build (`--pytorch 2.13.0 --cuda cpu --py 3.12`:
    conda-forge's libtorch + pytorch recipe, or the official pytorch recipe; the official flavour refused --with).
    Now the plan is its torchvision (of the flavour's shape) and the extension, pinned to the channel's file, which
    the output names."""
    done = cli("build", "--dry-run", "--flavour", flavour, "--for", FOR, "--channel", str(channel), "--with",
               "torchvision", "--extension", str(SCATTER), "--out", str(tmp_path / "out"),
               env={**os.environ, "COLUMNS": "400"})
    assert done.returncode == 0, done.stderr
    printed = done.stdout + done.stderr
    steps = _steps(printed)
    assert [s.split("-")[0] for s in steps] == ["torchvision", "torch"], printed
    # the official shape's build string (py312_cpu), conda-forge's with its digest (cpu_py312_h...)
    assert steps[0].startswith("torchvision-0.28.0-" + ("py312_cpu" if flavour == "official" else "cpu_py312_h"))
    assert not [s for s in steps if s.startswith(("pytorch-", "libtorch-"))], steps
    assert f"building for {REPACKED}: linux-64/{REPACKED}.conda of {channel}" in " ".join(printed.split())
    assert "no pytorch source build is planned" in printed
    assert any(f"({REPACKED}, of the channel)" in why for why in _why(printed)), printed


def test_the_one_pytorch_of_out_is_the_default_and_the_output_says_so(channel: Path, tmp_path: Path) -> None:
    """No --for, no --pytorch, --out holding one pytorch and --extension asked: that pytorch (before: the official
    flavour's whole 2.5.1 matrix was planned and the channel's pytorch ignored)."""
    out = _channel(tmp_path / "out", "whl_py3.12_cpu_0")
    done = cli("build", "--dry-run", "--extension", str(SCATTER), "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert [s.split("-")[0] for s in _steps(done.stdout + done.stderr)] == ["torch"]
    assert "the one pytorch of --out" in done.stderr and REPACKED in done.stderr


def test_matrix_and_doctor_name_the_file_they_plan_for(channel: Path, tmp_path: Path) -> None:
    done = cli("matrix", "--for", FOR, "--channel", str(channel), "--flavour", "conda-forge", "--with",
               "torchvision,torchaudio", "--extension", "torch-scatter==2.1.2", "--json")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert (rows[0]["kind"], rows[0]["status"], rows[0]["file"]) == ("pytorch", "in channel", REPACKED)
    assert [r["kind"] for r in rows[1:]] == ["torchvision", "torchaudio", "extension"]
    assert all(r["pytorch"] in (REPACKED, "2.13.0 whl_py3.12_cpu_0") for r in rows[1:]), rows
    doctor = cli("doctor", "--for", FOR, "--channel", str(channel), "--flavour", "conda-forge", "--with",
                 "torchvision", "--json", "--out", str(tmp_path / "out"))
    checks = {c["name"]: c["detail"] for c in json.loads(doctor.stdout)["checks"]}
    assert checks["pytorch"].startswith(f"{REPACKED}: linux-64/{REPACKED}.conda"), checks


@pytest.mark.parametrize(("args", "says"), [
    (("--for", "pytorch ==2.12.0"), f"0 pytorch packages match in {{channel}} (the channels hold: linux-64/{REPACKED}.conda)"),
    (("--for", "torch ==2.13.0"), "--for 'torch ==2.13.0' names no pytorch package"),
    (("--for", "pytorch ==2.13.0 [["), "--for 'pytorch ==2.13.0 [[' is not a conda match spec"),
    (("--for", FOR, "--pytorch", "2.13.0"), "--for names the pytorch to build for; --pytorch would plan one to build"),
])
def test_a_for_that_names_no_one_pytorch_is_a_usage_error(args: tuple[str, ...], says: str, channel: Path,
                                                            tmp_path: Path) -> None:
    done = cli("build", "--dry-run", *args, "--channel", str(channel), "--extension", str(SCATTER),
               "--out", str(tmp_path / "out"))
    assert done.returncode == 2 and says.format(channel=channel) in " ".join(done.stderr.split()), done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "out").exists()


def test_two_matching_files_are_named_and_the_spec_narrowed(tmp_path: Path) -> None:
    two = _channel(tmp_path / "two", "whl_py3.12_cpu_0", "whl_py3.12_cpu_1")
    done = cli("matrix", "--for", FOR, "--channel", str(two), "--extension", str(SCATTER), "--json")
    assert done.returncode == 2 and "2 pytorch packages match" in done.stderr, done.stderr
    assert "narrow the spec" in done.stderr
    narrowed = cli("matrix", "--for", "pytorch ==2.13.0 whl_py3.12_cpu_1", "--channel", str(two), "--extension",
                   str(SCATTER), "--json")
    assert narrowed.returncode == 0 and json.loads(narrowed.stdout)[0]["build_string"] == "whl_py3.12_cpu_1"


def test_the_conda_forge_companion_of_a_repacked_wheel_renders_with_the_real_tools(channel: Path,
                                                                                   tmp_path: Path) -> None:
    """conda-forge's torchvision recipe wants the split libtorch in host; a repacked wheel carries it inside (torch/lib),
    so the exact pytorch pin stands for it: the real conda-build (the vendored wheel) and rattler-build render the
    recipe with that pin and no libtorch line."""
    rendered = {}
    for fmt in ("conda-build", "rattler-build"):
        done = cli("render", "--for", FOR, "--channel", str(channel), "--flavour", "conda-forge", "--with",
                   "torchvision", "--format", fmt, "--out", str(tmp_path / fmt))
        assert done.returncode == 0, done.stderr
        (folder,) = (tmp_path / fmt).iterdir()
        rendered[fmt] = folder
    from tests.feedstock_rattler_render import render

    host = render(rendered["rattler-build"])["torchvision"]["fields"]["requirements.host"]
    assert "pytorch ==2.13.0 whl_py3.12_cpu_0" in host and not [s for s in host if s.startswith("libtorch")], host
    tool = find_conda_tool()
    if tool is None:
        pytest.skip("no conda-build: neither on PATH nor the vendored wheels in ../shared/vendor")
    conda_python = ROOT / ".venv-conda" / "bin" / "python"
    done = subprocess.run([str(conda_python), str(ROOT / "tests" / "feedstock_render.py"), str(rendered["conda-build"]),
                           "64", "3.12"], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    host = json.loads(done.stdout)["torchvision"]["fields"]["requirements.host"]
    assert "pytorch 2.13.0 whl_py3.12_cpu_0" in host and not [s for s in host if s.startswith("libtorch")], host


def test_the_official_companion_of_a_repacked_wheel_pins_that_file_and_no_pytorch_channel_package(
        channel: Path, tmp_path: Path) -> None:
    """The official flavour's torchvision for a channel's pytorch, rendered with the real rattler-build: host pins
    the exact repacked file; a repacked wheel requires no pytorch-mutex, so neither does its torchvision (nor
    pytorch-cuda or cpuonly, the pytorch channel's switches), and its run requirements beside pytorch are those of
    torchvision 0.28.0's PyPI wheel (the pytorch channel published none for 2.13.0: a warning says so)."""
    done = cli("render", "--for", FOR, "--channel", str(channel), "--flavour", "official", "--with", "torchvision",
               "--format", "rattler-build", "--out", str(tmp_path / "r"))
    assert done.returncode == 0, done.stderr
    assert "the pytorch channel published no torchvision for PyTorch 2.13.0" in " ".join(done.stderr.split())
    (folder,) = (tmp_path / "r").iterdir()
    (folder / "variants.yaml").write_text("{}\n")  # the official layout has none: the render helper reads one
    from tests.feedstock_rattler_render import render

    fields = render(folder)["torchvision"]["fields"]
    host, run = fields["requirements.host"], fields["requirements.run"]
    assert "pytorch ==2.13.0 whl_py3.12_cpu_0" in host, host
    assert not [s for s in (*host, *run) if s.split()[0] in ("pytorch-mutex", "pytorch-cuda", "cpuonly")], (host, run)
    assert {"numpy", "pillow !=8.3.*,>=5.3.0", "pytorch ==2.13.0"} <= set(run), run
    assert not fields.get("requirements.run_constraints"), fields


def test_a_companion_source_is_built_from_and_changes_the_package(channel: Path, tmp_path: Path) -> None:
    """--with-source torchvision=TREE: the recipe's source is that tree (as given, a CI job repeats it), and what the
    tree holds is part of the package's settings: an edit gives conda-forge's companion another build string."""
    tree = tmp_path / "vision"
    tree.mkdir()
    (tree / "setup.py").write_text("from setuptools import setup\nsetup(name='torchvision')\n")

    def planned() -> dict[str, object]:
        done = cli("matrix", "--for", FOR, "--channel", str(channel), "--flavour", "conda-forge", "--with",
                   "torchvision", "--with-source", f"torchvision={tree}", "--json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)[1]

    first = planned()
    assert planned() == first  # the same tree: the same package
    (tree / "extra.py").write_text("# an edit\n")
    assert planned()["build_string"] != first["build_string"]
    done = cli("render", "--for", FOR, "--channel", str(channel), "--flavour", "official", "--with", "torchvision",
               "--with-source", f"torchvision={tree}", "--format", "rattler-build", "--out", str(tmp_path / "r"))
    assert done.returncode == 0, done.stderr
    (folder,) = (tmp_path / "r").iterdir()
    assert f"path: {tree}" in (folder / "recipe.yaml").read_text()


@pytest.mark.parametrize(("value", "says"), [
    ("torchvision", "--with-source 'torchvision' is not NAME=PATH"),
    ("torchvision={missing}", "no such file or folder"),
    ("torchvision={empty}", "the folder holds no setup.py or pyproject.toml"),
    ("torchaudio={tree}", "--with-source torchaudio=... names a package --with does not build"),
])
def test_a_wrong_companion_source_is_a_usage_error_before_anything_is_planned(value: str, says: str, channel: Path,
                                                                              tmp_path: Path) -> None:
    tree, empty = tmp_path / "vision", tmp_path / "empty"
    tree.mkdir()
    empty.mkdir()
    (tree / "setup.py").write_text("")
    value = value.format(missing=tmp_path / "nowhere", empty=empty, tree=tree)
    done = cli("build", "--dry-run", "--for", FOR, "--channel", str(channel), "--with", "torchvision",
               "--with-source", value, "--out", str(tmp_path / "out"))
    assert done.returncode == 2 and says in " ".join(done.stderr.split()), done.stderr
    assert "what would work" in done.stderr and "Traceback" not in done.stderr and not (tmp_path / "out").exists()


def test_a_requirement_no_channel_provides_is_refused_before_any_build(tmp_path: Path) -> None:
    """A repacked pytorch requires networkx; where no channel of the build has it, the build is refused (exit 4) with
    the requirement, who needs it and where it was looked for, before anything runs (before: the engine's solver
    failed with "Failed to resolve dependencies", naming nothing). conda-forge answers from the record of its names
    (tilelang is in no feedstock of it; networkx is)."""
    lacking = _channel(tmp_path / "lacking", "whl_py3.12_cpu_0", requirements=("filelock",))
    no_wheels = tmp_path / "no-wheels"  # nor a wheel to bring it along from (tests/test_closure.py has one)
    no_wheels.mkdir()
    done = cli("build", "--dry-run", "--for", FOR, "--channel", str(lacking), "--extension", str(SCATTER),
               "--out", str(tmp_path / "out"), "--wheels", str(no_wheels))
    assert done.returncode == 4, done.stderr
    said = " ".join(done.stderr.split())
    assert f"networkx >=2.5.1 (required by {REPACKED}; {lacking}: no networkx" in said, said
    assert "filelock" not in said.split("requirements no channel")[1].split("what would work")[0]
    assert "add a channel that has them" in said and not (tmp_path / "out").exists()
    # conda-forge as a channel: its recorded names provide networkx
    done = cli("build", "--dry-run", "--for", FOR, "--channel", str(lacking), "--channel",
               "https://conda.anaconda.org/conda-forge", "--extension", str(SCATTER), "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr


def test_the_record_of_conda_forge_names_cites_each_name_and_knows_what_it_lacks() -> None:
    from torchforge import provided

    table = provided.load()
    assert {"networkx", "filelock", "einops", "transformers", "torchvision"} <= set(table.names)
    assert all(re.fullmatch(r"conda-forge/[\w.-]+-feedstock@[0-9a-f]{40}:recipe/(meta|recipe)\.yaml:\d+", s)
               for s in table.names.values()), table.names
    # mamba-ssm 2.3.2.post1's requirements that no feedstock of the record makes
    (missing,) = provided.unprovided(("tilelang ==0.1.8", "einops"), "mamba-ssm-2.3.2.post1",
                                     ("https://conda.anaconda.org/conda-forge",))
    assert missing.spec == "tilelang ==0.1.8" and provided.NOT_RECORDED in missing.looked_in[0]
    # a remote channel it cannot read offline may have anything: nothing is refused
    assert provided.unprovided(("tilelang ==0.1.8",), "x", ("https://example.invalid/channel",)) == []


def test_ci_builds_for_the_same_file(channel: Path, tmp_path: Path) -> None:
    """`ci --for`: the extension's job runs `torchforge build --for` of that exact file (before, a plan without a
    pytorch recipe gave its extension no command, and ci said the selection had no recipes)."""
    (tmp_path / "repo").mkdir()
    done = cli("ci", "github", "--out", str(tmp_path / "repo"), "--for", FOR, "--channel", str(channel),
               "--extension", "torch-scatter==2.1.2")
    assert done.returncode == 0, done.stderr
    workflow = (tmp_path / "repo" / ".github" / "workflows" / "torchforge.yml").read_text()
    assert "torchforge build --for 'pytorch ==2.13.0 whl_py3.12_cpu_0' --extension torch-scatter==2.1.2" in workflow


def _cuda_pytorch(channel: Path, tmp_path: Path) -> None:
    """A CUDA 13.0 pytorch package whose own torch/lib library holds SASS for sm_80 and sm_90 and PTX for compute_90,
    beside an NVIDIA library (sm_75 only) that pytorch's arch list must not take."""
    from conda_package_handling import api as cph

    from tests.test_archcheck import nvcc_library

    tree = tmp_path / "tree"
    lib = tree / "lib" / "python3.12" / "site-packages" / "torch" / "lib"
    lib.mkdir(parents=True)
    nvcc_library(lib, "torch_cuda", ["arch=compute_80,code=sm_80", "arch=compute_90,code=[sm_90,compute_90]"])
    nvcc_library(lib, "cudnn_graph", ["arch=compute_75,code=sm_75"])
    for source in lib.glob("*.cu"):
        source.unlink()
    build = "cuda130_generic_py312_h0123456_0"
    (tree / "info").mkdir()
    (tree / "info" / "index.json").write_text(json.dumps({
        "name": "pytorch", "version": "2.13.0", "build": build, "build_number": 0, "subdir": "linux-64",
        "depends": ["python >=3.12,<3.13.0a0", "libtorch 2.13.0.*", "cuda-cudart >=13.0,<14.0a0"]}))
    files = sorted(str(p.relative_to(tree)) for p in tree.rglob("*") if p.is_file())
    (channel / "linux-64").mkdir(parents=True)
    cph.create(str(tree), files, f"pytorch-2.13.0-{build}.conda", out_folder=str(channel / "linux-64"))
    make_package(channel / "linux-64", name="libtorch", version="2.13.0", build=build)
    make_package(channel / "linux-64", name="cuda-cudart", version="13.0.96", build="h0123456_0")
    index(channel)


@needs_nvcc
def test_a_cuda_pytorch_of_a_channel_gives_its_own_libraries_arch_list(tmp_path: Path) -> None:
    """The arch list of a channel's CUDA pytorch is read from the device code of its own torch/lib libraries
    (sm_80, sm_90 + PTX), not from NVIDIA's beside them (sm_75), and its extension inherits it; the package holding
    libcudart (conda-forge's cuda-cudart) is its CUDA runtime package."""
    channel = tmp_path / "chan"
    _cuda_pytorch(channel, tmp_path)
    done = cli("matrix", "--for", "pytorch ==2.13.0 cuda130*", "--channel", str(channel), "--extension",
               str(SCATTER), "--json")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert (rows[0]["cuda"], rows[0]["arch_list"]) == ("13.0", "8.0;9.0+PTX"), rows[0]
    assert [(r["kind"], r["arch_list"]) for r in rows[1:]] == [("extension", "8.0;9.0+PTX")]
    from torchforge import havepytorch
    from torchforge.flavours.base import Request

    build, _ = havepytorch.given(Request(for_pytorch="pytorch ==2.13.0 cuda130*", for_channels=(str(channel),)))
    assert build.cuda_runtime == "cuda-cudart >=13.0,<14.0a0" and build.split_libtorch
    # --arch-list overrides for the extension; the pytorch's row keeps what its libraries hold
    done = cli("matrix", "--for", "pytorch ==2.13.0 cuda130*", "--channel", str(channel), "--extension",
               str(SCATTER), "--arch-list", "9.0", "--json")
    rows = json.loads(done.stdout)
    assert [r["arch_list"] for r in rows] == ["8.0;9.0+PTX", "9.0"], rows


@needs_nvcc
@pytest.mark.parametrize("flavour", ["official", "conda-forge"])
def test_the_companion_of_a_channels_cuda_pytorch_renders_with_its_file_and_arch_list(flavour: str,
                                                                                    tmp_path: Path) -> None:
    """torchvision for a channel's CUDA pytorch, rendered by the real rattler-build: host pins that exact file, and
    the build script holds the arch list read from pytorch's own libraries (the official flavour exports it; the
    conda-forge one checks that the host pytorch's activation sets the same, as conda-forge's libtorch does)."""
    channel = tmp_path / "chan"
    _cuda_pytorch(channel, tmp_path)
    done = cli("render", "--for", "pytorch ==2.13.0 cuda130*", "--channel", str(channel), "--flavour", flavour,
               "--with", "torchvision", "--format", "rattler-build", "--out", str(tmp_path / "r"))
    assert done.returncode == 0, done.stderr
    (folder,) = (tmp_path / "r").iterdir()
    if not (folder / "variants.yaml").exists():
        (folder / "variants.yaml").write_text("{}\n")  # the official layout has none: the render helper reads one
    from tests.feedstock_rattler_render import render

    host = render(folder)["torchvision"]["fields"]["requirements.host"]
    assert "pytorch ==2.13.0 cuda130_generic_py312_h0123456_0" in host, host
    script = (folder / "build.sh").read_text()
    wanted = "export TORCH_CUDA_ARCH_LIST='8.0;9.0+PTX'" if flavour == "official" else \
        '"${CF_TORCH_CUDA_ARCH_LIST}" != "8.0;9.0+PTX"'
    assert wanted in script, script


def test_a_cuda_pytorch_without_listable_device_code_needs_an_arch_list(tmp_path: Path) -> None:
    """A CUDA pytorch whose torch/lib holds no device code to list (a miniature, a stripped build): refused with
    the way out, and planned with --arch-list."""
    channel = tmp_path / "chan"
    make_package(channel / "linux-64", name="pytorch", version="2.13.0", build="whl_py3.12_cuda13.0_0",
                 depends=["python >=3.12,<3.13.0a0", "nvidia-cuda-runtime ==13.0.96"])
    make_package(channel / "linux-64", name="nvidia-cuda-runtime", version="13.0.96", build="whl_py3.12_0")
    index(channel)
    spec = ("--for", "pytorch ==2.13.0 whl_*", "--channel", str(channel), "--extension", str(SCATTER), "--json")
    refused = cli("matrix", *spec)
    assert refused.returncode == 2 and "hold no device code" in refused.stderr and "--arch-list" in refused.stderr
    done = cli("matrix", *spec, "--arch-list", "9.0")
    assert done.returncode == 0, done.stderr
    assert [r["arch_list"] for r in json.loads(done.stdout)] == ["9.0", "9.0"]


def test_the_record_reads_the_names_a_recipe_makes_and_no_other(tmp_path: Path) -> None:
    """scripts/conda_forge_names.py on torchvision's feedstock recipe (a snapshot in tests/data): its two outputs,
    not the names of its context, its requirements or its tests; a single-output meta.yaml's `{{ name|lower }}`."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("conda_forge_names", ROOT / "scripts" / "conda_forge_names.py")
    assert spec and spec.loader
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    recipe = next((ROOT / "tests" / "data" / "stack_feedstock" / "torchvision").glob("*/recipe/recipe.yaml"))
    assert [name for name, _ in script.package_names(recipe.read_text())] == ["torchvision", "torchvision-tests"]
    meta = '{% set name = "Einops" %}\npackage:\n  name: {{ name|lower }}\nrequirements:\n  run:\n    - python\n'
    assert script.package_names(meta) == [("einops", 3)]


def test_the_disk_row_of_a_plan_that_builds_no_pytorch_source_uses_the_measured_figure(channel: Path,
                                                                                        tmp_path: Path) -> None:
    """An extension for a channel's pytorch compiles no pytorch: the disk row asks for the measured extension
    figure of preflight.toml, with its source; a plan that builds pytorch from source still asks for the estimate
    of a whole build (the known-bad case: the same row must not relax there)."""
    from torchforge.preflight.table import load_table
    disk = load_table().disk
    env = {"TORCHFORGE_MIN_FREE_GIB": ""}  # unset: the suite's conftest sets 1 GiB for its stand-in builds
    extension = cli("doctor", "--for", FOR, "--channel", str(channel), "--extension", str(SCATTER), "--json",
                    "--out", str(tmp_path / "out"), env=env)
    rows = {c["name"]: c for c in json.loads(extension.stdout)["checks"]}
    assert f"(need {disk.min_free_gib_extensions:g} GiB)" in rows["disk"]["detail"], rows["disk"]
    source = cli("doctor", "--flavour", "conda-forge", "--pytorch", "2.13.0", "--cuda", "cpu", "--py", "3.12",
                 "--json", "--out", str(tmp_path / "out"), env=env)
    rows = {c["name"]: c for c in json.loads(source.stdout)["checks"]}
    assert f"(need {disk.min_free_gib_cpu:g} GiB)" in rows["disk"]["detail"], rows["disk"]
    assert disk.min_free_gib_extensions < disk.min_free_gib_cpu and "measured" in disk.extensions_reason


@pytest.mark.parametrize(("variable", "says"), [
    ("torch-scatter:MAX_JOBS=64", "torchforge sets MAX_JOBS for every extension build"),
    ("torch-scatter:TORCH_CUDA_ARCH_LIST=9.0", "torchforge sets TORCH_CUDA_ARCH_LIST"),
    ("torch-scatter:https_proxy=http://proxy:3128", "the build runs with no network"),
    ("torch-scatter=WITH_SYMBOLS", "not NAME:KEY=VALUE"),
    ("torch-sactter:WITH_SYMBOLS=1", "the request builds no extension named torch-sactter"),
])
def test_an_extension_variable_that_cannot_be_used_is_refused_before_planning(variable: str, says: str,
                                                                               channel: Path, tmp_path: Path) -> None:
    """A variable torchforge sets (the jobs, the arch list, the network's proxies), a malformed flag and one for
    an extension the request does not build: exit 2, what is wrong and what would work, nothing written."""
    done = cli("build", "--dry-run", "--for", FOR, "--channel", str(channel), "--extension", str(SCATTER),
               "--extension-env", variable, "--out", str(tmp_path / "out"))
    assert done.returncode == 2, done.stdout + done.stderr
    err = " ".join(done.stderr.split())
    assert says in err and "what would work:" in err and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()


def test_an_extension_variable_names_another_package_and_rides_on_its_ci_command(channel: Path,
                                                                                  tmp_path: Path) -> None:
    """torch-scatter 2.1.2's WITH_SYMBOLS (setup.py:29): the build string's digest takes it (another package than
    the plain build), the settings record it, and the recipe's command (what a CI job runs) gives it again."""
    def row(*variables: str) -> dict[str, object]:
        done = cli("matrix", "--for", FOR, "--channel", str(channel), "--extension", str(SCATTER), *variables,
                   "--json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)[-1]
    plain, with_symbols = row(), row("--extension-env", "torch-scatter:WITH_SYMBOLS=1")
    assert plain["variables"] == {} and with_symbols["variables"] == {"WITH_SYMBOLS": "1"}
    assert plain["build_string"] != with_symbols["build_string"]
    assert str(with_symbols["build_string"]).startswith("pt2.13.0_cpu_")
    done = cli("build", "--dry-run", "--for", FOR, "--channel", str(channel), "--extension", str(SCATTER),
               "--extension-env", "torch-scatter:WITH_SYMBOLS=1", "--out", str(tmp_path / "out"),
               env={"COLUMNS": "400"})
    assert done.returncode == 0, done.stderr
    assert f"torch-scatter-2.1.2-{with_symbols['build_string']}" in _steps(done.stdout + done.stderr)


def test_a_channel_folder_named_without_a_path_reaches_the_engine_as_that_folder(channel: Path, tmp_path: Path) -> None:
    """`--channel torch-channel` in the folder holding it, as the README's extension block types it: --for reads
    that folder, and the engine gets it as a file:// URL (before: rattler-build got the bare word, read it as a
    channel name of anaconda.org and the solve failed: "remote channels not read: torch-channel")."""
    import shutil

    shutil.copytree(channel, tmp_path / "torch-channel")
    done = cli("build", "--dry-run", "--for", FOR, "--channel", "torch-channel", "--extension", str(SCATTER),
               "--out", "out", cwd=tmp_path, env={**os.environ, "COLUMNS": "400"})
    assert done.returncode == 0, done.stderr
    engine_line = next(line for line in (done.stdout + done.stderr).splitlines() if line.startswith("[dry-run]"))
    assert f"--channel {(tmp_path / 'torch-channel').resolve().as_uri()} " in engine_line + " ", engine_line
    assert "--channel torch-channel " not in engine_line + " ", engine_line
