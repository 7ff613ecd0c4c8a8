"""The command line: exit codes, --json output, errors that say what would work."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from torchforge.cli import main


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("torchforge ")


def test_matrix_json_lists_variants_and_magma(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["matrix", "--cuda", "11.8,cpu", "--py", "3.10", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    by_id = {row["id"]: row for row in rows}
    assert by_id["pytorch-2.5.1-cu118-py310-linux_64"]["build_string"] == "py3.10_cuda11.8_cudnn9.1.0_0"
    assert by_id["pytorch-2.5.1-cu118-py310-linux_64"]["magma"] == "magma-cuda118"
    assert by_id["magma-cuda118-2.6.1-linux_64"]["gencode"] == ["37", "50", "60", "70", "80", "86", "90"]
    assert by_id["pytorch-2.5.1-cpu-py310-linux_64"]["status"] == "official"


def test_matrix_shows_refused_variants_and_exits_non_zero(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["matrix", "--pytorch", "2.5.1", "--cuda", "12.4", "--py", "3.8,3.12"]) == 4
    output = capsys.readouterr().out
    assert "refused" in output and "official" in output


def test_render_refusal_exit_code_and_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["render", "--cuda", "13.0", "--py", "3.12", "--pytorch", "2.9.0", "--arch-list", "6.1", "--out", str(tmp_path / "r")])
    assert code == 4
    err = capsys.readouterr().err
    assert "GPU arch 6.1 is outside what nvcc 13.0 accepts" in err and "what would work" in err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cuda", "eleven"], "--cuda expects X.Y or cpu"),
        (["--py", "3"], "--py expects X.Y"),
        (["--pytorch", "2.5"], "--pytorch expects a release version X.Y.Z"),
        (["--platform", "osx-32"], "unknown platform 'osx-32'"),
        (["--env", "USE NCCL"], "--env expects NAME=VALUE"),
    ],
)
def test_usage_errors(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["matrix", *args]) == 2
    assert message in capsys.readouterr().err


def test_render_default_writes_magma_before_pytorch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["render", "--out", str(tmp_path), "--format", "rattler-build"]) == 0
    lines = capsys.readouterr().out.split()
    assert lines[0].endswith("magma-cuda118-2.6.1-linux_64") and lines[1].endswith("magma-cuda124-2.6.1-linux_64")
    assert len(lines) == 8 and all((Path(p) / "recipe.yaml").is_file() for p in lines)


def test_unknown_option_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["render", "--bogus"]) == 2
    assert "No such option: --bogus" in capsys.readouterr().err


def test_error_text_with_brackets_is_printed_verbatim(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "[red]x"  # rich would swallow "[red]" as markup if the message were not escaped
    (out / "pytorch-2.5.1-cpu-py311-linux_64").mkdir(parents=True)
    assert main(["render", "--cuda", "cpu", "--py", "3.11", "--out", str(out)]) == 2
    assert f"already exist in {out}" in capsys.readouterr().err
