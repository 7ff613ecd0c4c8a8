"""The extension recipe producer (torchforge/extensions/recipe.py): one PlannedRecipe per extension and pytorch
build, in both engines' formats, from the real causal-conv1d 1.7.0 sdist's metadata and pytorch packages in a
local channel (tests/pkgfactory.py, official-style dotted build strings)."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from tests.pkgfactory import make_package
from tests.test_build import needs_nvcc
from torchforge.errors import UsageError
from torchforge.extensions.metadata import SdistMetadata
from torchforge.extensions.recipe import ExtensionInputs, PytorchBuild, build_string, extension_recipe
from torchforge.havepytorch import in_channel
from torchforge.localchannel import index
from tests.test_repack_stack import cuda13_wheels  # noqa: F401  (a fixture: torch 2.11-shaped CUDA 13 wheels)
from torchforge.flavours.base import Plan
from torchforge.pipeline import BuildSettings, plan_steps

CAUSAL = Path(__file__).parent / "fixtures" / "sdists" / "causal_conv1d-1.7.0.tar.gz"
# What pip's report says of the real sdist (tests/test_extension_sdist.py reads it with pip).
CAUSAL_META = SdistMetadata("causal_conv1d", "1.7.0", ("torch", "packaging", "ninja"), ("setuptools", "wheel", "torch"))
CUDA_PYTORCH = PytorchBuild("2.13.0", "py3.12_cuda13.0_cudnn9.13.0_0", "linux-64", "3.12", "13.0")


def inputs(pytorch: PytorchBuild = CUDA_PYTORCH, arch_list: str = "9.0") -> ExtensionInputs:
    return ExtensionInputs(CAUSAL, CAUSAL_META, pytorch, arch_list, ("file:///channel",))


def test_the_build_string_names_the_pytorch_build_and_no_two_share_one() -> None:
    text = build_string(CUDA_PYTORCH, "9.0", 0)
    assert text.startswith("pt2.13.0_cu130_") and text.endswith("_py312_0")
    other_build = dataclasses.replace(CUDA_PYTORCH, build="py3.12_cuda13.0_cudnn9.13.0_1")
    assert len({text, build_string(other_build, "9.0", 0), build_string(CUDA_PYTORCH, "8.0;9.0", 0)}) == 3


@pytest.mark.parametrize(("fmt", "name", "pin"), [
    ("conda-build", "meta.yaml", "pytorch ==2.13.0 py3.12_cuda13.0_cudnn9.13.0_0"),
    ("rattler-build", "recipe.yaml", "pytorch ==2.13.0 py3*12_cuda13*0_cudnn9*13*0_0"),
])
def test_both_formats_pin_that_pytorch_build_in_host_and_run(fmt: str, name: str, pin: str) -> None:
    recipe = extension_recipe(inputs(), fmt)
    parsed = YAML(typ="safe").load(str(recipe.files[name]).replace("${{", "'${{").replace("}}", "}}'"))
    assert parsed["package"] == {"name": "causal-conv1d", "version": "1.7.0"}
    # CUDA: ninja too (torch's cpp_extension goes through $PYTORCH_NVCC, the compile cache's arch filter, only then)
    assert parsed["requirements"]["host"] == ["python 3.12.*", "setuptools", "wheel", "ninja", "pip", pin]
    assert parsed["requirements"]["run"] == ["python 3.12.*", pin, "packaging", "ninja"]
    assert parsed["build"]["string"] == build_string(CUDA_PYTORCH, "9.0", 0)
    assert recipe.stems == (f"causal-conv1d-1.7.0-{build_string(CUDA_PYTORCH, '9.0', 0)}",)
    assert (recipe.accel, recipe.subdir) == ("13.0", "linux-64")
    script = str(recipe.files["build.sh"])
    # its own switch (no prebuilt wheel from GitHub), the arch list for the nvcc filter, no network, CUDA 13.0
    for line in ("export CAUSAL_CONV1D_FORCE_BUILD=TRUE", "export TORCHFORGE_ARCH_LIST=9.0",
                 "export https_proxy=http://no-network-at-build-time.invalid:9", "--no-index", '= 13.0 ] ||'):
        assert line in script
    assert "CUDA_HOME" in str(recipe.files[name]) and "TORCHFORGE_KEEP_GENCODE" in str(recipe.files[name])


def test_a_cpu_build_sets_no_arch_list_and_keeps_cuda_out() -> None:
    cpu = PytorchBuild("2.13.0", "whl_py3.11_cpu_0", "linux-64", "3.11", None)
    recipe = extension_recipe(inputs(cpu, ""), "conda-build")
    assert "TORCHFORGE_ARCH_LIST" not in str(recipe.files["build.sh"]) and recipe.accel == "cpu"
    assert "CUDA_HOME" not in str(recipe.files["meta.yaml"])
    assert build_string(cpu, "", 0).startswith("pt2.13.0_cpu_")


def test_a_cuda_build_of_torch_scatter_sets_its_cuda_switch_and_a_cpu_build_does_not() -> None:
    """FORCE_CUDA=1 (torch-scatter 2.1.2 setup.py:21) in the CUDA build only: without it a build machine whose torch
    sees no GPU makes a package without kernels; in a CPU build it would ask for nvcc."""
    scatter = SdistMetadata("torch_scatter", "2.1.2", (), ("setuptools", "wheel"))
    cpu = PytorchBuild("2.13.0", "whl_py3.11_cpu_0", "linux-64", "3.11", None)
    for pytorch, arch_list, expected in ((CUDA_PYTORCH, "9.0", True), (cpu, "", False)):
        recipe = extension_recipe(dataclasses.replace(inputs(pytorch, arch_list), metadata=scatter), "conda-build")
        assert ("export FORCE_CUDA=1\n" in str(recipe.files["build.sh"])) is expected


@needs_nvcc
def test_a_cuda_build_script_stops_without_ninja_and_says_why(tmp_path: Path) -> None:
    """The real build.sh with the real nvcc 13.0: where no ninja is on PATH it stops before pip (cpp_extension would
    run $CUDA_HOME/bin/nvcc past the compile cache's arch filter); with ninja it goes on to pip ($PYTHON)."""
    script = tmp_path / "build.sh"
    script.write_text(str(extension_recipe(inputs(), "conda-build").files["build.sh"]))
    nvcc = Path(shutil.which("nvcc") or "")
    tools = tmp_path / "bin"
    tools.mkdir()
    for tool in ("sed", "env", "cat", "dirname", "unshare", "echo"):
        (tools / tool).symlink_to(shutil.which(tool) or tool)
    env = {"CUDA_HOME": str(nvcc.parent.parent), "PYTHON": "echo", "PATH": str(tools), "SRC_DIR": str(tmp_path / "src"),
           "PREFIX": str(tmp_path / "prefix"), "RECIPE_DIR": str(tmp_path)}
    stopped = subprocess.run(["/bin/bash", str(script)], capture_output=True, text=True, env=env)
    assert stopped.returncode == 1 and "torchforge: no ninja in the build environment" in stopped.stderr
    assert "-m pip install" not in stopped.stdout
    (tools / "ninja").symlink_to(shutil.which("ninja") or "ninja")
    went_on = subprocess.run(["/bin/bash", str(script)], capture_output=True, text=True, env=env)
    assert went_on.returncode == 0, went_on.stderr
    assert "-m pip install . --no-deps --no-build-isolation --no-index" in went_on.stdout
    # pip (the setup.py) runs in the namespaces: the recipe's copy of isolation_child.py starts it (here echoed)
    assert f"{tmp_path}/isolation_child.py {tmp_path / 'src'} {tmp_path / 'prefix'} -- echo -m pip" in went_on.stdout


@needs_nvcc
@pytest.mark.parametrize(("arch_list", "sass", "ptx"), [("9.0", ["sm_90"], []),
                                                       ("8.0;9.0+PTX", ["sm_80", "sm_90"], ["sm_90"])])
def test_what_nvcc_builds_under_the_recipe_is_its_arch_list(arch_list: str, sass: list[str], ptx: list[str],
                                                            tmp_path: Path) -> None:
    """The recipe's real build.sh, run with the compile cache's compilers as the pipeline runs it, and in pip's
    place a step that compiles a kernel as causal-conv1d 1.7.0's setup.py asks (its whole -gencode list, read from
    the sdist) through $PYTORCH_NVCC (else $CUDA_HOME/bin/nvcc), as torch's cpp_extension does under ninja: cuobjdump finds SASS (and PTX)
    for the recipe's arch list and nothing else."""
    from tests.test_gencode_filter import KERNEL, inside, setup_py_gencode
    from torchforge.compilecache import COMPILERS_VARIABLE, CompileCache, find_ccache

    cache = CompileCache(tmp_path / "cache", "ext", find_ccache() or "")
    cache.prepare()
    work = tmp_path / "work"
    work.mkdir()
    (work / "kernel.cu").write_text(KERNEL)
    (work / "build.sh").write_text(str(extension_recipe(inputs(arch_list=arch_list), "conda-build").files["build.sh"]))
    setup_py = tmp_path / "setup-py-compile"
    setup_py.write_text('#!/bin/bash\nexec "${PYTORCH_NVCC:-$CUDA_HOME/bin/nvcc}" -c kernel.cu -o kernel.o '
                        + " ".join(setup_py_gencode("causal_conv1d-1.7.0.tar.gz")) + "\n")
    setup_py.chmod(0o755)
    compilers = cache.build_env(work, work / "stats.log")[COMPILERS_VARIABLE]
    nvcc = Path(shutil.which("nvcc") or "").resolve()
    env = {"PATH": f"{Path(shutil.which('ninja') or '').parent}:/usr/bin:/bin", "HOME": str(tmp_path),
           "CUDA_HOME": str(nvcc.parent.parent), "PYTHON": str(setup_py), COMPILERS_VARIABLE: compilers,
           "SRC_DIR": str(work), "RECIPE_DIR": str(work), "PREFIX": str(tmp_path / "prefix"),
           "TORCHFORGE_UNISOLATED": "1"}
    done = subprocess.run(["/bin/bash", "build.sh"], cwd=work, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert inside(work / "kernel.o") == (sass, ptx), done.stderr


def test_the_recipe_is_one_more_recipe_step_and_reused_only_with_the_same_settings(tmp_path: Path) -> None:
    recipe = extension_recipe(inputs(), "rattler-build")
    settings = BuildSettings(out=tmp_path / "out")
    (step,) = plan_steps(Plan("extension", (recipe,)), settings)
    assert (step.kind, step.stems, step.action.value, step.accel) == ("extension", recipe.stems, "build", "13.0")
    # through the compile cache (its nvcc route keeps only the arch list), and the arch check of its libraries
    assert step.cache_key and "TORCHFORGE_COMPILERS" in step.script_env and step.arch_list == "9.0"
    (uncached,) = plan_steps(Plan("extension", (recipe,)), dataclasses.replace(settings, use_cache=False))
    assert uncached.cache_key is None and "TORCHFORGE_COMPILERS" not in uncached.script_env
    name, version, build = recipe.stems[0].rsplit("-", 2)
    make_package(tmp_path / "out" / "linux-64", name, version, build, about_extra={"torchforge_settings": recipe.settings})
    index(tmp_path / "out")
    (again,) = plan_steps(Plan("extension", (recipe,)), settings)
    assert again.action.value == "reuse"


def test_the_pytorch_of_the_channel(tmp_path: Path) -> None:
    """The one pytorch of the output channel, read as --for reads one (torchforge.havepytorch): a CUDA one's arch
    list comes from its own libraries, so a package whose libraries hold no device code is refused."""
    channel = tmp_path / "chan"
    make_package(channel / "linux-64", "pytorch", "2.13.0", "py3.12_cuda13.0_cudnn9.13.0_0",
                 depends=["python >=3.12,<3.13.0a0", "pytorch-mutex 1.0 cuda"])
    index(channel)
    with pytest.raises(UsageError, match="a CUDA 13.0 pytorch whose own libraries .* hold no device code"):
        in_channel(channel, "linux-64")
    cpu = tmp_path / "cpu"
    make_package(cpu / "linux-64", "pytorch", "2.13.0", "py3.11_cpu_0", depends=["python 3.11.* *_cpython"])
    index(cpu)
    found = in_channel(cpu, "linux-64")
    assert (found.version, found.build, found.python, found.cuda, found.arch_list) == (
        "2.13.0", "py3.11_cpu_0", "3.11", None, None)
    make_package(cpu / "linux-64", "pytorch", "2.13.0", "py3.12_cpu_0", depends=["python >=3.12,<3.13.0a0"])
    index(cpu)
    with pytest.raises(UsageError, match=r"2 pytorch packages .*py3.11_cpu_0.*py3.12_cpu_0") as caught:
        in_channel(cpu, "linux-64")
    assert "an extension is built for exactly one" in str(caught.value)
    with pytest.raises(UsageError, match="0 pytorch packages"):
        in_channel(tmp_path / "empty", "linux-64")


def test_an_unknown_engine_format_is_refused() -> None:
    with pytest.raises(UsageError, match="no extension recipe for the engine format 'pip'"):
        extension_recipe(inputs(), "pip")


def test_build_reads_every_extension_spec_before_building(tmp_path: Path) -> None:
    """`torchforge build --extension` with a SPEC it cannot read: exit 2 and what would work, before any build."""
    from tests.test_upload_helpers import cli

    result = cli("build", "--pytorch", "2.13.0", "--cuda", "cpu", "--py", "3.11", "--flavour", "official",
                 "--skip-preflight", "--out", str(tmp_path / "out"), "--extension", "torch-scatter==2.1.2",
                 "--extension", "torch-scatter")
    assert result.returncode == 2, result.stderr
    assert "--extension 'torch-scatter': not NAME==VERSION" in result.stderr and "NAME==VERSION" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "out").exists()


def test_a_cuda_extension_requires_the_package_that_holds_libcudart_as_its_pytorch_names_it(
        cuda13_wheels: list[Path], tmp_path: Path) -> None:  # noqa: F811  (the imported fixture)
    """cpp_extension links libcudart into every CUDA extension; the RPATH audit accepts a library only from a
    declared requirement, so the extension requires pytorch's own libcudart package, in either repack mode."""
    from torchforge.binaries.plan import CudaLibs
    from torchforge.binaries.stack import repack_stack
    from torchforge.proc import Runner

    wanted = {CudaLibs.WHEELS: "nvidia-cuda-runtime ==13.0.96", CudaLibs.CONDA_FORGE: "cuda-cudart 13.0.96.*"}
    for mode, spec in wanted.items():
        repack_stack([w for w in cuda13_wheels if not w.name.startswith("torchvision")], tmp_path / mode.value,
                     Runner(), mode=mode)
        pytorch = in_channel(tmp_path / mode.value, "linux-64", arch_list="9.0")  # the miniature has no device code
        assert (pytorch.cuda, pytorch.cuda_runtime) == ("13.0", spec)
        for fmt, name in (("conda-build", "meta.yaml"), ("rattler-build", "recipe.yaml")):
            recipe = extension_recipe(inputs(pytorch), fmt)
            run = YAML(typ="safe").load(str(recipe.files[name]).replace("${{", "'${{").replace("}}", "}}'"))
            assert spec in run["requirements"]["run"] and spec not in run["requirements"]["host"]
            assert recipe.arch_list == "9.0"  # the pipeline checks the built package's device code for it
    cpu = dataclasses.replace(CUDA_PYTORCH, cuda=None, cuda_runtime="nvidia-cuda-runtime ==13.0.96")
    assert not any("cuda-runtime" in s for s in inputs(cpu, "").requirements("conda-build")["run"])
