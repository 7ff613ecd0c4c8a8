"""The companion oracle: conda-forge's torchvision-feedstock and torchaudio-feedstock (tests/data/stack_feedstock, at
each release's commit) against torchforge's torchvision and torchaudio recipes, job by job. For every linux-64 job
file of a release (cpu and each CUDA, each Python), the real rattler-build renders the feedstock's recipe.yaml with
that job file and torchforge's recipe.yaml planned for the same job (its CUDA, its Python); bash runs each side's
build.sh with the same variables and what each exports is compared too (`script.env.NAME`). Differences torchforge
means to have are listed once in tests/data/stack_feedstock_differences.toml (the rules of tests/feedstock_oracle.py).

The jobs come from the snapshots, not from torchforge's table, so a job the table leaves out is still a case.

    python -m tests.stack_oracle [PACKAGE] [VERSION ...]   # the figures per job, and every difference
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement

from tests.feedstock_oracle import Finding, compare
from tests.feedstock_rattler_render import normalised, render
from torchforge import stackpairing
from torchforge.flavours.conda_forge import stack as conda_forge_stack

ROOT = Path(__file__).resolve().parents[1]
SNAPSHOTS = ROOT / "tests" / "data" / "stack_feedstock"
DIFFERENCES = ROOT / "tests" / "data" / "stack_feedstock_differences.toml"
PACKAGES = ("torchvision", "torchaudio")
ARCH_LIST = "8.0;9.0+PTX"  # the arch list of the pytorch each CUDA recipe is planned for
JOB_NAME = re.compile(r"^linux_64_.*cuda_compiler_version(?P<cuda>\d+\.\d+|None).*python(?P<python>\d+\.\d+)\.")
# What bash is given for either side's build.sh (as rattler-build gives a build: the host prefix, the compilers).
SCRIPT_ENV = {"PYTHON": "true", "PREFIX": "/prefix", "CC": "/build/bin/cc", "CXX": "/build/bin/c++",
              "target_platform": "linux-64", "build_platform": "linux-64", "CF_TORCH_CUDA_ARCH_LIST": ARCH_LIST}


@dataclass(frozen=True)
class StackJob:
    """One job file of a release: `accel` is "cpu" or the job's CUDA X.Y (the oracle's rules read it as the
    pytorch oracle's Job)."""

    package: str
    version: str
    accel: str
    python: str
    file: str

    @property
    def platform(self) -> str:
        return "linux-64"

    @property
    def id(self) -> str:
        return f"{self.package}-{self.version}-{self.accel}-py{self.python}"


def jobs(packages: tuple[str, ...] = PACKAGES, versions: list[str] | None = None) -> list[StackJob]:
    """Every linux-64 job file of every release the pairing table builds (those torchforge plans)."""
    found = []
    for package in packages:
        paired = {row.version for row in getattr(stackpairing.table(), package)}
        released = tomllib.loads((SNAPSHOTS / package / "RELEASES.toml").read_text(encoding="utf-8"))
        for version, row in released.items():
            if version not in paired or (versions and version not in versions):
                continue
            for file in sorted((SNAPSHOTS / package / row["commit"] / ".ci_support").glob("linux_64_*.yaml")):
                match = JOB_NAME.match(file.name)
                assert match, file
                accel = "cpu" if match["cuda"] == "None" else match["cuda"]
                found.append(StackJob(package, version, accel, match["python"], file.name))
    return found


def commit(job: StackJob) -> str:
    released = tomllib.loads((SNAPSHOTS / job.package / "RELEASES.toml").read_text(encoding="utf-8"))
    return released[job.version]["commit"]


def pytorch_for(job: StackJob) -> conda_forge_stack.PytorchBuild:
    """The pytorch package PyPI pairs the release with, for the job's CUDA and Python."""
    row = next(r for r in getattr(stackpairing.table(), job.package) if r.version == job.version)
    lower = next(iter(Requirement(row.requires or "").specifier)).version
    release = ".".join((lower.split(".") + ["0", "0"])[:3])
    cuda = None if job.accel == "cpu" else job.accel
    tag = f"cuda{cuda.replace('.', '')}" if cuda else "cpu"
    py = job.python.replace(".", "")
    return conda_forge_stack.PytorchBuild(release, f"{tag}_generic_torchforge_py{py}_h1234567_0", "linux-64",
                                          job.python, cuda, ARCH_LIST if cuda else None)


def write_pair(job: StackJob, scratch: Path) -> tuple[Path, Path]:
    """(the feedstock's recipe folder with the job file as its variants, torchforge's recipe folder)."""
    snapshot = SNAPSHOTS / job.package / commit(job)
    theirs = scratch / f"{job.id}-feedstock"
    shutil.copytree(snapshot / "recipe", theirs)
    shutil.copy(snapshot / ".ci_support" / job.file, theirs / "variants.yaml")
    ours = scratch / f"{job.id}-torchforge"
    ours.mkdir()
    recipe = conda_forge_stack.plan(job.package, pytorch_for(job))  # type: ignore[arg-type]
    for name, text in conda_forge_stack.recipe_files(recipe, "rattler-build").items():
        (ours / name).write_text(text, encoding="utf-8")
    return theirs, ours


def script_env(folder: Path, env: dict[str, str]) -> dict[str, str]:
    """What the folder's build.sh, run by bash with `env`, exports that `env` did not hold (its pip install is a
    no-op: PYTHON=true, and a `python` on PATH that exits 0)."""
    with tempfile.TemporaryDirectory() as scratch:
        shims = Path(scratch) / "bin"
        shims.mkdir()
        (shims / "python").write_text("#!/bin/sh\nexit 0\n")
        (shims / "python").chmod(0o755)
        given = {**env, "PATH": f"{shims}:{os.environ['PATH']}"}
        script = f"exec 3>&1; trap 'env -0 >&3' EXIT; source {folder / 'build.sh'} >/dev/null 2>&1"
        done = subprocess.run(["bash", "-c", script], cwd=scratch, env=given, capture_output=True, timeout=60)
    found = dict(item.split("=", 1) for item in done.stdout.decode().split("\0") if "=" in item)
    return {key: value for key, value in found.items()
            if given.get(key) != value and key not in ("PWD", "OLDPWD", "SHLVL", "_")}


def render_job(job: StackJob, scratch: Path) -> tuple[dict, dict]:
    """(the feedstock's outputs, torchforge's), each with its build.sh's exports as `script.env.NAME` fields."""
    theirs_folder, ours_folder = write_pair(job, scratch)
    theirs, ours = normalised(render(theirs_folder)), normalised(render(ours_folder))
    base = {**SCRIPT_ENV, "cuda_compiler_version": "None" if job.accel == "cpu" else job.accel}
    script = theirs[job.package].pop("script_env", {})
    ours[job.package].pop("script_env", None)
    for output, folder, extra in ((theirs, theirs_folder, script), (ours, ours_folder, {})):
        # the recipe's script env (BUILD_VERSION) is the feedstock's build environment as much as build.sh's
        exported = {**{k: str(v) for k, v in extra.items() if base.get(k) != str(v)},
                    **script_env(folder, {**base, **{k: str(v) for k, v in extra.items()}})}
        output[job.package]["fields"].update({f"script.env.{name}": value for name, value in exported.items()})
    return theirs, ours


def differences() -> dict:
    listed = tomllib.loads(DIFFERENCES.read_text(encoding="utf-8"))
    return {kind: listed.get(kind, []) for kind in ("rewrite", "item", "output")}


def findings(job: StackJob, scratch: Path) -> list[Finding]:
    theirs, ours = render_job(job, scratch)
    return compare(job, theirs, ours, differences())  # type: ignore[arg-type]


def figures(found: list[Finding]) -> dict[str, dict[str, int]]:
    """{job id: {compared, identical, intended, open, different}}."""
    table: dict[str, dict[str, int]] = {}
    for finding in found:
        row = table.setdefault(finding.job.id, dict.fromkeys(("compared", "identical", "intended", "open",
                                                              "different"), 0))
        row["compared"] += 1
        row[finding.status] += 1
    return table


def main(argv: list[str]) -> int:
    packages = tuple(a for a in argv if a in PACKAGES) or PACKAGES
    versions = [a for a in argv if re.fullmatch(r"\d+\.\d+\.\d+", a)]
    found: list[Finding] = []
    with tempfile.TemporaryDirectory() as scratch:
        for job in jobs(packages, versions or None):
            try:
                found += findings(job, Path(scratch))
            except Exception as error:  # a job torchforge cannot plan is a figure too, not a crash
                print(f"{job.id}: not planned: {error}")
    print("| job | fields compared | identical | listed as intended | different |")
    print("|---|---|---|---|---|")
    for job, row in figures(found).items():
        print(f"| {job} | {row['compared']} | {row['identical']} | {row['intended'] + row['open']} | "
              f"{row['different']} |")
    for finding in found:
        if finding.status == "different":
            print(f"{finding.job.id} {finding.output} {finding.field}: {finding.detail}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
