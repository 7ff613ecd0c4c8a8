"""The snapshots of conda-forge/torchvision-feedstock and torchaudio-feedstock (scripts/stack_feedstock_snapshots.py):
each is the feedstock's own recipe.yaml, rendered by the real rattler-build for its own jobs, and the release
pairing the feedstock built agrees with torchforge/data/stack_pairing.toml except where
tests/data/stack_feedstock_differences.toml says why not."""

from __future__ import annotations

import re
import shutil
import tomllib
from pathlib import Path

import pytest

from tests.feedstock_rattler_render import render
from torchforge import stackpairing

SNAPSHOTS = Path(__file__).parent / "data" / "stack_feedstock"
DIFFERENCES = Path(__file__).parent / "data" / "stack_feedstock_differences.toml"
PACKAGES = ("torchvision", "torchaudio")


def releases(package: str) -> dict[str, dict[str, str]]:
    return tomllib.loads((SNAPSHOTS / package / "RELEASES.toml").read_text(encoding="utf-8"))


def feedstock_jobs(package: str, version: str) -> list[Path]:
    commit = releases(package)[version]["commit"]
    return sorted((SNAPSHOTS / package / commit / ".ci_support").glob("linux_64_*.yaml"))


def render_job(package: str, version: str, job: Path, scratch: Path) -> dict:
    folder = scratch / f"{package}-{version}-{job.stem}"
    shutil.copytree(SNAPSHOTS / package / releases(package)[version]["commit"] / "recipe", folder)
    shutil.copy(job, folder / "variants.yaml")
    return render(folder)


@pytest.mark.parametrize("package", PACKAGES)
def test_every_snapshot_folder_is_a_listed_release(package: str) -> None:
    listed = {row["commit"] for row in releases(package).values()}
    folders = {p.name for p in (SNAPSHOTS / package).iterdir() if p.is_dir()}
    assert folders == listed
    for version, row in releases(package).items():
        recipe = (SNAPSHOTS / package / row["commit"] / "recipe" / "recipe.yaml").read_text(encoding="utf-8")
        assert re.search(rf'^\s*version:\s*"?{re.escape(version)}"?\s*$', recipe, re.MULTILINE), version


@pytest.mark.parametrize(("package", "version"), [("torchvision", "0.28.0"), ("torchvision", "0.21.0"),
                                                  ("torchaudio", "2.11.0"), ("torchaudio", "2.6.0")])
def test_rattler_build_renders_the_feedstock_for_its_own_linux_jobs(package: str, version: str,
                                                                     tmp_path: Path) -> None:
    jobs = feedstock_jobs(package, version)
    assert jobs
    pin = releases(package)[version]["pytorch"]
    for job in jobs:
        output = render_job(package, version, job, tmp_path)[package]["fields"]
        cuda = "versionNone" not in job.name
        assert f"pytorch {pin}.*" in output["requirements.host"], output["requirements.host"]
        assert output["build.string"].startswith("cuda" if cuda else "cpu"), output["build.string"]


def test_the_feedstock_pairs_releases_as_pypi_does_or_the_difference_is_listed() -> None:
    listed = tomllib.loads(DIFFERENCES.read_text(encoding="utf-8")).get("pairing", {})
    found: dict[str, str] = {}
    for package in PACKAGES:
        for row in getattr(stackpairing.table(), package):
            built = releases(package).get(row.version)
            if built is not None and built["pytorch"] != row.pytorch:
                found[f"{package} {row.version}"] = f"feedstock {built['pytorch']}, PyPI {row.pytorch}"
    assert set(found) == set(listed), found
    for key, entry in listed.items():
        assert entry["why"].strip() and found[key] in entry["why"], key


def test_the_table_is_what_the_facts_script_reads_from_the_snapshots() -> None:
    """scripts/stack_feedstock_facts.py over the snapshots (every job file, rendered by rattler-build): exit 1 and
    say so where torchforge/data/conda_forge_stack.toml is stale."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, str(Path(__file__).parents[1] / "scripts" / "stack_feedstock_facts.py")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
