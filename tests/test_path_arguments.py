"""A path argument that exists but is not what the command takes is named for what it is, with what would
work: `repack DIR` (a folder, not "DIR does not exist") and `--extension FILE` for a file that is no sdist (not
"no such file or folder"); a file named like an archive that is not one is "not a readable archive" (issue 40,
item 12)."""

from __future__ import annotations

from pathlib import Path

from tests.standin_stack import PYTAG, TORCH, write_wheel
from tests.test_upload_helpers import cli


def test_repack_of_a_folder_says_it_is_a_folder_and_to_pass_the_wheels_in_it(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    write_wheel(wheels, "torch", TORCH, f"{PYTAG}-{PYTAG}-manylinux_2_28_x86_64", {"torch/__init__.py": b""}, [])
    result = cli("repack", str(wheels), "--out", str(tmp_path / "chan"))
    assert result.returncode == 2, result.stderr
    assert f"{wheels} is a folder, not a wheel file" in result.stderr, result.stderr
    assert f"pass the wheel files in it ({wheels}/*.whl)" in result.stderr
    assert "does not exist" not in result.stderr and not (tmp_path / "chan").exists()


def test_an_extension_file_that_is_no_sdist_is_named_for_what_it_is(tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("not an sdist\n")
    damaged = tmp_path / "torch_scatter-2.1.2.tar.gz"
    damaged.write_bytes(b"not gzip\n")
    for spec, said in ((notes, f"--extension '{notes}': {notes} is a file but not an sdist (.tar.gz, .tgz, "),
                       (damaged, f"{damaged} is not a readable archive")):
        result = cli("build", "--pytorch", "2.13.0", "--cuda", "cpu", "--py", "3.11", "--flavour", "official",
                     "--skip-preflight", "--out", str(tmp_path / "out"), "--extension", str(spec))
        assert result.returncode == 2, result.stderr
        assert said in result.stderr, result.stderr
        assert "no such file or folder" not in result.stderr and "Traceback" not in result.stderr
        assert not (tmp_path / "out").exists()
