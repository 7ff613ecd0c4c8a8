"""Two identical `torchforge repack`s into one channel at once agree with a sequential rerun: both succeed, one
builds and publishes, the other waits for it and reuses its package (issue 34, item 11). The two are real
processes released together by a start barrier, which has a deadline: a child that dies before the barrier opens
fails the test at once (issue 40, item 21), and one whose partner never comes gives up."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.test_upload_helpers import ROOT, cli_env
from tests.test_wheel_repair import build_hello_wheel

# Each process announces itself, waits until both have, then runs the command: they start within milliseconds.
# A partner that has not come within the deadline never will (it died, or never started): exit 3, said.
BARRIER_DEADLINE_S = 60
BARRIER = textwrap.dedent(f"""
    import sys, time
    from pathlib import Path
    barrier, me, argv = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
    (barrier / me).touch()
    deadline = time.monotonic() + {BARRIER_DEADLINE_S}
    while len(list(barrier.iterdir())) < 2:
        if time.monotonic() > deadline:
            sys.exit(f"start barrier: no partner within {BARRIER_DEADLINE_S} s")
        time.sleep(0.001)
    from torchforge.cli import main
    sys.exit(main(argv))
""")


def released_together(commands: Sequence[Sequence[str]], barrier: Path, logs: Sequence[Path],
                      deadline_s: float = 600) -> list[int]:
    """Start each command (argv after the interpreter) and wait for all; the first to exit non-zero while others
    still run ends them, so a child that dies before the barrier opens fails the test now, not at a timeout.
    Past `deadline_s` every child is ended and the test fails."""
    procs = []
    for command, log in zip(commands, logs):
        with log.open("wb") as sink:
            procs.append(subprocess.Popen([sys.executable, *command], env=cli_env(), cwd=ROOT,
                                          stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT))
    deadline = time.monotonic() + deadline_s
    codes = [proc.poll() for proc in procs]
    while (None in codes and not any(code not in (None, 0) for code in codes)) and time.monotonic() < deadline:
        time.sleep(0.02)
        codes = [proc.poll() for proc in procs]
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    if None in codes and not any(code not in (None, 0) for code in codes):
        pytest.fail(f"the children were still running after {deadline_s:g} s: {[log.read_text()[-500:] for log in logs]}")
    return [proc.returncode for proc in procs]


def test_two_identical_repacks_at_once_both_succeed_and_one_reuses_the_others_package(tmp_path: Path) -> None:
    (tmp_path / "wheel").mkdir()
    wheel = build_hello_wheel(tmp_path / "wheel", name="torch")
    channel, barrier = tmp_path / "chan", tmp_path / "barrier"
    barrier.mkdir()
    argv = ["repack", str(wheel), "--out", str(channel)]
    logs = [tmp_path / f"run{n}.log" for n in (1, 2)]
    codes = released_together([["-c", BARRIER, str(barrier), f"p{n}", *argv] for n in (1, 2)], barrier, logs)
    texts = [" ".join(log.read_text().split()) for log in logs]
    assert codes == [0, 0], texts
    assert sum("reused: already repacked from this wheel" in text for text in texts) == 1, texts
    archives = sorted(p.name for p in (channel / "linux-64").glob("*.conda"))
    assert len(archives) == 1, archives
    listed = json.loads((channel / "linux-64" / "repodata.json").read_text())["packages.conda"]
    assert sorted(listed) == archives
    # And a sequential rerun says the same as the one that waited.
    rerun = subprocess.run([sys.executable, "-m", "torchforge.cli", *argv], env=cli_env(), cwd=ROOT,
                           capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0 and "reused: already repacked from this wheel" in " ".join(rerun.stdout.split())


@pytest.mark.parametrize("dies", ["before-the-barrier", "instead-of-starting"])
def test_a_child_that_dies_before_the_barrier_opens_fails_the_test_at_once(dies: str, tmp_path: Path) -> None:
    """The partner of a child that waits at the barrier dies first: the wait ends in seconds, with its code."""
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    waiting = ["-c", BARRIER, str(barrier), "p1", "--version"]
    dying = ["-c", "import sys; sys.exit(5)"] if dies == "instead-of-starting" else \
        ["-c", BARRIER.replace("(barrier / me).touch()", "sys.exit(5)"), str(barrier), "p2", "--version"]
    # 30 s: far below the barrier's own deadline (60 s), so only the parent's watch can end this in time
    codes = released_together([waiting, dying], barrier, [tmp_path / "p1.log", tmp_path / "p2.log"], deadline_s=30)
    assert codes[1] == 5 and codes[0] != 0, codes
