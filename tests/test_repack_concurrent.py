"""Two identical `torchforge repack`s into one channel at once agree with a sequential rerun: both succeed, one
builds and publishes, the other waits for it and reuses its package (issue 34, item 11). The two are real
processes released together by a start barrier."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.test_upload_helpers import ROOT, cli_env
from tests.test_wheel_repair import build_hello_wheel

# Each process announces itself, waits until both have, then runs the command: they start within milliseconds.
BARRIER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from torchforge.cli import main
    barrier, me, argv = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
    (barrier / me).touch()
    while len(list(barrier.iterdir())) < 2:
        time.sleep(0.001)
    sys.exit(main(argv))
""")


def test_two_identical_repacks_at_once_both_succeed_and_one_reuses_the_others_package(tmp_path: Path) -> None:
    (tmp_path / "wheel").mkdir()
    wheel = build_hello_wheel(tmp_path / "wheel", name="torch")
    channel, barrier = tmp_path / "chan", tmp_path / "barrier"
    barrier.mkdir()
    argv = ["repack", str(wheel), "--out", str(channel)]
    logs = [tmp_path / f"run{n}.log" for n in (1, 2)]
    procs = []
    for number, log in enumerate(logs, 1):
        with log.open("wb") as sink:
            procs.append(subprocess.Popen([sys.executable, "-c", BARRIER, str(barrier), f"p{number}", *argv],
                                          env=cli_env(), cwd=ROOT, stdin=subprocess.DEVNULL, stdout=sink,
                                          stderr=subprocess.STDOUT))
    codes = [proc.wait(timeout=600) for proc in procs]
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
