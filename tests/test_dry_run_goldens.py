"""Golden dry runs (issue 30, move 1): `matrix --json`, `build --dry-run` and `render` of an official and a
conda-forge request print today exactly what they printed when the goldens were recorded, byte for byte.

They are the safety net of the one-plan redesign: a move that only reshapes the code leaves them identical; a
move that changes what a user sees regenerates them (`make goldens`) and says why in its commit. What is
normalised, and why, is in `tests.golden.dry_run_regenerate.normalise`: the temporary folder and where this
interpreter and its ccache live, nothing else.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.golden.dry_run_regenerate import GOLDEN, cases, command_lines, normalise, record_case

CASES = cases()


def test_every_golden_folder_is_a_case_and_every_case_has_its_files() -> None:
    on_disk = {p.relative_to(GOLDEN).as_posix() for p in GOLDEN.rglob("*") if p.is_file()}
    expected = {f"{name}/{filename}" for name, case in CASES.items() for filename in command_lines(case)}
    assert on_disk == expected, "run `make goldens` and review the diff"


def test_the_cases_cover_both_flavours_and_both_engines() -> None:
    # The net must hold what the redesign touches: each flavour's CUDA and CPU request, and both engines'
    # command lines (the engine is chosen per flavour today and by one sequencer after move 6).
    texts = {name: (GOLDEN / name / "matrix.txt").read_text(encoding="utf-8") for name in CASES}
    assert any('"status": "official"' in t for t in texts.values())
    assert any('"flavour": "conda-forge"' in t for t in texts.values())
    assert {str(c["engine"]) for c in CASES.values()} == {"conda-build", "rattler-build"}


def test_normalise_replaces_only_the_scratch_folder_and_the_interpreter(tmp_path: Path) -> None:
    line = f"-c file://{tmp_path}/work/forge-channel https://conda.anaconda.org/conda-forge py3.12_cpu_0"
    assert normalise(line, tmp_path) == "-c file://<tmp>/work/forge-channel https://conda.anaconda.org/conda-forge py3.12_cpu_0"


@pytest.mark.parametrize("name", list(CASES))
def test_dry_runs_match_their_goldens(name: str) -> None:
    recorded = record_case(CASES[name])
    for filename, text in recorded.items():
        assert text.splitlines()[1] == "exit 0", f"{name}/{filename}: the command failed:\n{text}"
        expected = (GOLDEN / name / filename).read_bytes().decode("utf-8")  # no newline translation: byte for byte
        assert text == expected, f"{name}/{filename} differs: run `make goldens` and review the diff"
