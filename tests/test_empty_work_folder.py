"""conda-build that skipped copying a local source folder (docs/troubleshooting-build.md, "An empty work folder
with conda-build"): the pipeline recognises it from the build log and builds once more.

tests/fixtures/logs/conda-build-empty-work-folder.log is a real log of this suite's CPU torch_like build with
conda-build 26.7.1 that met it (CI, 2026-11-26), the checkout's path written as @REPO@."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchforge.pipeline import Action, Step, StepResult, _source_not_copied

ROOT = Path(__file__).resolve().parent.parent
TORCH_LIKE = ROOT / "tests" / "fixtures" / "torch_like"
LOG = ROOT / "tests" / "fixtures" / "logs" / "conda-build-empty-work-folder.log"


def _case(tmp_path: Path, source: Path, extra: str = "") -> tuple[Step, StepResult]:
    log = tmp_path / "pytorch-2.13.0-cpu-py311-linux_64.log"
    log.write_text(LOG.read_text().replace("@REPO@", str(ROOT)) + extra)
    step = Step("pytorch", "pytorch-2.13.0-cpu-py311-linux_64", "pytorch-2.13.0-py3.11_cpu_tfa9db365c_0", "linux-64",
                "3.11", {}, (), Action.BUILD, local_source=str(source))
    return step, StepResult(step, False, error="conda build ... exited with status 1", log=log)


def test_the_real_log_of_a_skipped_copy_is_recognised(tmp_path: Path) -> None:
    step, result = _case(tmp_path, TORCH_LIKE)
    assert _source_not_copied(step, result, "conda-build")


@pytest.mark.parametrize("why", ["copied", "rattler-build", "passed", "not installable"])
def test_anything_else_is_not_built_again(why: str, tmp_path: Path) -> None:
    copied = f"Copying {TORCH_LIKE} to {tmp_path}/work/\n" if why == "copied" else ""
    empty = tmp_path / "empty"
    empty.mkdir()
    step, result = _case(tmp_path, empty if why == "not installable" else TORCH_LIKE, copied)
    if why == "passed":
        result = StepResult(step, True, log=result.log)
    assert not _source_not_copied(step, result, "rattler-build" if why == "rattler-build" else "conda-build")
