"""torchforge/data/stack_pairing.toml: which torchvision/torchaudio goes with which pytorch, read from PyPI wheels."""

from __future__ import annotations

import re

import pytest
from packaging.version import Version

from torchforge import stackpairing
from torchforge.errors import ExitCode, RefusedError

PYTORCH_RELEASES = ("2.6.0", "2.7.0", "2.7.1", "2.8.0", "2.9.0", "2.9.1", "2.10.0", "2.11.0", "2.12.0", "2.12.1",
                    "2.13.0", "2.14.0")


def test_every_row_cites_a_wheel_and_its_checksum() -> None:
    table = stackpairing.table()
    for row in (*table.torchvision, *table.torchaudio):
        assert row.found, row
        assert re.match(r"PyPI torch(vision|audio)-[\w.]+-\w+-\w+-\w+\.whl \(sha256 [0-9a-f]{64}\)", row.source or "")
        assert row.requires and row.requires.startswith("torch")


def test_the_issue_ranges_are_covered() -> None:
    table = stackpairing.table()
    assert {".".join(r.version.split(".")[:2]) for r in table.torchvision} == {f"0.{m}" for m in range(21, 30)}
    assert {".".join(r.version.split(".")[:2]) for r in table.torchaudio} == {f"2.{m}" for m in range(6, 12)}


@pytest.mark.parametrize("pytorch", PYTORCH_RELEASES)
def test_every_pytorch_release_has_a_torchvision_pinned_to_it(pytorch: str) -> None:
    row = stackpairing.companion_release("torchvision", pytorch)
    assert row.requires == f"torch=={pytorch}"
    assert not row.loose


@pytest.mark.parametrize(("pytorch", "torchvision", "torchaudio"), [
    ("2.6.0", "0.21.0", "2.6.0"), ("2.7.1", "0.22.1", "2.7.1"), ("2.9.1", "0.24.1", "2.9.1"),
    ("2.10.0", "0.25.0", "2.10.0"), ("2.11.0", "0.26.0", "2.11.0"), ("2.12.1", "0.27.1", "2.11.0"),
    ("2.13.0", "0.28.0", "2.11.0"), ("2.14.0", "0.29.0", "2.11.0"),
])
def test_pairings(pytorch: str, torchvision: str, torchaudio: str) -> None:
    assert stackpairing.companion_release("torchvision", pytorch).version == torchvision
    assert stackpairing.companion_release("torchaudio", pytorch).version == torchaudio


def test_torchaudio_2_11_is_loose_and_says_its_wheel_names_no_torch() -> None:
    row = stackpairing.companion_release("torchaudio", "2.14.0")
    assert (row.version, row.requires, row.loose, row.wheel_requires) == ("2.11.0", "torch>=2.11", True, "none")
    assert "pytorch/audio#4225" in (row.source or "")


def test_a_pytorch_outside_the_table_is_refused_with_what_it_covers() -> None:
    with pytest.raises(RefusedError) as caught:
        stackpairing.companion_release("torchaudio", "2.5.1")
    assert caught.value.exit_code == ExitCode.REFUSED
    assert "2.6" in caught.value.message and "2.11" in caught.value.message
    assert caught.value.hint


def test_versions_sorted() -> None:
    rows = stackpairing.table().torchvision
    assert [r.version for r in rows] == sorted((r.version for r in rows), key=Version)
