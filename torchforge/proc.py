"""The one place torchforge starts subprocesses.

Every external command (patchelf, conda build, nvcc, anaconda, git ...) goes through a `Runner`, so that
`--dry-run` prints exactly what would run, logs get the argv and environment that were used, and secrets
handed to a command are masked wherever the command line or its output is shown.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from torchforge.errors import ToolFailedError, ToolMissingError, ToolTimeoutError

TAIL_LINES = 40
# wait4's ru_maxrss of a direct child counts the parent's memory too: at exec, Linux records the hiwater of the
# memory the child was forked with (this Python's, hundreds of MB under a test runner) as the child's peak. So a
# measured command runs as the child of a small launcher (python -I -S, a few MB), which waits for it and writes
# the child's own ru_maxrss (its tree's largest process) to the fd it is given; signals are passed on to the child
# and its exit status is the launcher's.
_PEAK_LAUNCHER = """
import os, signal, sys
fd = int(sys.argv[1])
pid = os.fork()
if pid == 0:
    os.close(fd)
    try:
        os.execvp(sys.argv[2], sys.argv[2:])
    except OSError as exc:
        os.write(2, ("cannot run `%s`: %s\\n" % (sys.argv[2], exc.strerror)).encode())
    os._exit(127)
def forward(signum, frame):
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass
for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(number, forward)
_, status, usage = os.wait4(pid, 0)
os.write(fd, str(usage.ru_maxrss).encode())
os.close(fd)
code = os.waitstatus_to_exitcode(status)
if code < 0:
    signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
sys.exit(code)
"""
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
    # Run in a process group of its own, stopped whole at a timeout or Ctrl-C: a script's children (`sleep 600`
    # under a shell) would otherwise outlive it and hold its output open, so the read never ends (issue 40 item 14).
    own_group: bool = False
    # Measure the peak memory of its tree (an engine's build): run under a small launcher, see _PEAK_LAUNCHER.
    measure_peak: bool = False

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
    # The largest resident memory of one process of the command's tree (the command, or a compiler it ran and
    # waited for), from wait4's rusage; 0 where it cannot be read (dry run, no wait4).
    peak_rss_kib: int = 0


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
        meter = _PeakMeter(command, env) if command.measure_peak else None
        try:
            proc = _start(command, env, meter)
            assert proc.stdout is not None
            # A child that never ends and never writes would block the read below forever: a timer ends it.
            expired = threading.Event()
            stopped: list[str] = []  # what the timer stopped, for the message
            timer = threading.Timer(timeout, _expire, (proc, expired, command.own_group, stopped)) \
                if timeout is not None else None
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
                returncode, peak = _wait(proc)
                peak = meter.peak() if meter else peak
            except BaseException:
                _reap(proc, command.own_group)
                raise
            finally:
                if timer is not None:
                    timer.cancel()
                proc.stdout.close()  # else a ResourceWarning (an error under pytest's filterwarnings=error)
        finally:
            if log is not None:
                log.close()
            if meter:
                meter.close()
        output = "".join(captured)
        if expired.is_set():
            what = f" (stopped: {'; '.join(stopped)})" if stopped else ""
            raise ToolTimeoutError(f"`{command.redact(shlex.join(command.argv[:3]))}` did not finish within "
                                   f"{timeout:g} s and was stopped{command.redact(what)}", tail="".join(tail))
        if check and returncode != 0:
            where = f" (log: {log_file})" if log_file else ""
            raise ToolFailedError(
                f"`{command.redact(shlex.join(command.argv[:3]))}` exited with status {returncode}{where}",
                tail="".join(tail), returncode=returncode, peak_rss_kib=peak,
            )
        return Result(returncode, output, peak_rss_kib=peak)


def _start(command: Command, env: Mapping[str, str], meter: _PeakMeter | None) -> subprocess.Popen[str]:
    """The child, its output and errors on one pipe; under the peak launcher where `meter` is given."""
    try:
        return subprocess.Popen(
            meter.argv if meter else list(command.argv),
            cwd=command.cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
            start_new_session=command.own_group,
            pass_fds=meter.pass_fds if meter else (),
        )
    except OSError as exc:  # not found, not executable, bad interpreter line, exec format error
        raise ToolMissingError(f"cannot run `{command.argv[0]}`: {exc.strerror}") from exc
    finally:
        if meter:
            meter.started()


class _PeakMeter:
    """The launcher of a measured command and the pipe it reports the command's peak on."""

    def __init__(self, command: Command, env: Mapping[str, str]) -> None:
        program = command.argv[0]
        if os.sep not in program and shutil.which(program, path=env.get("PATH")) is None:
            raise ToolMissingError(f"cannot run `{program}`: No such file or directory")
        self._read, self._write = os.pipe()
        self.pass_fds = (self._write,)
        self.argv = [sys.executable, "-I", "-S", "-c", _PEAK_LAUNCHER, str(self._write), *command.argv]

    def started(self) -> None:
        """The launcher holds the write end now (or never will): ours is closed, so a read ends when it ends."""
        if self._write >= 0:
            os.close(self._write)
            self._write = -1

    def peak(self) -> int:
        """The command's peak RSS in KiB, as the launcher measured it (0: it was stopped before it could say)."""
        with os.fdopen(os.dup(self._read), "rb") as reader:
            text = reader.read().decode("ascii", "replace").strip()
        return int(text) if text.isdigit() else 0

    def close(self) -> None:
        self.started()
        os.close(self._read)


def _wait(proc: subprocess.Popen[str]) -> tuple[int, int]:
    """(exit status, peak RSS in KiB) of a child: wait4 gives the largest RSS of the child and of every
    descendant it waited for (ru_maxrss), what the build's biggest compiler used."""
    if not hasattr(os, "wait4"):
        return proc.wait(), 0
    try:
        _, status, usage = os.wait4(proc.pid, 0)
    except ChildProcessError:  # reaped elsewhere (the timer's _reap): Popen has its status
        return proc.wait(), 0
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, int(usage.ru_maxrss)


def _expire(proc: subprocess.Popen[str], expired: threading.Event, group: bool, stopped: list[str]) -> None:
    expired.set()
    stopped.extend(group_members(proc.pid) if group else [])
    _reap(proc, group)


def _reap(proc: subprocess.Popen[str], group: bool = False) -> None:
    """End a child this process stops waiting for (Ctrl-C, a timeout), and wait for it: the caller is about
    to remove folders the child may still be writing into. `group`: every process of its group, children too."""
    if group:
        _signal_group(proc.pid, signal.SIGTERM)
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=REAP_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if group:
        _signal_group(proc.pid, signal.SIGKILL)  # a member that ignored SIGTERM


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass  # the group has ended


def group_members(pgid: int) -> list[str]:
    """`pid 123: sleep 600` for each process of the group (read from /proc; [] where it cannot be read)."""
    members = []
    for stat in sorted(Path("/proc").glob("[0-9]*/stat"), key=lambda p: int(p.parent.name)):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
            if int(fields[2]) != pgid:
                continue
            argv = (stat.parent / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        line = " ".join(" ".join(a.decode("utf-8", "replace").split()) for a in argv if a)
        members.append(f"pid {stat.parent.name}: {line[:60] + '...' if len(line) > 60 else line}")
    return members


def format_argv(argv: Sequence[str]) -> str:
    return shlex.join(argv)
