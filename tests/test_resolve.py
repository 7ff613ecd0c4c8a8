"""Classification rules: every refusal, the official/buildable split, build strings, arch lists, MAGMA plans."""

from __future__ import annotations

import pytest

from torchforge import data as tables
from torchforge.flavours.official.resolve import classify
from torchforge.flavours.official.magmaplan import plan_magma
from torchforge.flavours.official.resolved import Status, build_string
from torchforge.flavours.official.render import plan
from torchforge.flavours.official.variant import Options, Request, Selection


def refusals(request: Request) -> str:
    variant = classify(request)
    assert variant.status is Status.REFUSED, variant
    return "\n".join(variant.refusals)


# ---- refusals ---------------------------------------------------------------------------------------------

def test_arch_newer_than_the_nvcc_window_is_refused() -> None:
    text = refusals(Request("1.8.0", "11.1", "3.8", "linux-64", Options(arch_list="8.0;9.0")))
    assert "GPU arch 9.0 is outside what nvcc 11.1 accepts (3.5 to 8.6)" in text


def test_arch_older_than_the_nvcc_window_is_refused() -> None:
    text = refusals(Request("2.9.0", "13.0", "3.12", "linux-64", Options(arch_list="6.1;8.0")))
    assert "GPU arch 6.1 is outside what nvcc 13.0 accepts (7.5 to 12.1)" in text


def test_arch_9_0_with_cuda_11_0_is_refused() -> None:
    text = refusals(Request("1.8.0", "11.0", "3.8", "linux-64", Options(arch_list="9.0")))
    assert "GPU arch 9.0 is outside what nvcc 11.0 accepts" in text


def test_python_outside_the_release_range_is_refused_with_a_hint() -> None:
    text = refusals(Request("2.5.1", "12.4", "3.8", "linux-64"))
    assert "PyTorch 2.5 supports Python 3.9 to 3.12, not 3.8" in text
    assert "PyTorch 1.4 to 2.4 support Python 3.8" in text


def test_unknown_cuda_lists_the_known_ones() -> None:
    text = refusals(Request("2.5.1", "12.7", "3.12", "linux-64"))
    assert "CUDA 12.7 is not a known toolkit; known: 9.0, 9.2, 10.0, 10.1, 10.2, 11.0" in text and "12.8" in text


def test_unknown_pytorch_lists_the_known_releases() -> None:
    text = refusals(Request("3.0.0", "cpu", "3.12", "linux-64"))
    assert "PyTorch 3.0.0 is not in torchforge's data; known releases: 1.4, 1.5, 1.6, 1.7, 1.8, 1.9" in text


def test_pytorch_2_refuses_cuda_10() -> None:
    assert "requires CUDA 11.0 or newer" in refusals(Request("2.0.0", "10.2", "3.10", "linux-64"))


def test_host_compiler_newer_than_nvcc_allows_is_refused() -> None:
    text = refusals(Request("2.5.1", "11.8", "3.10", "linux-64", Options(gcc="12")))
    assert "nvcc 11.8 accepts GCC 11 at most, not 12" in text


def test_host_compiler_within_the_limit_passes() -> None:
    assert classify(Request("2.5.1", "12.4", "3.10", "linux-64", Options(gcc="12"))).status is Status.OFFICIAL


def test_cxx20_releases_need_a_new_enough_gcc() -> None:
    assert "needs GCC 11.3 or newer" in refusals(Request("2.13.0", "13.0", "3.12", "linux-64", Options(gcc="10.2")))


@pytest.mark.parametrize(
    ("request_", "expected"),
    [
        (Request("1.10.2", "11.3", "3.6", "linux-aarch64", Options(jetson="tx2")), "runs CUDA 10.2, not 11.3"),
        (Request("1.10.2", "10.2", "3.8", "linux-aarch64", Options(jetson="tx2")), "--py 3.6 is required"),
        (Request("1.11.0", "10.2", "3.7", "linux-aarch64", Options(jetson="tx2")), "can run PyTorch 1.10 at most"),
        (Request("2.0.0", "10.2", "3.8", "linux-aarch64", Options(jetson="tx2")), "requires CUDA 11.0 or newer"),
        (Request("1.10.2", "10.2", "3.6", "linux-64", Options(jetson="tx2")), "targets linux-aarch64"),
        (Request("2.1.0", "12.4", "3.8", "linux-aarch64", Options(jetson="xavier")), "runs CUDA 11.4, 11.8"),
    ],
)
def test_jetson_limits(request_: Request, expected: str) -> None:
    assert expected in refusals(request_)


def test_refusals_are_reported_together() -> None:
    variant = classify(Request("2.5.1", "11.8", "3.8", "linux-64", Options(arch_list="12.0", gcc="13")))
    assert len(variant.refusals) == 3


# ---- official / buildable ---------------------------------------------------------------------------------

def test_official_conda_builds_are_official() -> None:
    for request in (Request("2.5.1", "12.4", "3.12", "linux-64"), Request("1.8.0", "11.1", "3.8", "linux-64"),
                    Request("2.5.1", "cpu", "3.11", "linux-64"), Request("2.5.1", "12.4", "3.12", "win-64")):
        assert classify(request).status is Status.OFFICIAL, request


def test_pytorch_113_with_cuda_118_is_buildable_with_the_seed_fixes() -> None:
    variant = classify(Request("1.13.0", "11.8", "3.10", "linux-64"))
    assert variant.status is Status.BUILDABLE
    assert {f.key for f in variant.fixes} == {"pt113-cu118-cpp-extension", "pt113-setup-install-cmdclass"}
    # as every official CUDA 11.x build of 1.8-1.13 (eras.toml build_env), not a fix of its own any more
    assert ("BUILD_SPLIT_CUDA", "ON") in variant.env
    assert variant.cudnn == "8.7.0.84"  # PyTorch 2.0's cuDNN for CUDA 11.8
    assert variant.arch_list == "3.7+PTX;5.0;6.0;6.1;7.0;7.5;8.0;8.6"  # 2.0's list, cut at 1.13's parser limit


def test_releases_beyond_conda_are_buildable_with_the_wheel_arch_list() -> None:
    variant = classify(Request("2.9.0", "12.8", "3.12", "linux-64"))
    assert variant.status is Status.BUILDABLE
    assert variant.arch_list == "7.0;7.5;8.0;8.6;9.0;10.0;12.0"
    assert any("never published as a conda package" in w for w in variant.warnings)


def test_pytorch_2_15_plans_its_default_wheels_cuda_13_2_from_the_wheels_facts() -> None:
    # torch-2.15.0+cu132 on PyPI: nvidia-cudnn-cu13==9.26.0.51, nvidia-nccl-cu13==2.30.7, Requires-Python >=3.11;
    # cuobjdump of its libtorch_cuda.so: sm_75 sm_80 sm_86 sm_90 sm_100 sm_120, no PTX (pytorch.toml cites them)
    variant = classify(Request("2.15.0", "13.2", "3.12", "linux-64"))
    assert variant.status is Status.BUILDABLE
    assert (variant.cudnn, variant.nccl, variant.arch_list) == ("9.26.0.51", "2.30.7", "7.5;8.0;8.6;9.0;10.0;12.0")
    assert variant.build_string == "py3.12_cuda13.2_cudnn9.26.0_0"
    assert not [w for w in variant.warnings if "not known" in w]
    assert "supports Python 3.11 to 3.15, not 3.10" in refusals(Request("2.15.0", "13.2", "3.10", "linux-64"))
    # the wheel's share/cmake/Caffe2/public/cuda.cmake: "PyTorch requires CUDA 12.6 or above."
    assert "requires CUDA 12.6 or newer" in refusals(Request("2.15.0", "12.4", "3.12", "linux-64"))
    # 2.13.0 / 2.14.1 wheels' cuda.cmake: 12.1 / 12.6
    assert "requires CUDA 12.1 or newer" in refusals(Request("2.13.0", "11.8", "3.12", "linux-64"))
    assert classify(Request("2.13.0", "12.4", "3.12", "linux-64")).status is Status.BUILDABLE
    assert "requires CUDA 12.6 or newer" in refusals(Request("2.14.1", "12.4", "3.12", "linux-64"))
    assert "PyTorch 2.15.1 was never released" in refusals(Request("2.15.1", "13.2", "3.12", "linux-64"))


def test_pytorch_2_15_cuda_builds_the_sources_do_not_show_say_what_is_not_known() -> None:
    # Only the default wheel could be read: a CUDA 13.0 plan borrows 2.14's values and says it does not know
    # whether upstream built 2.15 with CUDA 13.0, rather than claiming there was no such build.
    variant = classify(Request("2.15.0", "13.0", "3.12", "linux-64"))
    assert variant.status is Status.BUILDABLE
    assert (variant.cudnn, variant.arch_list) == ("9.24.0.43", "7.5;8.0;8.6;9.0;10.0;12.0")
    unknown = [w for w in variant.warnings if "not known" in w]
    assert any("whether PyTorch 2.15 had an upstream CUDA 13.0 build" in w and "cuDNN 9.24.0.43 as PyTorch 2.14" in w
               for w in unknown), variant.warnings
    assert any("arch list of a PyTorch 2.15 CUDA 13.0 build is not known" in w for w in unknown)
    # a release whose CUDA list is complete still says upstream had no such build
    complete = classify(Request("2.14.1", "12.8", "3.12", "linux-64"))
    assert any("no official PyTorch 2.14 build for CUDA 12.8" in w for w in complete.warnings)
    assert not [w for w in complete.warnings if "not known" in w]


def test_no_known_minimum_gcc_is_a_warning_not_a_silent_pass() -> None:
    variant = classify(Request("2.15.0", "13.2", "3.12", "linux-64", Options(gcc="10.2")))
    assert variant.status is Status.BUILDABLE
    assert any("no minimum GCC for PyTorch 2.15" in w and "PyTorch 2.14 needs GCC 11.3" in w for w in variant.warnings)


def test_custom_arch_list_makes_a_variant_buildable_not_official() -> None:
    variant = classify(Request("2.5.1", "12.4", "3.12", "linux-64", Options(arch_list="8.0;9.0")))
    assert variant.status is Status.BUILDABLE and variant.arch_list == "8.0;9.0"


def test_tegra_arch_on_aarch64_selects_the_jetson_profile() -> None:
    variant = classify(Request("1.10.2", "10.2", "3.6", "linux-aarch64", Options(arch_list="6.2")))
    assert variant.jetson == "tx2"
    env = dict(variant.env)
    assert env["USE_NCCL"] == "0" and env["USE_DISTRIBUTED"] == "0" and env["USE_MAGMA"] == "0"
    assert variant.magma is None
    assert any(f.key == "jetson-thread-count" for f in variant.fixes)


# ---- build strings and MAGMA ------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("3.8", "11.1", "8.0.5.39", 0, "linux-64"), "py3.8_cuda11.1_cudnn8.0.5_0"),
        (("3.11", None, None, 0, "linux-64"), "py3.11_cpu_0"),
        (("3.12", "12.4", "9.1.0.70", 0, "win-64"), "py3.12_cuda12.4_cudnn9_0"),
        # PyTorch <= 1.7 style: the three-part CUDA version (official-builds §1.3)
        (("3.8", "11.0.221", "8.0.5.39", 0, "linux-64"), "py3.8_cuda11.0.221_cudnn8.0.5_0"),
    ],
)
def test_build_string_formula(args: tuple, expected: str) -> None:
    assert build_string(*args) == expected


@pytest.mark.parametrize(
    ("request_", "expected"),
    [  # real upstream package names (official-builds §1.3, MOI table)
        (Request("2.5.1", "12.4", "3.12", "linux-64"), "pytorch-2.5.1-py3.12_cuda12.4_cudnn9.1.0_0"),
        (Request("1.8.0", "11.1", "3.9", "linux-64"), "pytorch-1.8.0-py3.9_cuda11.1_cudnn8.0.5_0"),
        (Request("2.5.1", "cpu", "3.10", "linux-64"), "pytorch-2.5.1-py3.10_cpu_0"),
    ],
)
def test_official_package_names(request_: Request, expected: str) -> None:
    assert classify(request_).filename_stem == expected


def test_magma_is_planned_once_per_cuda_version() -> None:
    selection = Selection.from_flags("2.5.1", "11.8,12.4,cpu", "3.10,3.11,3.12", None, Options())
    render_plan = plan(selection)
    assert [m.filename_stem for m in render_plan.magma] == ["magma-cuda118-2.6.1-1", "magma-cuda124-2.6.1-1"]
    assert render_plan.magma[0].gencode == ("37", "50", "60", "70", "80", "86", "90")


def test_magma_gencode_for_a_cuda_without_an_official_list_is_derived_and_warned() -> None:
    magma = plan_magma(tables.load(), "13.1", "2.6.1", "linux-64")
    assert magma.gencode == ("80", "86", "90", "100", "120")
    assert any("no official magma gencode list for CUDA 13.1" in w for w in magma.warnings)
    # CUDA 13 with MAGMA 2.6.1: the cuda13 edit comes with the other official changes, nothing left to the user
    assert "cuda13.patch" in magma.upstream_patches and not any("--magma-patch" in w for w in magma.warnings)
    assert "-DGPU_TARGET=All" in magma.cmake_options and "-DCUDA_ARCH_LIST=$CUDA_ARCH_LIST" in magma.cmake_options


def test_cuda_without_any_known_cudnn_is_refused() -> None:
    assert "no cuDNN version is known for CUDA 13.1" in refusals(Request("2.9.0", "13.1", "3.12", "linux-64"))


def test_magma_gets_ptx_only_where_the_arch_list_asks() -> None:
    data = tables.load()
    official = plan_magma(data, "12.8", "2.6.1", "linux-64")
    assert "code=compute_" not in official.gencode_flags  # the official lists are SASS only
    asked = plan_magma(data, "13.0", "2.10.0", "linux-64", "8.0;9.0+PTX")
    assert asked.gencode_flags.endswith("-gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90")
    assert "-DCMAKE_CUDA_ARCHITECTURES=80-real;90-real;90-virtual" in asked.cmake_options
