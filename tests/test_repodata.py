"""The index a repack writes from its builds (torchforge.repodata) against the one py-rattler's index_fs writes
from the same archives, and what a publication leaves of the channel's other entries."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.rattler_in_child import channel_records, install_without_dependencies
from tests.standin_stack import Factory
from torchforge import localchannel, repodata
from torchforge.binaries.plan import CudaLibs
from torchforge.binaries.stack import repack_stack
from torchforge.proc import Runner


def _index(channel: Path, subdir: str) -> dict[str, object]:
    data = json.loads((channel / subdir / "repodata.json").read_text(encoding="utf-8"))
    for section in ("packages", "packages.conda"):
        for record in data[section].values():
            record.pop("indexed_timestamp")  # the time of indexing: the one field two indexes may not share
    return data


def test_a_stack_indexed_from_its_builds_lists_what_py_rattler_lists(tmp_path: Path) -> None:
    """The stand-in cu128 stack repacked (its index written from the builds), then the same archives indexed
    by py-rattler in a second channel: the same records, the same keys, and py-rattler installs from ours."""
    wheels = Factory(tmp_path / "wheels").stack("cu128")
    ours = tmp_path / "ours"
    repack_stack(wheels, ours, Runner(), mode=CudaLibs.WHEELS)
    theirs = _copy_indexed_by_py_rattler(ours, tmp_path / "theirs")
    for subdir in ("linux-64", "noarch"):
        assert _index(ours, subdir) == _index(theirs, subdir), subdir
    listed = {r.file_name: r for r in channel_records(ours)}
    assert len(listed) >= 6
    torch = next(r for r in listed.values() if r.name == "pytorch")
    installed = install_without_dependencies(ours, "pytorch", torch.build, tmp_path / "prefix", tmp_path / "cache")
    assert installed.sha256 == torch.sha256
    assert (tmp_path / "prefix" / "conda-meta").is_dir()


def _copy_indexed_by_py_rattler(channel: Path, into: Path) -> Path:
    (into / "linux-64").mkdir(parents=True)
    for archive in (channel / "linux-64").glob("*.conda"):
        shutil.copy2(archive, into / "linux-64" / archive.name)
    localchannel.index(into)
    return into


@pytest.mark.parametrize("with_records", ["all", "all but one"])
def test_archives_published_with_their_records_are_listed_as_py_rattler_lists_them(with_records: str,
                                                                                    tmp_path: Path) -> None:
    """publish_many with each archive's record (taken from the archive as the build does) into a channel that
    already lists a stack: the merged index equals py-rattler's of the same archives; an archive without its
    record makes the publication index the whole channel instead (still the same result)."""
    wheels = Factory(tmp_path / "wheels").stack("cu128")
    channel = tmp_path / "channel"
    repack_stack(wheels, channel, Runner(), mode=CudaLibs.WHEELS)
    other = tmp_path / "other"
    repack_stack(wheels, other, Runner(), mode=CudaLibs.WHEELS, build_number=1)  # the same stack, rebuilt
    built = sorted((other / "linux-64").glob("*.conda"))
    records = {a.name: repodata.record_of(a, localchannel.info_json(a, "index.json")) for a in built}
    if with_records == "all but one":
        records.pop(built[0].name)
    placed = localchannel.publish_many(built, channel, "linux-64", records=records)
    assert {p.placed for p in placed} == {localchannel.Placed.ADDED}
    theirs = _copy_indexed_by_py_rattler(channel, tmp_path / "theirs")
    assert len(_index(channel, "linux-64")["packages.conda"]) == 2 * len(built)  # type: ignore[arg-type]
    for subdir in ("linux-64", "noarch"):
        assert _index(channel, subdir) == _index(theirs, subdir), subdir
