"""Each seed's real request (../shared/seeds) and the default release: what torchforge plans, renders or refuses.

000: PyTorch 1.8.0 for CUDA 11.0 / Python 3.8 (conda); 001: 1.12.1 debug with CUDA 11.7; 002: 2.0 with CUDA 11.7
on Windows; 003: 1.1.0 as a wheel on a Jetson TX2 with JetPack 3.3 (CUDA 9.0, Python 3.5); 004: 1.13.0 with CUDA 11.8.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from torchforge import data as tables
from torchforge.cli import main
from torchforge.flavours.official.resolve import classify, default_release
from torchforge.flavours.official.magmaplan import plan_magma
from torchforge.flavours.official.resolved import Status
from torchforge.flavours.official.variant import Options, Request, Selection


def _matrix(capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[int, dict[str, dict], str]:
    code = main(["matrix", *flags, "--json"])
    captured = capsys.readouterr()
    return code, {row["id"]: row for row in json.loads(captured.out)}, captured.err


# ---- the default release --------------------------------------------------------------------------------------

def test_build_cuda_11_0_py38_plans_pytorch_1_7_1_and_says_why_first(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["build", "--cuda", "11.0", "--py", "3.8", "--dry-run", "--out", str(tmp_path / "ch")]) == 0
    captured = capsys.readouterr()
    flavour, first = captured.err.strip().splitlines()[:2]
    assert flavour.startswith("flavour official: no --pytorch given")  # which shape, and why, before the release
    assert first == "PyTorch 1.7.1: the newest release with official conda packages of CUDA 11.0 with Python 3.8 on linux-64"
    assert "pytorch-1.7.1-py3.8_cuda11.0.221_cudnn8.0.5_0" in captured.err
    assert "magma-cuda110-2.5.2-1" in captured.err


def test_default_release_falls_back_to_the_newest_that_can_build() -> None:
    version, reason = default_release(Selection("2.5.1", ("12.8",), ("3.12",), "linux-64"))
    # newest among the releases whose CUDA builds the data knows in full (2.15: only its default wheel's)
    complete = [k for k, r in tables.load().pytorch.releases.items() if r.cuda_incomplete is None]
    newest = max(complete, key=lambda k: tuple(map(int, k.split("."))))
    assert version.startswith(newest + ".")
    assert "no release published official conda packages of CUDA 12.8" in reason
    assert classify(Request(version, "12.8", "3.12", "linux-64")).status is Status.BUILDABLE


def test_default_release_of_the_embedded_default_selection_is_the_last_conda_release() -> None:
    defaults = tables.load().pytorch.defaults
    selection = Selection(defaults.pytorch, defaults.cuda, defaults.python, defaults.platform)
    assert default_release(selection)[0] == defaults.pytorch


def test_default_release_prefers_a_release_whose_cuda_build_is_known() -> None:
    # 2.15.0's CUDA 13.2 wheel was read; whether 2.15 had a CUDA 12.6 build is not known, so 12.6 gets 2.14.1
    # (whose CUDA 12.6 wheel is in the data) rather than a 2.15 plan made of 2.14's values.
    assert default_release(Selection("2.5.1", ("13.2",), ("3.12",), "linux-64"))[0] == "2.15.0"
    assert default_release(Selection("2.5.1", ("12.6",), ("3.12",), "linux-64"))[0] == "2.14.1"
    # Python 3.10: 2.15 has no cp310 wheel (Requires-Python >=3.11)
    assert default_release(Selection("2.5.1", ("13.2",), ("3.10",), "linux-64"))[0] == "2.14.1"


def test_default_release_for_cuda_10_1_and_python_3_8_is_1_8_1() -> None:
    # 1.8 was the last release with CUDA 10.1 conda packages (1.8.1 its newest patch).
    assert default_release(Selection("2.5.1", ("10.1",), ("3.8",), "linux-64"))[0] == "1.8.1"


# ---- seed 000: PyTorch 1.8.0, CUDA 11.0, Python 3.8 ----------------------------------------------------------

def test_seed_000_renders_with_the_facts_of_the_nearest_official_cuda_11_0_build(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, rows, _ = _matrix(capsys, "--pytorch", "1.8.0", "--cuda", "11.0", "--py", "3.8")
    assert code == 0
    row = rows["pytorch-1.8.0-cu110-py38-linux_64"]
    assert row["status"] == "buildable"
    # The seed's py3.8_cuda11.0.221_cudnn8.0.5_0 came from a builder checkout of 2021-01-28; the scripts 1.8.0
    # shipped with (builder 8c82f759, after 792e9358 of 2021-02-10) name CUDA as X.Y, so torchforge does too.
    assert row["build_string"] == "py3.8_cuda11.0_cudnn8.0.5_0"
    assert row["cudnn"] == "8.0.5" and row["arch_list"] == "3.7+PTX;5.0;6.0;6.1;7.0;7.5;8.0"
    assert rows["magma-cuda110-2.5.2-linux_64"]["status"] == "official"
    assert main(["render", "--pytorch", "1.8.0", "--cuda", "11.0", "--py", "3.8", "--out", str(tmp_path / "r")]) == 0
    meta = (tmp_path / "r" / "pytorch-1.8.0-cu110-py38-linux_64" / "meta.yaml").read_text()
    assert "cudatoolkit >=11.0,<11.0.221" in meta and "magma-cuda110 ==2.5.2" in meta


def test_arch_list_hint_is_accepted_by_the_own_check() -> None:
    refused = classify(Request("1.8.0", "11.2", "3.8", "linux-64"))
    hint = next(r for r in refused.refusals if "no arch list is known" in r)
    arch_list = re.search(r"e\.g\. '([^']+)'", hint)
    assert arch_list, hint
    again = classify(Request("1.8.0", "11.2", "3.8", "linux-64", Options(arch_list=arch_list[1])))
    assert not [r for r in again.refusals if "arch" in r], again.refusals


def test_sources_that_predate_a_cuda_major_are_refused_with_the_reason() -> None:
    for cuda in ("12.4", "13.0"):
        variant = classify(Request("1.8.0", cuda, "3.8", "linux-64"))
        assert variant.status is Status.REFUSED
        assert f"PyTorch 1.8's sources predate CUDA {cuda.split('.')[0]}" in "; ".join(variant.refusals)


def test_magma_is_official_only_where_upstream_published_it() -> None:
    data = tables.load()
    assert not plan_magma(data, "12.4", "2.5.2", "linux-64").published
    assert not plan_magma(data, "13.0", "2.5.2", "linux-64").published
    assert plan_magma(data, "11.0", "2.5.2", "linux-64").published
    assert plan_magma(data, "12.4", "2.6.1", "linux-64").published
    assert "magma-cuda124 2.5.2 was never published" in " ".join(plan_magma(data, "12.4", "2.5.2", "linux-64").warnings)


# ---- seeds 001, 002, 004 --------------------------------------------------------------------------------------

def test_seed_001_pytorch_1_12_1_debug_with_cuda_11_7(capsys: pytest.CaptureFixture[str]) -> None:
    code, rows, _ = _matrix(capsys, "--pytorch", "1.12.1", "--cuda", "11.7", "--py", "3.9", "--debug")
    assert code == 0
    row = rows["pytorch-1.12.1-cu117-py39-linux_64-debug"]
    assert row["status"] == "buildable"
    assert "not official: debug build" in row["warnings"]
    assert "not official: PyTorch 1.12 had no official conda build for CUDA 11.7" in row["warnings"]
    assert "debug" in row["build_string"] and row["build_string"].endswith("_0")


def test_seed_002_pytorch_2_0_with_cuda_11_7_on_windows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, rows, _ = _matrix(capsys, "--pytorch", "2.0.1", "--cuda", "11.7", "--py", "3.10", "--platform", "win-64")
    assert code == 0
    row = rows["pytorch-2.0.1-cu117-py310-win_64"]
    assert (row["status"], row["build_string"], row["magma"]) == ("official", "py3.10_cuda11.7_cudnn8_0", None)
    assert main(["render", "--pytorch", "2.0.1", "--cuda", "11.7", "--py", "3.10", "--platform", "win-64",
                 "--out", str(tmp_path / "r")]) == 0
    assert (tmp_path / "r" / "pytorch-2.0.1-cu117-py310-win_64" / "bld.bat").is_file()


def test_seed_004_pytorch_1_13_0_with_cuda_11_8_applies_the_fixes(capsys: pytest.CaptureFixture[str]) -> None:
    code, rows, _ = _matrix(capsys, "--pytorch", "1.13.0", "--cuda", "11.8", "--py", "3.10")
    assert code == 0
    row = rows["pytorch-1.13.0-cu118-py310-linux_64"]
    assert row["status"] == "buildable"
    assert any("pt113-setup-install-cmdclass" in w for w in row["warnings"])
    # The seed's BUILD_SPLIT_CUDA=1: every official CUDA 11.x build of 1.8-1.13 had it (eras.toml build_env).
    from torchforge.flavours.official.resolve import classify
    from torchforge.flavours.official.variant import Request

    assert ("BUILD_SPLIT_CUDA", "ON") in classify(Request("1.13.0", "11.8", "3.10", "linux-64")).env


# ---- seed 003: PyTorch 1.1.0 wheel on a TX2 with JetPack 3.3 -------------------------------------------------

def test_seed_003_is_refused_with_the_newest_release_a_tx2_on_jetpack_3_3_can_build() -> None:
    variant = classify(Request("1.1.0", "9.0", "3.5", "linux-aarch64", Options(jetson="tx2_jp33")))
    assert variant.status is Status.REFUSED
    text = "; ".join(variant.refusals)
    assert "PyTorch 1.1.0 predates torchforge's data (its oldest release is 1.4" in text
    assert "Jetson TX2 (JetPack 3.3: CUDA 9.0, Python 3.5) can build PyTorch 1.5 at most; use --pytorch 1.5.1" in text


def test_the_release_seed_003_is_pointed_to_renders_for_the_tx2(tmp_path: Path) -> None:
    request = Request("1.5.1", "9.0", "3.5", "linux-aarch64", Options(jetson="tx2_jp33"))
    variant = classify(request)
    assert variant.status is Status.BUILDABLE, variant.refusals
    env = dict(variant.env)
    assert env["TORCH_CUDA_ARCH_LIST"] == "6.2" and env["USE_NCCL"] == "0" and env["USE_MAGMA"] == "0"
    assert variant.build_string == "py3.5_cuda9.0.176_cudnn7.1.5_0"
    assert main(["render", "--pytorch", "1.5.1", "--cuda", "9.0", "--py", "3.5", "--platform", "linux-aarch64",
                 "--jetson", "tx2_jp33", "--out", str(tmp_path / "r")]) == 0


def test_python_outside_the_jetpack_is_refused_for_the_tx2_on_jetpack_3_3() -> None:
    variant = classify(Request("1.5.1", "9.0", "3.6", "linux-aarch64", Options(jetson="tx2_jp33")))
    assert "ships Python 3.5; no other CPython exists there, so --py 3.5 is required" in "; ".join(variant.refusals)


# ---- 1.4 - 1.7 refusals --------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("request_", "reason"),
    [
        (Request("1.7.5", "11.0", "3.8", "linux-64"), "PyTorch 1.7.5 was never released; 1.7 had 1.7.0, 1.7.1"),
        (Request("1.7.0", "11.0", "3.9", "linux-64"), "PyTorch 1.7.0 supports Python 3.6 to 3.8, not 3.9"),
        (Request("1.5.1", "10.2", "3.5", "win-64"), "PyTorch 1.5 supports Python 3.6 to 3.8 on win-64, not 3.5"),
        (Request("1.6.0", "11.0", "3.8", "linux-64"), "PyTorch 1.6's sources predate CUDA 11 (its newest upstream build is CUDA 10.2)"),
    ],
)
def test_old_release_refusals(request_: Request, reason: str) -> None:
    variant = classify(request_)
    assert variant.status is Status.REFUSED and reason in "; ".join(variant.refusals), variant.refusals


def test_1_7_0_and_1_7_1_differ_in_cudnn_and_cuda_10_0_was_linux_only() -> None:
    assert classify(Request("1.7.0", "11.0", "3.8", "linux-64")).build_string == "py3.8_cuda11.0.221_cudnn8.0.3_0"
    assert classify(Request("1.7.1", "11.0", "3.8", "linux-64")).build_string == "py3.8_cuda11.0.221_cudnn8.0.5_0"
    windows = classify(Request("1.4.0", "10.0", "3.7", "win-64"))
    assert windows.status is Status.BUILDABLE
    assert any("built for linux-64 only" in w for w in windows.warnings)
