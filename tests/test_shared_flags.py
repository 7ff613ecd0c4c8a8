"""One validation of the flags both flavours share (issue 34 items 13 and 14): the same input gives the same exit
code and message in the official and the conda-forge flavour, the spellings docs/custom-builds.md calls one arch
list are one list in both, and the flavour line is printed only for a request that passed it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from torchforge.cli import main
from torchforge.errors import ExitCode
from torchforge.sharedflags import MAX_BUILD_NUMBER

# Each flavour's release and CUDA for which it has facts (conda-forge: the feedstock's CUDA 13.0 job).
FLAVOURS = {
    "official": ["--flavour", "official", "--pytorch", "2.9.0", "--cuda", "12.8", "--py", "3.12"],
    "conda-forge": ["--flavour", "conda-forge", "--pytorch", "2.13.0", "--cuda", "13.0", "--py", "3.12"],
}
USAGE, REFUSED = int(ExitCode.USAGE), int(ExitCode.REFUSED)
# (flags added to (or replacing) the flavour's selection, exit code, the error line both flavours print)
BAD = [
    (["--arch-list", "sm_90"], USAGE, "error: --arch-list 'sm_90': 'sm_90' is not an arch value"),
    (["--arch-list", "8.0;sm_90;compute_90"], USAGE,
     "error: --arch-list '8.0;sm_90;compute_90': 'sm_90', 'compute_90' are not an arch value"),
    (["--arch-list", "9.0+ptx"], USAGE, "error: --arch-list '9.0+ptx': '9.0+ptx' is not an arch value"),
    (["--arch-list", ";;"], USAGE, "error: --arch-list is empty"),
    (["--build-number", str(MAX_BUILD_NUMBER + 1)], USAGE,
     f"error: --build-number {MAX_BUILD_NUMBER + 1} is outside what the engines accept (0 to {MAX_BUILD_NUMBER})"),
    (["--py", "3"], USAGE, "error: --py expects X.Y, got '3'"),
    (["--cuda", "13"], USAGE, "error: --cuda expects X.Y or cpu, got '13'"),
    (["--cuda", ""], USAGE, "error: --cuda is empty"),
    (["--platform", "solaris-64"], USAGE, "error: unknown platform 'solaris-64'"),
    (["--pytorch", "2.13"], USAGE, "error: --pytorch expects a release version X.Y.Z, got '2.13'"),
    (["--pytorch", "9.9.9"], REFUSED, "error: PyTorch 9.9.9 is not in torchforge's data; known releases: 1.4,"),
    (["--pytorch", "2.9.7"], REFUSED, "error: PyTorch 2.9.7 was never released; 2.9 had 2.9.0, 2.9.1"),
]


def _replace(selection: list[str], extra: list[str]) -> list[str]:
    """The selection with `extra`'s flags in place of its own."""
    given = dict(zip(selection[::2], selection[1::2]))
    given.update(zip(extra[::2], extra[1::2]))
    return [part for pair in given.items() for part in pair]


@pytest.mark.parametrize("command", ["matrix", "render", "build"])
@pytest.mark.parametrize(("extra", "code", "message"), BAD, ids=[" ".join(b[0]) for b in BAD])
def test_both_flavours_refuse_a_bad_shared_flag_alike_before_the_flavour_line(
        command: str, extra: list[str], code: int, message: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    seen = {}
    for flavour, selection in FLAVOURS.items():
        out = tmp_path / flavour
        argv = [command, *_replace(selection, extra), *(["--out", str(out)] if command != "matrix" else [])]
        assert main(argv) == code, capsys.readouterr().err
        captured = capsys.readouterr()
        err = captured.err
        assert err.startswith("error: "), err  # nothing before the error: no flavour line, no plan
        assert captured.out == "" and not out.exists()
        seen[flavour] = err
    assert message in seen["official"] and seen["official"] == seen["conda-forge"]


def _matrix(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[list[dict[str, object]], str]:
    assert main(["matrix", "--json", *argv]) == 0, capsys.readouterr().err
    captured = capsys.readouterr()
    return json.loads(captured.out), captured.err


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_the_spellings_of_one_arch_list_are_one_list_in_both_flavours(
        flavour: str, capsys: pytest.CaptureFixture[str]) -> None:
    plans = {spelling: _matrix(capsys, *FLAVOURS[flavour], "--arch-list", spelling)[0]
             for spelling in ("8.0;9.0", "9.0;8.0", "8.0;;9.0", "8.0 9.0", "8.0;9.0;;", " 9.0  8.0 ;8.0")}
    first = plans["8.0;9.0"]
    assert [row["arch_list"] for row in first if "arch_list" in row] in (["8.0;9.0"], ["8.0;9.0", "8.0;9.0"])
    assert all(plan == first for plan in plans.values()), plans


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_an_arch_nvcc_does_not_build_is_refused_alike(flavour: str, capsys: pytest.CaptureFixture[str]) -> None:
    selection = _replace(FLAVOURS[flavour], ["--cuda", "13.0", "--pytorch", "2.13.0"])
    assert main(["matrix", "--json", *selection, "--arch-list", "3.5;9.0"]) == REFUSED
    captured = capsys.readouterr()
    # the official flavour lists the refused variant (its JSON row), conda-forge refuses the recipe
    said = [r for row in json.loads(captured.out) for r in row.get("refusals", ())] if captured.out else \
        [captured.err.split("error: ", 1)[1].strip()]
    assert said == ["GPU arch 3.5 is outside what nvcc 13.0 accepts (7.5 to 12.1); drop it from --arch-list or "
                    "choose a CUDA whose nvcc supports it"]


def test_a_build_number_the_conda_forge_offsets_push_past_the_engines_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The official flavour builds what --build-number says; conda-forge's package adds the feedstock's number and
    its CUDA and MKL offsets, so its largest --build-number is smaller and says which."""
    assert main(["matrix", *FLAVOURS["official"], "--build-number", str(MAX_BUILD_NUMBER)]) == 0
    capsys.readouterr()
    code = main(["render", *FLAVOURS["conda-forge"], "--build-number", str(MAX_BUILD_NUMBER),
                 "--out", str(tmp_path / "out")])
    err = " ".join(capsys.readouterr().err.split())
    assert code == USAGE and "more than the engines accept" in err and not (tmp_path / "out").exists()
    largest = int(err.split("what would work: give --build-number ")[1].split()[0])
    rows, _ = _matrix(capsys, *FLAVOURS["conda-forge"], "--build-number", str(largest))
    assert rows[0]["build_number"] == MAX_BUILD_NUMBER
    assert main(["matrix", *FLAVOURS["conda-forge"], "--build-number", str(largest + 1)]) == USAGE


@pytest.mark.parametrize(("argv", "line"), [
    (["--pytorch", "2.5.1", "--cuda", "cpu"], "flavour official: PyTorch 2.5.1 published official conda packages"),
    (["--pytorch", "2.13.0", "--cuda", "cpu"], "flavour conda-forge: PyTorch 2.13.0 published no official conda"),
])
def test_the_flavour_line_comes_for_a_valid_request(argv: list[str], line: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    _, err = _matrix(capsys, *argv)
    assert err.startswith(line)
