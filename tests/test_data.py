"""The data tables load, pass their invariants, and agree with the reference facts they cite."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from torchforge import data as tables
from torchforge.data import check_invariants
from torchforge.errors import DataError


def test_tables_load_and_are_consistent() -> None:
    data = tables.load()
    assert check_invariants(data) == []
    assert set(data.pytorch.releases) >= {"1.8", "1.13", "2.0", "2.5", "2.9", "2.14"}


def test_every_table_cites_its_source() -> None:
    data = tables.load()
    for table in (data.cuda, data.pytorch, data.eras, data.magma, data.fixes, data.jetson):
        assert table.meta.source.strip()


def test_invariants_catch_an_arch_outside_the_nvcc_window() -> None:
    data = tables.load()
    release = data.pytorch.releases["2.5"]
    bad_build = release.cuda["12.4"].model_copy(update={"conda_arch": "3.7;5.0"})
    bad_release = release.model_copy(update={"cuda": {**release.cuda, "12.4": bad_build}})
    bad = data.model_copy(update={"pytorch": data.pytorch.model_copy(
        update={"releases": {**data.pytorch.releases, "2.5": bad_release}})})
    problems = check_invariants(bad)
    assert any("2.5.cuda.12.4.conda_arch: 3.7 is outside what nvcc 12.4 accepts" in p for p in problems)


def test_invariants_catch_an_unknown_magma_version() -> None:
    data = tables.load()
    bad_release = data.pytorch.releases["2.0"].model_copy(update={"magma": "9.9.9"})
    bad = data.model_copy(update={"pytorch": data.pytorch.model_copy(
        update={"releases": {**data.pytorch.releases, "2.0": bad_release}})})
    assert any("MAGMA 9.9.9" in p for p in check_invariants(bad))


def test_invariants_catch_a_magma_build_the_data_does_not_describe() -> None:
    """pytorch.toml's magma_build must name an earlier build of magma.toml, whose `without` names magma fixes."""
    data = tables.load()
    release = data.pytorch.releases["1.12"]
    bad_build = release.cuda["11.6"].model_copy(update={"magma_build": 5})
    bad_release = release.model_copy(update={"cuda": {**release.cuda, "11.6": bad_build}})
    magma = data.magma.versions["2.6.1"]
    earlier = magma.earlier_builds["0"].model_copy(update={"without": ("magma-getrf-shfl", "pt113-cu118-cpp-extension")})
    bad_magma = magma.model_copy(update={"earlier_builds": {"0": earlier, "3": earlier}})
    bad = data.model_copy(update={
        "pytorch": data.pytorch.model_copy(update={"releases": {**data.pytorch.releases, "1.12": bad_release}}),
        "magma": data.magma.model_copy(update={"versions": {**data.magma.versions, "2.6.1": bad_magma}})})
    problems = check_invariants(bad)
    assert any("1.12.cuda.11.6.magma_build 5: magma.toml gives no such earlier build of MAGMA 2.6.1" in p
               for p in problems), problems
    assert any("2.6.1.earlier_builds.3: not a build number below 1" in p for p in problems), problems
    assert any("without names pt113-cu118-cpp-extension, which is no magma fix" in p for p in problems), problems


def test_a_malformed_table_is_a_data_error(monkeypatch: pytest.MonkeyPatch) -> None:
    original = tables._read

    def broken(name: str) -> dict[str, object]:
        raw = original(name)
        if name == "magma":
            raw["versions"]["2.6.1"]["sha256"] = "not-a-sha"  # type: ignore[index]
        return raw

    monkeypatch.setattr(tables, "_read", broken)
    tables.load.cache_clear()
    try:
        with pytest.raises(DataError, match="magma.toml"):
            tables.load()
    finally:
        tables.load.cache_clear()


def test_magma_checksums_match_magma_sources(reference_dir: Path) -> None:
    text = (reference_dir / "magma-sources.md").read_text()
    reference = dict(re.findall(r"^\| (\d+\.\d+\.\d+) \| ([0-9a-f]{64}) \|", text, re.M))
    # 2.10.0 is pinned in prose (pytorch .ci/magma's sha256 file line: "<sha256>  magma-2.10.0.tar.gz")
    reference.update((v, sha) for sha, v in re.findall(r"`([0-9a-f]{64})  magma-(\d+\.\d+\.\d+)\.tar\.gz`", text))
    assert reference, "could not read the checksum table"
    for version, entry in tables.load().magma.versions.items():
        assert reference[version] == entry.sha256, version


# Conda TORCH_CUDA_ARCH_LIST per CUDA, official-builds.md §4.3 "Official conda" column.
CONDA_ARCH_FACTS = {
    ("1.10", "10.2"): "3.7+PTX;5.0;6.0;6.1;7.0;7.5",
    ("1.11", "11.3"): "3.7+PTX;5.0;6.0;6.1;7.0;7.5;8.0;8.6",
    ("1.13", "11.7"): "3.7+PTX;5.0;6.0;6.1;7.0;7.5;8.0;8.6",
    ("2.5", "11.8"): "5.0;6.0;6.1;7.0;7.5;8.0;8.6;3.7+PTX;9.0",
    ("2.4", "12.1"): "5.0;6.0;6.1;7.0;7.5;8.0;8.6;9.0",
    ("2.5", "12.4"): "5.0;6.0;6.1;7.0;7.5;8.0;8.6;9.0",
}


@pytest.mark.parametrize(("release", "cuda"), sorted(CONDA_ARCH_FACTS))
def test_conda_arch_lists_match_the_reference(release: str, cuda: str) -> None:
    assert tables.load().pytorch.releases[release].cuda[cuda].conda_arch == CONDA_ARCH_FACTS[(release, cuda)]


def test_arch_lists_appear_verbatim_in_the_reference(reference_dir: Path) -> None:
    text = (reference_dir / "official-builds.md").read_text() + (reference_dir / "compat-facts.md").read_text()
    for release in tables.load().pytorch.releases.values():
        for build in release.cuda.values():
            for value in (build.conda_arch, build.wheel_arch):
                if value:
                    assert value in text, value


def test_python_ranges_match_the_release_matrix() -> None:
    releases = tables.load().pytorch.releases
    assert releases["1.8"].python == ("3.6", "3.9")
    assert releases["2.5"].python == ("3.9", "3.12")
    assert releases["2.13"].python == ("3.10", "3.15")
    assert releases["2.13"].cxx_standard == 20
