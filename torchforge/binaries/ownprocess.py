"""A package build in a process of its own: a stack's largest package while the others build beside it.

The builds of a stack are threads of one process (torchforge.binaries.schedule). Their heavy work releases the
GIL, but each stream's feeding thread takes it back for every chunk: on the lent H200 (16 cores) the pytorch
package built alone in 11.4 s, and in 21-28 s beside 19 other builds while only 4-5 cores were busy
(tests/gpu/README.md, issue 42). In a process of its own it has a GIL of its own.

The child is spawned (a fresh interpreter: no lock of another thread is inherited), ignores Ctrl-C (the
parent stops it and reports the interrupt once), dies with the thread that started it (PR_SET_PDEATHSIG: a
killed repack leaves no child writing into its scratch folder), and sends each step, then its result or its
exception, over a queue. `check()` is the parent's: when it raises (another build failed, Ctrl-C), the child
is terminated and waited for before the exception goes on, so the scratch folder is removed only once
nothing writes into it.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import pickle
import queue
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torchforge.binaries.plan import PackagePlan
from torchforge.errors import BuildFailedError
from torchforge.proc import Runner
from torchforge.rpath import AuditReport

_CONTEXT = multiprocessing.get_context("spawn")
_PR_SET_PDEATHSIG = 1
_POLL_S = 0.1  # how often the parent checks its stop while the child works
Built = tuple[Path, AuditReport, tuple[str, ...]]


def build_archive_in_process(package: PackagePlan, out_folder: Path, runner: Runner, *,
                             on_step: Callable[[str], None], check: Callable[[], None],
                             **options: Any) -> Built:
    """torchforge.repack.build_archive(package, out_folder, ...) in a child process; the same result."""
    events: Any = _CONTEXT.Queue()
    child = _CONTEXT.Process(target=_child, args=(events, package, out_folder, runner.dry_run, options),
                             name=f"repack {package.filename}", daemon=True)
    child.start()
    try:
        return _follow(child, events, on_step, check)
    finally:
        if child.is_alive():
            child.terminate()
        child.join()
        events.close()


def _follow(child: Any, events: Any, on_step: Callable[[str], None], check: Callable[[], None]) -> Built:
    """The child's steps handed to `on_step` until it sends its result (returned) or its exception (raised)."""
    while True:
        check()
        try:
            kind, value = events.get(timeout=_POLL_S)
        except queue.Empty:
            if not child.is_alive():
                raise BuildFailedError(f"the build of {child.name.removeprefix('repack ')} ended without a "
                                       f"result (exit status {child.exitcode})", "rerun the same command") from None
            continue
        if kind == "step":
            on_step(value)
        elif kind == "error":
            raise value
        else:
            return value  # type: ignore[no-any-return]


def _picklable(value: object) -> bool:
    try:
        pickle.dumps(value)
    except Exception:
        return False
    return True


def _child(events: Any, package: PackagePlan, out_folder: Path, dry_run: bool, options: dict[str, Any]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops this process and reports the interrupt
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # no prctl (not Linux): the parent's terminate is the only stop
        pass
    from torchforge.repack import build_archive
    try:
        built = build_archive(package, out_folder, Runner(dry_run=dry_run),
                              on_step=lambda what: events.put(("step", what)), **options)
    except BaseException as exc:  # the parent raises it: the same failure as built in a thread
        events.put(("error", exc if _picklable(exc) else BuildFailedError(f"{type(exc).__name__}: {exc}")))
    else:
        events.put(("done", built))
    events.close()
    events.join_thread()
