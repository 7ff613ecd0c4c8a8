"""CEP 46 `__cuda_arch` install guard: every CUDA package torchforge builds says, from the device code really in it,
on which GPUs it runs, as a run constraint (binding only where a solver sees `__cuda_arch`); real py-rattler solves
take or refuse it. Libraries built here by the real nvcc 13.0 (tests/nvcc_libraries.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.nvcc_libraries import nvcc_libraries  # noqa: F401 (fixture)
from tests.rattler_in_child import Unsolvable, solve
from tests.test_build import needs_nvcc
from tests.test_verify_python import forge
from torchforge import cudaarch, fatbin, localchannel


def test_sass_runs_on_its_major_from_its_minor_and_ptx_on_everything_newer() -> None:
    assert cudaarch.runs_on({"sm_90"}, ()) == [((9, 0), (10, 0))]
    assert cudaarch.runs_on({"sm_80", "sm_86"}, ()) == [((8, 0), (9, 0))]
    assert cudaarch.runs_on({"sm_90a"}, ()) == [((9, 0), (9, 1))]
    assert cudaarch.runs_on({"sm_80", "sm_90"}, {"sm_90"}) == [((8, 0), cudaarch._NEVER)]
    assert cudaarch.runs_on({"sm_75", "sm_100"}, ()) == [((7, 5), (8, 0)), ((10, 0), (11, 0))]


@needs_nvcc
@pytest.mark.parametrize(("libraries", "expected"), [
    (["sass90"], "__cuda_arch >=9.0,<10.0"),
    (["sass86"], "__cuda_arch >=8.6,<9.0"),
    (["ptx80"], "__cuda_arch >=8.0"),
    (["sass90_ptx90"], "__cuda_arch >=9.0"),
    (["several_plain"], "__cuda_arch >=8.0"),  # sm_80, sm_90, sm_100 SASS and compute_90 PTX
    (["arch90a"], "__cuda_arch >=9.0"),  # -arch=sm_90a also embeds compute_90 PTX (tests/test_fatbin.py)
    # a package runs where one of its libraries has code (cuFFT 12.0.0.61: libcufftw.so.12 holds one sm_75 cubin,
    # libcufft.so.12 sm_75 to sm_120; "every library" gave it >=7.5,<8.0 on the H200)
    (["several_plain", "sass90"], "__cuda_arch >=8.0"),
    (["sass86", "sass90"], "__cuda_arch >=8.6,<10.0"),
    (["sass86", "ptx80"], "__cuda_arch >=8.0"),
])
def test_the_constraint_is_read_from_the_device_code(libraries: list[str], expected: str | None,
                                                     nvcc_libraries: Path) -> None:
    assert cudaarch.spec(fatbin.read(nvcc_libraries / f"lib{name}.so") for name in libraries) == expected


@pytest.fixture(scope="module")
def built(nvcc_libraries: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two CUDA packages built through the pipeline with the arch list 9.0 (the arch check passes both): one of
    sm_90 SASS only, one with compute_90 PTX too ("9.0+PTX"); each in a channel of its own."""
    from tests.test_archcheck import built_through_the_pipeline

    channels = {}
    for name, library, arch_list in (("sm90", "sass90", "9.0"), ("sm90ptx", "sass90_ptx90", "9.0+PTX")):
        work = tmp_path_factory.mktemp(name)
        (work / "tree" / "lib").mkdir(parents=True)
        (work / "tree" / "lib" / f"lib{library}.so").write_bytes((nvcc_libraries / f"lib{library}.so").read_bytes())
        assert built_through_the_pipeline(work / "tree", work, arch_list).ok
        channels[name] = work / "out"
    return channels


@needs_nvcc
def test_a_built_cuda_package_carries_the_constraint_of_its_code(built: dict[str, Path]) -> None:
    for name, expected in (("sm90", "__cuda_arch >=9.0,<10.0"), ("sm90ptx", "__cuda_arch >=9.0")):
        (package,) = (built[name] / "linux-64").glob("vision-like-*.conda")
        assert localchannel.info_json(package, "index.json")["constrains"] == [expected]
        listed = json.loads((built[name] / "linux-64" / "repodata.json").read_text())["packages.conda"]
        assert [r["constrains"] for r in listed.values()] == [[expected]]  # the channel's index says it too


@needs_nvcc
@pytest.mark.parametrize(("package", "virtual", "installs"), [
    ("sm90", {"__cuda": "13.0", "__cuda_arch": "9.0"}, True),
    ("sm90", {}, True),  # no GPU seen (a CPU runner): the constraint does not bind
    ("sm90", {"__cuda": "13.0"}, True),  # a driver but no __cuda_arch (a solver without CEP 46)
    ("sm90", {"__cuda": "13.0", "__cuda_arch": "8.0"}, False),
    ("sm90", {"__cuda": "13.0", "__cuda_arch": "10.0"}, False),
    ("sm90ptx", {"__cuda": "13.0", "__cuda_arch": "10.0"}, True),  # the driver compiles its PTX for 10.0
    ("sm90ptx", {"__cuda": "13.0", "__cuda_arch": "8.6"}, False),
])
def test_a_py_rattler_solve_takes_or_refuses_the_package(package: str, virtual: dict[str, str], installs: bool,
                                                         built: dict[str, Path], tmp_path: Path) -> None:
    if installs:
        (record,) = solve([built[package]], ["vision-like"], virtual=virtual, cache=tmp_path)
        assert record.name == "vision-like"
        return
    with pytest.raises(Unsolvable) as refused:
        solve([built[package]], ["vision-like"], virtual=virtual, cache=tmp_path)
    text = " ".join(str(refused.value).split())
    assert "vision-like" in text and f"__cuda_arch {virtual['__cuda_arch']}" in text, text
    assert (">=9.0,<10.0" if package == "sm90" else ">=9.0") in text, text


@needs_nvcc
@pytest.mark.parametrize(("arch", "installs"), [("9.0", True), ("8.0", False), ("", True)])
def test_install_says_the_cuda_arch_it_saw_and_refuses_a_package_for_another_gpu(
        arch: str, installs: bool, built: dict[str, Path], tmp_path: Path) -> None:
    """Through `torchforge install`, with py-rattler 0.28's own override: CONDA_OVERRIDE_CUDA_ARCH (read by
    VirtualPackageOverrides.from_env(), which has no keyword for it) with CONDA_OVERRIDE_CUDA (CEP 46: without
    __cuda there is no __cuda_arch). An empty value is "no GPU"."""
    env = {"CONDA_OVERRIDE_CUDA": "13.0" if arch else "", "CONDA_OVERRIDE_CUDA_ARCH": arch}
    result = forge("install", "vision-like", "--channel", str(built["sm90"]), "--prefix", str(tmp_path / "env"),
                   cwd=tmp_path, env=env)
    text = " ".join(result.stderr.split())
    if installs:
        assert (f"__cuda_arch {arch}: packages built for other GPUs are refused" if arch else
                "__cuda_arch absent (no GPU seen)") in text, text
        assert result.returncode == 0, text
        assert (tmp_path / "env" / "conda-meta").is_dir()
    else:
        assert result.returncode == 2, text
        assert "vision-like" in text and "__cuda_arch >=9.0,<10.0" in text and "Traceback" not in text, text
        assert "does not run on this GPU" in text and "CONDA_OVERRIDE_CUDA_ARCH" in text, text
        assert f"(the solve saw __cuda_arch {arch})" in text, text
        assert not (tmp_path / "env").exists()


@needs_nvcc
def test_a_repacked_cuda_package_carries_the_constraint_of_its_code(nvcc_libraries: Path, tmp_path: Path) -> None:
    """A CUDA 13 stack of stand-in wheels whose nvidia-cufft wheel holds an nvcc-built library with its sm_90
    cubins in .ldata (as the real libcufft.so.12 does): its repacked package says __cuda_arch >=9.0,<10.0; the
    packages without device code say nothing about __cuda_arch."""
    from tests.standin_stack import PYTAG, Factory, Lib, write_wheel
    from tests.test_repack_stack import TOOLKIT_13
    from torchforge.binaries.plan import CudaLibs
    from torchforge.binaries.stack import repack_stack
    from torchforge.proc import Runner

    f = Factory(tmp_path)
    common = {"nvidia/__init__.py": b"", "nvidia/cu13/__init__.py": b""}
    tag = "py3-none-manylinux2014_x86_64"
    cufft = (nvcc_libraries / "libin_ldata.so").read_bytes()
    wheels = [
        write_wheel(tmp_path, "nvidia_cuda_runtime", "13.0.96", tag,
                    {**common, "nvidia/cu13/lib/libcudart.so.13": f.lib(Lib("libcudart.so.13"))}, []),
        write_wheel(tmp_path, "nvidia_cufft", "12.0.0.61", tag, {**common, "nvidia/cu13/lib/libcufft.so.12": cufft}, []),
        write_wheel(tmp_path, "cuda_toolkit", "13.0.2", "py2.py3-none-any", {}, TOOLKIT_13),
        write_wheel(tmp_path, "torch", "2.11.0", f"{PYTAG}-{PYTAG}-manylinux_2_28_x86_64",
                    {"torch/version.py": b"__version__ = '2.11.0+cu130'\ncuda = '13.0'\n",
                     "torch/lib/libtorch_cuda.so": f.lib(Lib("libtorch_cuda.so", ("libcudart.so.13",),
                                                             "$ORIGIN/../../nvidia/cu13/lib"))},
                    ['cuda-toolkit[cudart]==13.0.2; platform_system == "Linux"', "nvidia-cufft==12.0.0.61"]),
    ]
    repack_stack(wheels, tmp_path / "chan", Runner(), mode=CudaLibs.WHEELS)
    listed = json.loads((tmp_path / "chan" / "linux-64" / "repodata.json").read_text())["packages.conda"]
    constraints = {r["name"]: [c for c in r.get("constrains", []) if c.startswith("__cuda_arch")] for r in listed.values()}
    assert constraints.get("nvidia-cufft") == ["__cuda_arch >=9.0,<10.0"], constraints
    assert constraints["pytorch"] == constraints["nvidia-cuda-runtime"] == [], constraints
