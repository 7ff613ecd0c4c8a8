"""The magma recipe against the real MAGMA 2.5.2, 2.6.1 and 2.10.0 trees (../shared/sources, unpacked once per
session): every source edit applies and is idempotent, every edit stops the build loudly when its text is absent,
and the rendered build.sh configures real MAGMA with an arch list 2.6.1's own GPU_TARGET table does not know (9.0),
and 2.5.2 with the official magma-cuda115 flags (GPU_TARGET=All and CUDA 11.5's gencode list, sm_37 to sm_86).

There is no cuBLAS on the test machines: CMake gets a stand-in toolkit (this machine's nvcc, headers and
runtime, plus empty libcublas/libcusparse compiled here), which is enough to configure and generate.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.cuda_standin import REAL_CUDA, make_stand_in_toolkit
from torchforge import data as tables
from torchforge.flavours.official.magmasource import MagmaSource, inspect
from torchforge.flavours.official.recipe import magma_context
from torchforge.flavours.official.render import render_files
from torchforge.templates import RecipeFormat
from torchforge.flavours.official.magmaplan import plan_magma

REPO = Path(__file__).resolve().parent.parent
SOURCES = REPO.parent / "shared" / "sources"
CUDA = "13.0"  # this machine's nvcc

needs_tools = pytest.mark.skipif(shutil.which("cmake") is None or not (REAL_CUDA / "bin" / "nvcc").exists(),
                                 reason="needs cmake and a CUDA toolkit with nvcc")


@pytest.fixture(scope="session")
def magma_trees(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """{version: unpacked tree}: each archive is unpacked once per session; tests link-copy what they change."""
    if not SOURCES.is_dir():
        pytest.skip("../shared/sources is not beside this checkout")
    root = tmp_path_factory.mktemp("magma-sources")
    trees = {}
    for version in ("2.5.2", "2.6.1", "2.10.0"):
        with tarfile.open(SOURCES / f"magma-{version}-generated.tar.gz") as archive:
            archive.extractall(root, filter="data")
        trees[version] = root / f"magma-{version}"
    return trees


def link_copy(tree: Path, target: Path) -> Path:
    """A copy that shares file data: source_edits.py replaces the files it edits, never writes into them."""
    shutil.copytree(tree, target, copy_function=os.link)
    return target


@pytest.fixture(scope="session")
def stand_in_toolkit(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This machine's CUDA toolkit with empty libcublas.so and libcusparse.so added (they are missing here)."""
    if not (REAL_CUDA / "bin" / "nvcc").exists():
        pytest.skip("needs a CUDA toolkit with nvcc")
    return make_stand_in_toolkit(tmp_path_factory.mktemp("cuda") / "toolkit")


@pytest.fixture(scope="session")
def stand_in_toolkit_115(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same, its nvcc --version saying CUDA 11.5: the magma-cuda115 recipe's nvcc check and FindCUDA see the
    CUDA it is for (configure and generate run no CUDA compile)."""
    if not (REAL_CUDA / "bin" / "nvcc").exists():
        pytest.skip("needs a CUDA toolkit with nvcc")
    return make_stand_in_toolkit(tmp_path_factory.mktemp("cuda115") / "toolkit", release="11.5")


def recipe_files(version: str, arch_list: str | None = None, source: MagmaSource | None = None,
                 cuda: str = CUDA) -> dict[str, str]:
    plan = plan_magma(tables.load(), cuda, version, "linux-64", arch_list, source)
    return {k: str(v) for k, v in render_files(magma_context(plan), RecipeFormat.CONDA_BUILD).items()}


def run_edits(files: dict[str, str], tree: Path, tmp_path: Path, edits: list[dict[str, object]] | None = None
              ) -> subprocess.CompletedProcess[str]:
    (tmp_path / "source_edits.py").write_text(files["source_edits.py"])
    (tmp_path / "source_edits.json").write_text(json.dumps(edits) if edits is not None else files["source_edits.json"])
    return subprocess.run([sys.executable, str(tmp_path / "source_edits.py"), str(tmp_path / "source_edits.json"),
                           str(tree)], capture_output=True, text=True, check=False)


def apply_twice(files: dict[str, str], tree: Path, tmp_path: Path) -> None:
    """Every edit applies once; a second run finds each already applied and changes no file."""
    edits = json.loads(files["source_edits.json"])
    first = run_edits(files, tree, tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    assert first.stdout.count("(applied)") == len(edits), first.stdout
    snapshot = {p: p.read_text() for p in {tree / e["file"] for e in edits}}
    second = run_edits(files, tree, tmp_path)
    assert second.returncode == 0 and second.stdout.count("(already-applied)") == len(edits), second.stdout
    assert {p: p.read_text() for p in snapshot} == snapshot


# ---- the version of a source is read from the source -------------------------------------------------------


def test_versions_are_read_from_the_real_trees_and_tarballs(magma_trees: dict[str, Path]) -> None:
    for version, tree in magma_trees.items():
        found = inspect(str(tree))
        assert found == MagmaSource("tree", str(tree.resolve()), version, state=found.state)
        assert found.state is not None and found.state.startswith("sha256:")  # a plain tree: its content digest
        tarball = inspect(str(SOURCES / f"magma-{version}-generated.tar.gz"))
        assert (tarball.kind, tarball.version) == ("tarball", version)
        assert tarball.sha256 != tables.load().magma.versions[version].sha256  # not the release tarball


# ---- every edit on its real tree ---------------------------------------------------------------------------

# Which official patches each version gets, with CUDA 13 (magma-sources.md: pytorch .ci/magma builds 2.6.1 with
# all six, 2.10.0 with getrf_nbparam only).
EXPECTED_PATCHES = {
    "2.6.1": ["cmakelists.patch", "thread_queue.patch", "CMake.patch", "getrf_shfl.patch", "getrf_nbparam.patch",
              "cuda13.patch"],
    "2.10.0": ["getrf_nbparam.patch"],
}


@pytest.mark.parametrize("version", ["2.6.1", "2.10.0"])
def test_every_edit_applies_to_the_real_tree_and_a_rerun_changes_nothing(
        version: str, magma_trees: dict[str, Path], tmp_path: Path) -> None:
    files = recipe_files(version)
    plan = plan_magma(tables.load(), CUDA, version, "linux-64")
    assert list(plan.upstream_patches) == EXPECTED_PATCHES[version]
    tree = link_copy(magma_trees[version], tmp_path / "src")
    apply_twice(files, tree, tmp_path)
    original = magma_trees[version]
    crossover = (tree / "control/get_batched_crossover.cpp").read_text()
    for precision in "zcds":
        body = crossover.split(f"void magma_get_{precision}getrf_batched_nbparam(")[1].split("}")[0]
        assert re.search(r"\*recnb = +16;", body), (precision, body)
    # only the getrf functions change: every other `*recnb = 32` (potrf, vbatched) stays
    changed = [line for line in crossover.splitlines() if "torchforge" in line]
    assert len(changed) == 4
    assert (original / "control/get_batched_crossover.cpp").read_text().count("32;") - crossover.count("32;") == 4
    if version == "2.6.1":
        cmake = (tree / "CMakeLists.txt").read_text()
        assert "#tf: find_package( OpenMP )" in cmake and "#tf:     find_package( LAPACK )" in cmake
        assert "set(CUDA_SEPARABLE_COMPILATION OFF)" in cmake and "-fno-exceptions" in cmake
        assert "#tf:   cuda_add_library( magma_sparse ${libsparse_all} )" in cmake
        assert "install( TARGETS magma ${blas_fix}" in cmake and "sparse/include/*.h" not in cmake
        assert "        ${CUDA_cusparse_LIBRARY}\n\t)" not in cmake  # magma itself no longer links cusparse
        assert "throw std::exception();" not in (tree / "control/thread_queue.cpp").read_text().replace("/* throw std::exception(); */", "")
        sources = (tree / "CMake.src.cuda").read_text()
        assert sources.count("#magmablas/") == 8 and "\nmagmablas/zgemm_fermi.cu" not in sources
        zgetrf = (tree / "src/zgetrf_batched.cpp").read_text()
        assert "smallsq_shfl(" not in zgetrf
        assert "smallsq_shfl(" in (tree / "src/dgetrf_batched.cpp").read_text()  # the official patch is z only
        interface = (tree / "interface_cuda/interface.cpp").read_text()
        assert "#if CUDA_VERSION >= 13000" in interface and "cudaDevAttrClockRate" in interface


@pytest.mark.parametrize(("version", "cuda"), [("2.6.1", CUDA), ("2.5.2", "11.5")])
def test_every_edit_stops_the_build_loudly_when_its_text_is_missing(version: str, cuda: str, magma_trees: dict[str, Path],
                                                                    tmp_path: Path) -> None:
    """Each edit's target text removed from a real tree: every edit fails, names its fix and the text."""
    files = recipe_files(version, cuda=cuda)
    edits = json.loads(files["source_edits.json"])
    tree = link_copy(magma_trees[version], tmp_path / "src")
    for path in {e["file"] for e in edits}:
        text = (tree / path).read_text()
        for edit in (e for e in edits if e["file"] == path):
            text = text.replace(edit["find"], "")
        (tree / path).unlink()
        (tree / path).write_text(text)
    result = run_edits(files, tree, tmp_path)
    assert result.returncode == 1
    assert result.stdout.count("source edit FAILED") == len(edits), result.stdout
    for edit in edits:
        assert f"source edit FAILED [{edit['fix']}]" in result.stderr
        assert "    | " + edit["find"].splitlines()[0] + "\n" in result.stderr
    assert f"{len(edits)} required source edit(s) could not be applied" in result.stderr


def test_the_261_edits_refuse_the_2100_tree(magma_trees: dict[str, Path], tmp_path: Path) -> None:
    """A tree of another version than the recipe's: the edits whose text moved stop the build, named."""
    files = recipe_files("2.6.1")
    result = run_edits(files, link_copy(magma_trees["2.10.0"], tmp_path / "src"), tmp_path)
    assert result.returncode == 1
    failed = set(re.findall(r"source edit FAILED \[([\w-]+)\]", result.stderr))
    # 2.10.0 rewrote CMakeLists.txt, dropped the shfl call and the Fermi gemm; its getrf crossover is unchanged
    assert {"magma-cmakelists", "magma-getrf-shfl", "magma-no-fermi"} <= failed
    assert "magma-getrf-nbparam" not in failed


# ---- MAGMA 2.5.2: the official cmakelists.patch of release/1.9-1.11, as torchforge's own edits ----------------


def test_the_252_edits_apply_to_the_real_tree_and_a_rerun_changes_nothing(magma_trees: dict[str, Path],
                                                                          tmp_path: Path) -> None:
    """magma-cuda115 2.5.2 as upstream built it: cmakelists, thread_queue and cudaPointerAttributes
    (B release/1.11:magma/package_files/meta.yaml:7-10, Makefile:36)."""
    files = recipe_files("2.5.2", cuda="11.5")
    plan = plan_magma(tables.load(), "11.5", "2.5.2", "linux-64")
    assert list(plan.upstream_patches) == ["cmakelists.patch", "thread_queue.patch", "cudaPointerAttributes.patch"]
    assert not [w for w in plan.warnings if "cmakelists.patch" in w]
    tree = link_copy(magma_trees["2.5.2"], tmp_path / "src")
    apply_twice(files, tree, tmp_path)
    cmake = (tree / "CMakeLists.txt").read_text()
    assert "#tf: find_package( OpenMP )" in cmake and "#tf:     find_package( LAPACK )" in cmake
    assert "set(CUDA_SEPARABLE_COMPILATION OFF)" in cmake and "-static-libstdc++ -fno-exceptions" in cmake
    assert 'if (GPU_TARGET MATCHES "All")' in cmake and "-Xcompiler -fPIC -DHAVE_CUBLAS ${NV_SM}" not in cmake
    assert "#tf: cuda_add_library( magma_sparse ${libsparse_all} )" in cmake
    assert cmake.count("cuda_add_library( magma STATIC ") == 2 and "${CUDA_cusparse_LIBRARY}\n    )" not in cmake
    assert "install( TARGETS magma ${blas_fix}" in cmake and "sparse/include/*.h" not in cmake
    assert "#tf: install( FILES \"${CMAKE_BINARY_DIR}/${pkgconfig}\"" in cmake
    assert "throw std::exception();" not in (tree / "control/thread_queue.cpp").read_text().replace(
        "/* throw std::exception(); */", "")
    assert "attr.memoryType" not in (tree / "interface_cuda/interface.cpp").read_text()


def test_build_0_of_261_applies_only_its_own_patches_to_the_real_tree(magma_trees: dict[str, Path],
                                                                     tmp_path: Path) -> None:
    """magma-cuda115/116 2.6.1 build 0, which PyTorch 1.11 (cu115) and 1.12 (cu116) linked: cmakelists and
    thread_queue only (B 7c2cfcea:magma/package_files/meta.yaml:7-12); the LU code and the Fermi kernels stay."""
    plan = plan_magma(tables.load(), "11.6", "2.6.1", "linux-64", build_number=0)
    assert (plan.build_number, plan.build_string, plan.id) == (0, "0", "magma-cuda116-2.6.1-build0-linux_64")
    assert list(plan.upstream_patches) == ["cmakelists.patch", "thread_queue.patch"]
    assert plan.host_spec == "magma-cuda116 ==2.6.1 0"
    files = {k: str(v) for k, v in render_files(magma_context(plan), RecipeFormat.CONDA_BUILD).items()}
    assert "number: 0" in files["meta.yaml"] and 'string: "0"' in files["meta.yaml"]
    tree = link_copy(magma_trees["2.6.1"], tmp_path / "src")
    apply_twice(files, tree, tmp_path)
    original = magma_trees["2.6.1"]
    for path in ("src/zgetrf_batched.cpp", "control/get_batched_crossover.cpp", "CMake.src.cuda"):
        assert (tree / path).read_text() == (original / path).read_text(), path
    assert "set(CUDA_SEPARABLE_COMPILATION OFF)" in (tree / "CMakeLists.txt").read_text()


@pytest.mark.parametrize(("recipe", "cuda", "tree"), [("2.5.2", "11.5", "2.6.1"), ("2.6.1", CUDA, "2.5.2")])
def test_the_cmakelists_edits_of_one_version_refuse_the_other_tree(recipe: str, cuda: str, tree: str,
                                                                   magma_trees: dict[str, Path], tmp_path: Path) -> None:
    """2.5.2 and 2.6.1 differ exactly where their edits do: each set stops the build on the other's tree."""
    result = run_edits(recipe_files(recipe, cuda=cuda), link_copy(magma_trees[tree], tmp_path / "src"), tmp_path)
    assert result.returncode == 1
    failed = set(re.findall(r"source edit FAILED \[([\w-]+)\]", result.stderr))
    # 2.5.x names its source list CMake.src (no backends yet), so CMake.patch's edits find no CMake.src.cuda
    expected = {"magma-cmakelists-2-5-2"} if recipe == "2.5.2" else {"magma-cmakelists", "magma-no-fermi"}
    assert failed == expected, result.stderr


# ---- the rendered cmake invocation on the real trees -------------------------------------------------------


def configure(files: dict[str, str], tree: Path, cuda_home: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Run the rendered build.sh up to (not including) the compile: nvcc check, source edits, cmake."""
    script = files["build.sh"].split("\nmake -j")[0] + "\n"
    assert "cmake .." in script
    recipe = tmp_path / "recipe"
    recipe.mkdir()
    for name in ("source_edits.py", "source_edits.json"):
        (recipe / name).write_text(files[name])
    (recipe / "configure.sh").write_text(script)
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "CUDA_HOME": str(cuda_home), "CPU_COUNT": "2",
           "PREFIX": str(tmp_path / "prefix"), "RECIPE_DIR": str(recipe), "SRC_DIR": str(tree)}
    return subprocess.run(["nice", "bash", str(recipe / "configure.sh")], cwd=tree, env=env,
                          capture_output=True, text=True, check=False)


def make_targets(build: Path) -> set[str]:
    listing = subprocess.run(["make", "help"], cwd=build, capture_output=True, text=True, check=True).stdout
    return {line[4:].split()[0] for line in listing.splitlines() if line.startswith("... ") and "." not in line[4:]}


@needs_tools
def test_rendered_cmake_configures_real_magma_261_for_sm90_only(
        magma_trees: dict[str, Path], stand_in_toolkit: Path, tmp_path: Path) -> None:
    tree = link_copy(magma_trees["2.6.1"], tmp_path / "src")
    files = recipe_files("2.6.1", "9.0", inspect(str(tree)))
    result = configure(files, tree, stand_in_toolkit, tmp_path)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-4000:]
    assert "GPU_TARGET must contain" not in log
    assert ("CUDA_NVCC_FLAGS: -DHAVE_CUBLAS;-Xfatbin;-compress-all;-Xcompiler;-fPIC;-std=c++11;"
            "-gencode;arch=compute_90,code=sm_90;-DADD_") in log  # the official flags, sm_90 SASS only
    assert "-DMAGMA_CUDA_ARCH_MIN=370" in log and "Found OpenMP" not in log
    assert "-- Generating done" in log
    # only the library is a target: no testers, lapacktest, tester or magma_sparse
    assert make_targets(tree / "build") - {"all", "clean", "depend", "edit_cache", "install", "install/local", "install/strip", "list_install_components",
                                           "rebuild_cache"} == {"lib", "magma"}
    compile_gpu_check(tree, stand_in_toolkit, tmp_path)


@needs_tools
def test_rendered_cmake_configures_real_magma_252_with_the_official_cuda115_flags(
        magma_trees: dict[str, Path], stand_in_toolkit_115: Path, tmp_path: Path) -> None:
    """magma-cuda115 2.5.2: GPU_TARGET=All with CUDA_ARCH_LIST, the gencode list of B release/1.11:magma/Makefile:6,37
    (sm_37 to sm_86, which 2.5.2's own GPU_TARGET table partly lacks), separable compilation off, no OpenMP."""
    tree = link_copy(magma_trees["2.5.2"], tmp_path / "src")
    files = recipe_files("2.5.2", cuda="11.5")
    assert "-DGPU_TARGET=All" in files["build.sh"] and "-DCUDA_ARCH_LIST=$CUDA_ARCH_LIST" in files["build.sh"]
    result = configure(files, tree, stand_in_toolkit_115, tmp_path)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-4000:]
    gencode = ";".join(f"-gencode;arch=compute_{sm},code=sm_{sm}" for sm in ("37", "50", "60", "70", "80", "86"))
    assert f"CUDA_NVCC_FLAGS: -DHAVE_CUBLAS;-Xfatbin;-compress-all;-Xcompiler;-fPIC;-std=c++11;{gencode};-DADD_" in log
    assert "-DMIN_CUDA_ARCH=370" in log and "Found OpenMP" not in log and "GPU_TARGET must contain" not in log
    assert "-- Generating done" in log
    assert "CUDA_VERSION:STRING=11.5" in (tree / "build" / "CMakeCache.txt").read_text()
    # separable compilation on would add FindCUDA's device-link step (magma_intermediate_link.o)
    assert "intermediate_link" not in (tree / "build" / "CMakeFiles" / "magma.dir" / "build.make").read_text()
    assert make_targets(tree / "build") - {"all", "clean", "depend", "edit_cache", "install", "install/local",
                                           "install/strip", "list_install_components", "rebuild_cache"} == {"lib", "magma"}


@needs_tools
def test_unpatched_magma_261_stops_at_gpu_target_for_sm90(magma_trees: dict[str, Path], tmp_path: Path) -> None:
    """Why the cmakelists edit exists: 2.6.1's own GPU_TARGET table ends at sm_80."""
    build = tmp_path / "build"
    build.mkdir()
    result = subprocess.run(["nice", "cmake", str(magma_trees["2.6.1"]), "-DGPU_TARGET=sm_90", "-DUSE_FORTRAN=OFF",
                             f"-DCUDA_TOOLKIT_ROOT_DIR={REAL_CUDA}", "-DCMAKE_POLICY_VERSION_MINIMUM=3.5"],
                            cwd=build, capture_output=True, text=True, check=False)
    assert result.returncode != 0 and "GPU_TARGET must contain one or more of" in result.stderr


@needs_tools
def test_rendered_cmake_configures_real_magma_2100_for_sm90_only(
        magma_trees: dict[str, Path], stand_in_toolkit: Path, tmp_path: Path) -> None:
    tree = link_copy(magma_trees["2.10.0"], tmp_path / "src")
    files = recipe_files("2.10.0", "9.0", inspect(str(tree)))
    result = configure(files, tree, stand_in_toolkit, tmp_path)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-4000:]
    assert "Compile for CMAKE_CUDA_ARCHITECTURES=90-real" in log and "-DMAGMA_CUDA_ARCH_MIN=900" in log
    assert "Found OpenMP" not in log and "LAPACK_LIBRARIES:      \n" in log + "\n"
    assert "NVCCFLAGS:             -Xfatbin -compress-all" in log
    assert "-- Generating done" in log
    cache = (tree / "build" / "CMakeCache.txt").read_text()
    assert "BUILD_SHARED_LIBS:BOOL=OFF" in cache
    compile_gpu_check(tree, stand_in_toolkit, tmp_path)


GPU_CHECK = REPO / "tests" / "gpu" / "magma_gpu_check.c"


def compile_gpu_check(tree: Path, toolkit: Path, tmp_path: Path) -> None:
    """tests/gpu/magma_gpu_check.c (run on a GPU machine by run_gpu_check.sh) compiles against this MAGMA's
    headers and its configured magma_config.h, as an installed package lays them out."""
    result = subprocess.run(["gcc", "-std=c99", "-Wall", "-Werror", "-DADD_", "-c", str(GPU_CHECK), "-o",
                             str(tmp_path / "magma_gpu_check.o"), f"-I{tree / 'include'}", f"-I{tree / 'build' / 'include'}",
                             f"-I{toolkit / 'include'}"], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(("pytorch", "version"), [("2.9.0", "2.6.1"), ("2.13.0", "2.6.1"), ("2.13.0", "2.10.0")])
def test_a_real_tree_gives_the_package_its_own_version(pytorch: str, version: str, magma_trees: dict[str, Path]) -> None:
    """The version comes from the tree, whatever the release would choose (2.13 prefers 2.10.0)."""
    from torchforge.flavours.official.resolve import classify
    from torchforge.flavours.official.resolved import Status
    from torchforge.flavours.official.variant import Options, Request

    options = Options(magma_source=inspect(str(magma_trees[version])))
    variant = classify(Request(pytorch, CUDA, "3.12", "linux-64", options))
    assert variant.status is not Status.REFUSED and variant.magma is not None
    assert variant.magma.filename_stem.startswith(f"magma-cuda130-{version}-")
    chosen_by_release = "2.10.0" if pytorch == "2.13.0" else "2.6.1"
    assert (f"not official: MAGMA {version} from --magma-source instead of {chosen_by_release}" in variant.warnings) \
        is (version != chosen_by_release)
