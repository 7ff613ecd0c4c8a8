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
    code = main(["render", "--cuda", "13.0", "--py", "3.12", "--pytorch", "2.9.0", "--flavour", "official", "--arch-list", "6.1", "--out", str(tmp_path / "r")])
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


MAGMA_LIKE = Path(__file__).parent / "fixtures" / "magma_like"  # its include/magma_types.h says 2.10.0


def test_a_magma_source_of_a_version_the_pytorch_release_rejects_is_refused(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["render", "--pytorch", "2.9.0", "--flavour", "official", "--cuda", "13.0", "--py", "3.12", "--magma-source", str(MAGMA_LIKE),
                 "--out", str(tmp_path / "out")])
    assert code == 4
    err = capsys.readouterr().err
    assert f"--magma-source {MAGMA_LIKE} is MAGMA 2.10.0 (its tree's include/magma_types.h)" in err
    assert "PyTorch 2.9's source rejects MAGMA 2.10.0" in err and "pass a MAGMA 2.6.1 source" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kind", ["missing", "not-magma", "no-version"])
def test_a_magma_source_whose_version_cannot_be_read_is_a_usage_error(kind: str, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "magma"
    if kind != "missing":
        (source / "include").mkdir(parents=True)
    if kind == "no-version":
        (source / "include" / "magma_types.h").write_text("#define MAGMA_VERSION_MAJOR 2\n")
    code = main(["render", "--pytorch", "2.9.0", "--flavour", "official", "--cuda", "13.0", "--magma-source", str(source), "--out", str(tmp_path / "o")])
    assert code == 2
    err = capsys.readouterr().err
    expected = {"missing": "does not exist", "not-magma": "has no include/magma_types.h: it is not a MAGMA source tree",
                "no-version": "does not define MAGMA_VERSION_MAJOR, _MINOR and _MICRO"}[kind]
    assert expected in err


def test_magma_patches_go_to_magma_recipes_only(tmp_path: Path) -> None:
    patch, magma_patch = tmp_path / "torch-fix.patch", tmp_path / "magma-fix.patch"
    patch.write_text("--- a/setup.py\n+++ b/setup.py\n@@ -1 +1 @@\n-a\n+b\n")
    magma_patch.write_text("--- a/CMakeLists.txt\n+++ b/CMakeLists.txt\n@@ -1 +1 @@\n-a\n+b\n")
    out = tmp_path / "out"
    assert main(["render", "--pytorch", "2.5.1", "--cuda", "12.4", "--py", "3.12", "--patch", str(patch),
                 "--magma-patch", str(magma_patch), "--out", str(out)]) == 0
    magma, torch = out / "magma-cuda124-2.6.1-linux_64", out / "pytorch-2.5.1-cu124-py312-linux_64"
    assert sorted(p.name for p in magma.glob("*.patch")) == ["magma-fix.patch"]
    assert sorted(p.name for p in torch.glob("*.patch")) == ["torch-fix.patch"]
    assert "magma-fix.patch" in (magma / "meta.yaml").read_text() and "torch-fix" not in (magma / "meta.yaml").read_text()
    assert "magma-fix" not in (torch / "meta.yaml").read_text()


# ------------------------------------------------------------------ small messages (issue 25, item 12)

def test_magma_only_prints_no_pytorch_warnings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["build", "--dry-run", "--magma-only", "--skip-preflight", "--pytorch", "2.9.0", "--cuda", "12.8",
                 "--py", "3.12", "--out", str(tmp_path / "ch")])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "warning: magma-cuda128-2.6.1-linux_64" in err
    assert "warning: pytorch-" not in err
    # magma-cudaXYZ is the official flavour's package, whatever the release's default flavour
    assert "flavour official: --magma-only builds the official flavour's magma-cudaXYZ" in err


def test_help_shows_the_defaults_of_cuda_and_py_from_the_data(capsys: pytest.CaptureFixture[str]) -> None:
    from torchforge import data as tables

    defaults = tables.load().pytorch.defaults
    assert main(["matrix", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert f"(default: {','.join(defaults.cuda)})" in text and f"(default: {','.join(defaults.python)})" in text


def test_a_pytorch_series_suggests_its_newest_release(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["matrix", "--pytorch", "1.10"]) == 2
    err = capsys.readouterr().err
    assert "--pytorch 1.10.2 (the newest 1.10 release)" in err and "2.5.1" not in err


def test_a_token_in_a_quetz_query_string_is_refused_and_never_shown(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    url = "quetz+http://127.0.0.1:8000/mychan?token=very-secret-123"
    assert main(["upload", "--from", str(tmp_path), "--to", url]) == 2
    err = capsys.readouterr().err
    assert "carries credentials in the URL" in err and "very-secret-123" not in err
    assert main(["upload", "--from", str(tmp_path), "--to", "quetz+http://127.0.0.1:8000/mychan?x=1"]) == 2
    assert "has a query or fragment" in capsys.readouterr().err


def test_rpath_audit_of_a_device_says_what_it_is(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rpath", "audit", "/dev/null"]) == 2
    err = capsys.readouterr().err
    assert "/dev/null is neither a file nor a directory" in err and "does not exist" not in err
