"""Named steps where a command waits when TORCHFORGE_PAUSE_AT names one: the suite holds a command at a known
point (an install holding its prefix's lock, a repack whose builds are running) and acts on it there, instead
of racing it with sleeps.

`TORCHFORGE_PAUSE_AT=STEP:FOLDER`: on reaching STEP the process writes FOLDER/STEP.reached (its pid) and waits
until FOLDER/STEP.release exists. Unset, or naming another step, nothing happens: no command sets it, and a
user who does only makes the command wait where they asked."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

PAUSE_VARIABLE = "TORCHFORGE_PAUSE_AT"
# A test that dies without releasing the pause must not leave the command waiting for ever.
PAUSE_LIMIT_S = 600.0


def pause_at(step: str, check: Callable[[], None] = lambda: None) -> None:
    """Wait at `step` if TORCHFORGE_PAUSE_AT names it; `check` is called while waiting (a worker thread's stop
    check: a cancelled run is not held up by its pause)."""
    name, _, folder = os.environ.get(PAUSE_VARIABLE, "").partition(":")
    if name != step or not folder:
        return
    release = Path(folder, f"{step}.release")
    if release.exists():
        return
    Path(folder, f"{step}.reached").write_text(f"{os.getpid()}\n")
    deadline = time.monotonic() + PAUSE_LIMIT_S
    while not release.exists() and time.monotonic() < deadline:
        check()
        time.sleep(0.01)
