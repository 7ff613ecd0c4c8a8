"""The one place torchforge starts subprocesses.

Every external command (patchelf, conda build, nvcc, anaconda, git ...) goes through a `Runner`, so that
`--dry-run` prints exactly what would run, logs get the argv and environment that were used, and secrets
handed to a command are masked wherever the command line or its output is shown.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from torchforge.errors import ToolFailedError, ToolMissingError, ToolTimeoutError

TAIL_LINES = 40
REAP_GRACE_S = 10.0  # how long an abandoned child gets to end on SIGTERM before it is killed


@dataclass(frozen=True)
class Command:
    """What to run: argv, the variables to add to the environment, the working directory."""

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: Path | None = None
    # Values (tokens) that must never be shown: masked in printed argv, env and captured output.
    secrets: tuple[str, ...] = ()
    # Replace the whole environment instead of extending os.environ (conda-build-like isolation).
    isolated_env: bool = False

    def redact(self, text: str) -> str:
        for secret in self.secrets:
            if secret:
                text = text.replace(secret, "***")
        return text

    def display(self) -> str:
        """A shell line equivalent to this command, with secrets masked."""
        env_part = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        cd_part = f"cd {shlex.quote(str(self.cwd))} && " if self.cwd else ""
        line = cd_part + (env_part + " " if env_part else "") + shlex.join(self.argv)
        return self.redact(line)


@dataclass(frozen=True)
class Result:
    returncode: int
    output: str  # stdout and stderr interleaved, secrets masked ("" in dry-run)
    dry_run: bool = False


class Runner:
    """Runs `Command`s, or only records and prints them when `dry_run` is set."""

    def __init__(self, dry_run: bool = False, echo: Callable[[str], None] | None = None) -> None:
        self.dry_run = dry_run
        self.echo = echo
        self.history: list[Command] = []

    def which(self, tool: str, hint: str | None = None) -> str:
        found = shutil.which(tool)
        if found is None:
            raise ToolMissingError(f"`{tool}` was not found on PATH", hint)
        return found

    def run(
        self,
        command: Command,
        *,
        check: bool = True,
        log_file: Path | None = None,
        on_line: Callable[[str], None] | None = None,
        timeout: float | None = None,
    ) -> Result:
        self.history.append(command)
        if self.echo is not None:
            self.echo(("[dry-run] " if self.dry_run else "$ ") + command.display())
        if self.dry_run:
            return Result(0, "", dry_run=True)
        env = dict(command.env) if command.isolated_env else {**os.environ, **command.env}
        log: TextIO | None = None
        if log_file is not None:
            log_file.parent.mkdir(parents=True, exist_ok=True)
            log = log_file.open("a", encoding="utf-8")
            log.write(f"$ {command.display()}\n")
        captured: list[str] = []
        tail: deque[str] = deque(maxlen=TAIL_LINES)
        try:
            try:
                proc = subprocess.Popen(
                    list(command.argv),
                    cwd=command.cwd,
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    text=True,
                    errors="replace",
                )
            except OSError as exc:  # not found, not executable, bad interpreter line, exec format error
                raise ToolMissingError(f"cannot run `{command.argv[0]}`: {exc.strerror}") from exc
            assert proc.stdout is not None
            # A child that never ends and never writes would block the read below forever: a timer ends it.
            expired = threading.Event()
            timer = threading.Timer(timeout, _expire, (proc, expired)) if timeout is not None else None
            if timer is not None:
                timer.daemon = True
                timer.start()
            try:
                for raw in proc.stdout:
                    line = command.redact(raw)
                    captured.append(line)
                    tail.append(line)
                    if log is not None:
                        log.write(line)
                    if on_line is not None:
                        on_line(line.rstrip("\n"))
                returncode = proc.wait()
            except BaseException:
                _reap(proc)
                raise
            finally:
                if timer is not None:
                    timer.cancel()
                proc.stdout.close()  # else a ResourceWarning (an error under pytest's filterwarnings=error)
        finally:
            if log is not None:
                log.close()
        output = "".join(captured)
        if expired.is_set():
            raise ToolTimeoutError(f"`{command.redact(shlex.join(command.argv[:3]))}` did not finish within "
                                   f"{timeout:g} s and was stopped", tail="".join(tail))
        if check and returncode != 0:
            where = f" (log: {log_file})" if log_file else ""
            raise ToolFailedError(
                f"`{command.redact(shlex.join(command.argv[:3]))}` exited with status {returncode}{where}",
                tail="".join(tail),
            )
        return Result(returncode, output)


def _expire(proc: subprocess.Popen[str], expired: threading.Event) -> None:
    expired.set()
    _reap(proc)


def _reap(proc: subprocess.Popen[str]) -> None:
    """End a child this process stops waiting for (Ctrl-C, a timeout), and wait for it: the caller is about
    to remove folders the child may still be writing into."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=REAP_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def format_argv(argv: Sequence[str]) -> str:
    return shlex.join(argv)
