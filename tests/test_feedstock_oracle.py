"""The conda-forge flavour checked against conda-forge/pytorch-cpu-feedstock itself, not against our own table.

tests/data/feedstock holds the feedstock's recipe/ and .ci_support/ at each release commit the table names
(scripts/feedstock_snapshots.py refreshes them from a clone). These tests read the table's facts again from
those files, check the table's choice of commit, and render the feedstock's own recipe with the real
conda-build next to torchforge's render of the same job (tests/feedstock_oracle.py).
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SNAPSHOTS = ROOT / "tests" / "data" / "feedstock"
TABLE = tomllib.loads((ROOT / "torchforge" / "data" / "conda_forge.toml").read_text(encoding="utf-8"))


def test_the_snapshots_are_the_tables_commits() -> None:
    folders = {p.name for p in SNAPSHOTS.iterdir() if p.is_dir()}
    assert folders == {r["commit"] for r in TABLE["releases"].values()}


def test_a_release_with_a_branch_is_read_at_the_branchs_tip() -> None:
    """The table's rule: the tip of the branch vX.Y.x where the feedstock has one for that release (its later
    builds there carry newer build numbers and patches, e.g. 2.9.1's build 5 at e42c757b)."""
    branches = tomllib.loads((SNAPSHOTS / "BRANCHES.toml").read_text(encoding="utf-8"))
    for version, release in TABLE["releases"].items():
        tips = [b["commit"] for b in branches.values() if b["version"] == version]
        if tips:
            assert release["commit"] == tips[0], f"{version}: the table reads {release['commit'][:8]}, " \
                                                 f"the tip of its branch is {tips[0][:8]}"
            assert release["commit_note"].startswith("tip of branch"), version


def test_the_table_is_what_the_facts_script_reads_from_the_snapshots() -> None:
    """scripts/conda_forge_facts.py on the snapshots: exit 1 (and say so) where the table is stale."""
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "conda_forge_facts.py"), str(SNAPSHOTS)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "matches the feedstock" in done.stdout
