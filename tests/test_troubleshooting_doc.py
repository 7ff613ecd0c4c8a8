"""docs/troubleshooting.md's exit-code table is the one of torchforge/errors.py."""

from __future__ import annotations

import re
from pathlib import Path

from torchforge.errors import ExitCode

DOC = Path(__file__).resolve().parents[1] / "docs" / "troubleshooting.md"


def test_the_exit_code_table_lists_every_exit_code_with_its_name() -> None:
    rows = re.findall(r"^\| *(\d+) \| ([A-Z_]+) \|", DOC.read_text(encoding="utf-8"), flags=re.MULTILINE)
    assert [(int(code), name) for code, name in rows] == [(int(c), c.name) for c in ExitCode]
