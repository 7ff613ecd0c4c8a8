"""Shared helpers for the upload tests (no tests here): run the real CLI in a child process."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLI_TIMEOUT_S = 300


def cli_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a child torchforge: ours, plus `extra`, with the checkout importable."""
    env = {**os.environ, **(extra or {})}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), str(ROOT)) if p)
    env.setdefault("COLUMNS", "200")
    return env


def cli(
    *args: str,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = CLI_TIMEOUT_S,
) -> subprocess.CompletedProcess[str]:
    """`torchforge ARGS` as a user runs it: a new process, its own stdout and stderr, the real exit code."""
    return subprocess.run(
        [sys.executable, "-m", "torchforge.cli", *args],
        env=cli_env(env),
        cwd=cwd or ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
