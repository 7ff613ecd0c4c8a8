"""`matrix --extension`: each extension row's values under the columns of their names, in either flavour's table
(conda-forge's "build number" and "pythons", the official flavour's "build string"), from the request's real plan."""

from __future__ import annotations

import dataclasses

import pytest

from torchforge import sequence
from torchforge.flavours.base import Request

SPEC = "torch-scatter==2.1.2"


def extension_cells(flavour: str, request: Request) -> list[dict[str, str]]:
    view = sequence.matrix(flavour, dataclasses.replace(request, extensions=(SPEC,)))
    rows = [row for row in view.rows if row.get("kind") == "extension"]
    cells = view.cells[len(view.cells) - len(rows):]
    assert rows and all(cell[1] == "extension torch-scatter" for cell in cells)
    return [{**dict(zip(view.columns, cell, strict=True)), "_build": str(row["build_string"])}
            for cell, row in zip(cells, rows, strict=True)]


def test_conda_forge_rows_give_the_build_number_and_the_python() -> None:
    """It put the build string under "build number" and left "pythons" empty."""
    request = Request("2.7.1", "12.8", "3.12,3.13", arch_list="9.0")
    found = extension_cells("conda-forge", request)
    assert [(c["build number"], c["pythons"]) for c in found] == [("0", "3.12"), ("0", "3.13")]
    # the build string is the JSON row's and the recipe's name; the conda-forge table has no column of its own for it
    assert all(c["_build"].endswith("_0") and c["recipe"].endswith(c["_build"]) for c in found)
    assert all(c["notes"].startswith("for pytorch 2.7.1 cuda128_") for c in found)


@pytest.mark.parametrize("number", [0, 3])
def test_official_rows_give_the_build_string(number: int) -> None:
    request = Request("2.13.0", "cpu", "3.11", build_number=number)
    (found,) = extension_cells("official", request)
    assert found["build string"] == found["_build"] and found["build string"].startswith("pt2.13.0_cpu_")
    assert found["notes"].startswith("for pytorch 2.13.0 py3.11_cpu_")
