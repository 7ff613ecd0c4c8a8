"""conda-build: `conda build RECIPE --python X.Y --output-folder STAGING -c file://OUT ... --override-channels`.

Whether it can be used is decided by one probe, `probe()`: `conda build --version` must run. `--engine auto`,
`--engine conda-build` and `torchforge doctor` all read that probe, so they cannot disagree.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from torchforge.engines import BuildJob, which
from torchforge.errors import ForgeError
from torchforge.proc import Command, Runner
from torchforge.templates import RecipeFormat

_VERSION = re.compile(r"conda-build\s+(\S+)")
PROBE_ARGV = ("conda", "build", "--version")
PROBE_TIMEOUT_S = 120


@dataclass(frozen=True)
class CondaBuildProbe:
    """What `conda build --version` said on this machine."""

    conda: str | None  # the `conda` found on PATH
    version: str | None = None  # conda-build's version, when the probe ran
    problem: str = ""  # why the probe did not run, when `conda` is on PATH

    @property
    def usable(self) -> bool:
        return self.version is not None

    @property
    def reason(self) -> str:
        """Why conda-build cannot be used, in a sentence."""
        return self.problem or "no `conda` on PATH"


_PROBES: dict[tuple[str, int, str], CondaBuildProbe] = {}


def probe() -> CondaBuildProbe:
    """Run `conda build --version` once per `conda` executable (and PATH); the answer is kept for the process.

    It is a check of the machine, not a build step, so it runs under --dry-run too.
    """
    conda = which("conda")
    if conda is None:
        return CondaBuildProbe(None)
    try:
        stamp = os.stat(conda).st_mtime_ns
    except OSError:
        stamp = 0
    key = (conda, stamp, os.environ.get("PATH", ""))
    if key not in _PROBES:
        _PROBES[key] = _run_probe(conda)
    return _PROBES[key]


def _run_probe(conda: str) -> CondaBuildProbe:
    try:
        result = Runner().run(Command(argv=PROBE_ARGV), check=False, timeout=PROBE_TIMEOUT_S)
    except ForgeError as exc:
        return CondaBuildProbe(conda, problem=f"`conda` at {conda} is on PATH but does not start: "
                                              f"{_missing_interpreter(conda) or exc.message}")
    lines = [line.strip() for line in result.output.splitlines() if line.strip()]
    if result.returncode != 0:
        last = f": {lines[-1][:200]}" if lines else ""
        return CondaBuildProbe(
            conda, problem=f"`conda` at {conda} is on PATH but `conda build --version` exited with status "
                           f"{result.returncode}{last}")
    found = _VERSION.search(result.output)
    return CondaBuildProbe(conda, found.group(1) if found else (lines[-1] if lines else "unknown"))


def _missing_interpreter(path: str) -> str | None:
    """The usual cause of a conda that exists but cannot start: its environment (the #! interpreter) is gone."""
    try:
        with open(path, "rb") as handle:
            first = handle.readline(512).decode("utf-8", "replace").strip()
    except OSError:
        return None
    words = first[2:].split() if first.startswith("#!") else []
    if words and not os.path.exists(words[0]):
        return f"its interpreter {words[0]} does not exist (was its environment removed?)"
    return None


class CondaBuildEngine:
    name = "conda-build"
    recipe_format = RecipeFormat.CONDA_BUILD

    def available(self) -> bool:
        return probe().usable

    def command(self, job: BuildJob) -> Command:
        argv = ["conda", "build", str(job.recipe_dir)]
        if job.python:
            argv += ["--python", job.python]
        argv += ["--output-folder", str(job.staging_dir)]
        if job.work_dir is not None:
            argv += ["--croot", str(job.work_dir)]
        for channel in job.channels:
            argv += ["-c", channel]
        # --override-channels: only the local channel and the ones asked for, never a user's .condarc defaults;
        # --no-anaconda-upload: publishing is `torchforge upload`'s job.
        argv += ["--override-channels", "--no-anaconda-upload"]
        if not job.test:
            argv.append("--no-test")
        return Command(argv=tuple(argv), env=dict(job.env))
