"""torchforge.archcheck: every CUDA library of a package holds SASS for each arch of the list and PTX for the
`+PTX` one, read by torchforge.fatbin from libraries the real nvcc builds here."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.test_build import needs_nvcc
from torchforge import archcheck
from torchforge.errors import AuditFailedError, ExitCode, UsageError
from torchforge.proc import Runner

KERNEL = """
__global__ void add_one(float *x, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] += 1; }
extern "C" void launch(float *x, int n) { add_one<<<(n + 255) / 256, 256>>>(x, n); }
"""


def nvcc_library(folder: Path, name: str, gencode: list[str]) -> Path:
    source = folder / f"{name}.cu"
    source.write_text(KERNEL)
    out = folder / f"lib{name}.so"
    flags = [f for code in gencode for f in ("-gencode", code)]
    subprocess.run(["nvcc", "-shared", "-Xcompiler", "-fPIC", *flags, str(source), "-o", str(out)], check=True,
                   capture_output=True)
    return out


@pytest.fixture(scope="module")
def package_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """lib/ with one sm_90 SASS library, one sm_90 SASS + compute_90 PTX library, and one without device code."""
    tree = tmp_path_factory.mktemp("pkg")
    (tree / "lib").mkdir()
    nvcc_library(tree / "lib", "sass90", ["arch=compute_90,code=sm_90"])
    nvcc_library(tree / "lib", "ptx90", ["arch=compute_90,code=[sm_90,compute_90]"])
    host = tree / "lib" / "host.c"
    host.write_text("int host_only(void) { return 1; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", str(host), "-o", str(tree / "lib" / "libhost.so")], check=True)
    host.unlink()
    for source in (tree / "lib").glob("*.cu"):
        source.unlink()
    return tree


@needs_nvcc
def test_a_library_built_for_the_list_passes(package_tree: Path) -> None:
    assert archcheck.missing_in_tree(package_tree, "9.0") == []


@needs_nvcc
def test_an_arch_the_libraries_lack_is_named_with_each_file(package_tree: Path) -> None:
    found = archcheck.missing_in_tree(package_tree, "9.0;10.0")
    assert [str(m) for m in found] == ["lib/libptx90.so: no SASS for sm_100", "lib/libsass90.so: no SASS for sm_100"]


@needs_nvcc
def test_a_library_copied_in_is_left_out_and_only_that_one(package_tree: Path) -> None:
    """The official pytorch package's cuDNN, NCCL ... are copied from the host, not compiled: their globs leave them
    out of the check, and every other library is still checked."""
    found = archcheck.missing_in_tree(package_tree, "9.0;10.0", exempt=("libsass*.so*",))
    assert [str(m) for m in found] == ["lib/libptx90.so: no SASS for sm_100"]


@needs_nvcc
def test_ptx_is_required_only_for_the_plus_ptx_arch(package_tree: Path) -> None:
    found = archcheck.missing_in_tree(package_tree, "9.0+PTX")
    assert [str(m) for m in found] == ["lib/libsass90.so: no PTX for sm_90"]


@needs_nvcc
def test_a_package_missing_an_arch_fails_the_audit_naming_file_and_arch(package_tree: Path, tmp_path: Path) -> None:
    from conda_package_handling import api

    files = sorted(p.relative_to(package_tree).as_posix() for p in package_tree.rglob("*") if p.is_file())
    (package_tree / "info").mkdir(exist_ok=True)
    (package_tree / "info" / "index.json").write_text('{"name": "vision-like", "version": "1", "build": "0"}')
    artifact = Path(api.create(str(package_tree), [*files, "info/index.json"], "vision-like-1-0.conda",
                               out_folder=str(tmp_path)))
    archcheck.check_package(artifact, "9.0")
    with pytest.raises(AuditFailedError) as caught:
        archcheck.check_package(artifact, "9.0;10.0")
    assert caught.value.exit_code == ExitCode.AUDIT_FAILED
    assert "lib/libsass90.so: no SASS for sm_100" in caught.value.message and caught.value.hint


def test_the_arch_list_is_read_as_torch_cuda_arch_list() -> None:
    assert archcheck.wanted("8.0;9.0a;10.0+PTX") == archcheck.Wanted(frozenset({"sm_80", "sm_90a", "sm_100"}),
                                                                    frozenset({"sm_100"}))
    with pytest.raises(UsageError) as caught:
        archcheck.wanted("9.0;sm_100")
    assert "'sm_100'" in caught.value.message and "8.0;9.0+PTX" in (caught.value.hint or "")


def built_through_the_pipeline(package_tree: Path, tmp_path: Path, arch_list: str):
    """A one-package recipe (rattler-build, the embedded engine) whose build installs the nvcc-built libraries,
    planned with a CUDA arch list and run by the pipeline as any flavour's recipe is."""
    from torchforge import standin
    from torchforge.channels import SiteChannels
    from torchforge.engines.choice import select_engine
    from torchforge.flavours.base import Plan, PlannedRecipe
    from torchforge.pipeline import BuildSettings, Pipeline, plan_steps

    stubs = tmp_path / "stubs"
    standin.make_stub_channel(stubs, ["patchelf"])
    recipe = (f"package:\n  name: vision-like\n  version: '1.0'\nbuild:\n  number: 0\n  string: cuda130_0\n"
              f"  script:\n    - mkdir -p $PREFIX/lib\n    - cp {package_tree}/lib/*.so $PREFIX/lib/\n"
              "requirements:\n  build:\n    - patchelf\n")  # rattler-build relinks with it
    planned = PlannedRecipe("vision-like-1.0-cuda130", "linux-64", ("vision-like-1.0-cuda130_0",),
                            '{"arch": "%s"}' % arch_list, {"recipe.yaml": recipe}, (stubs.as_uri(),), "13.0",
                            arch_list=arch_list)
    settings = BuildSettings(out=tmp_path / "out", site_channels=SiteChannels())
    engine, _ = select_engine("rattler-build")
    (result,) = Pipeline(engine, Runner(), settings).run(plan_steps(Plan("test", (planned,)), settings))
    return result


@needs_nvcc
def test_the_pipeline_publishes_a_cuda_package_that_covers_its_arch_list(package_tree: Path, tmp_path: Path) -> None:
    result = built_through_the_pipeline(package_tree, tmp_path, "9.0")
    assert result.ok, result.error
    assert (tmp_path / "out" / "linux-64" / "vision-like-1.0-cuda130_0.conda").is_file()


@needs_nvcc
def test_the_pipeline_fails_a_cuda_package_missing_an_arch_and_publishes_nothing(package_tree: Path,
                                                                                tmp_path: Path) -> None:
    result = built_through_the_pipeline(package_tree, tmp_path, "9.0;10.0")
    assert not result.ok
    assert "lib/libsass90.so: no SASS for sm_100" in result.error, result.error
    assert not list((tmp_path / "out").glob("linux-64/vision-like-*.conda"))


def test_a_package_without_device_code_passes_any_list(tmp_path: Path) -> None:
    (tmp_path / "lib").mkdir()
    host = tmp_path / "host.c"
    host.write_text("int host_only(void) { return 1; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", str(host), "-o", str(tmp_path / "lib" / "libhost.so")], check=True)
    assert archcheck.missing_in_tree(tmp_path, "9.0;10.0") == []


@needs_nvcc
def test_the_arch_check_needs_no_cuobjdump_and_reads_a_fatbin_outside_nv_fatbin(tmp_path: Path,
                                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The library's fatbin moved to .ldata (objcopy), PATH without any CUDA tool: still read, sm_100 still missing."""
    (tmp_path / "lib").mkdir()
    built = nvcc_library(tmp_path, "sass90", ["arch=compute_90,code=sm_90"])
    subprocess.run(["objcopy", "--rename-section", ".nv_fatbin=.ldata", str(built), str(tmp_path / "lib" / "libk.so")],
                   check=True)
    built.unlink()
    monkeypatch.setenv("PATH", "/nonexistent")
    assert archcheck.missing_in_tree(tmp_path, "9.0") == []
    assert [str(m) for m in archcheck.missing_in_tree(tmp_path, "9.0;10.0")] == ["lib/libk.so: no SASS for sm_100"]


@needs_nvcc
@pytest.mark.parametrize("suffix", [".conda", ".tar.bz2"])
def test_a_package_file_is_read_as_its_unpacked_tree_without_making_its_links(
        package_tree: Path, tmp_path: Path, suffix: str) -> None:
    """The one reader of a package file's device code reads what unpacking shows, and reads a package whose link
    points outside (the GPU machine's stand-in python: bin/python -> the machine's interpreter), which unpacking
    refuses, since it makes no link: the lock's arch reader failed the stack file's GPU run on exactly that."""
    import shutil

    from conda_package_handling import api

    from torchforge.errors import ArchiveError
    from torchforge.safeextract import extract_conda

    tree = tmp_path / "tree"
    shutil.copytree(package_tree, tree, symlinks=True)
    (tree / "bin").mkdir()
    (tree / "bin" / "python").symlink_to("/usr/bin/python3")
    (tree / "info").mkdir(exist_ok=True)
    (tree / "info" / "index.json").write_text('{"name": "python", "version": "3.12", "build": "stub_0"}')
    files = sorted(p.relative_to(tree).as_posix() for p in tree.rglob("*") if p.is_file() or p.is_symlink())
    artifact = Path(api.create(str(tree), files, f"python-3.12-stub_0{suffix}", out_folder=str(tmp_path)))
    read = archcheck.package_device_code(artifact)
    assert sorted(read) == ["lib/libptx90.so", "lib/libsass90.so"]
    assert read == archcheck.tree_device_code(tree)
    assert (read["lib/libptx90.so"].sass, read["lib/libptx90.so"].ptx) == ({"sm_90"}, {"sm_90"})
    only = archcheck.package_device_code(artifact, include=lambda name: name.endswith("sass90.so"))
    assert sorted(only) == ["lib/libsass90.so"]
    with pytest.raises(ArchiveError, match="outside its folder"):
        extract_conda(artifact, tmp_path / "unpacked")
