"""Run py-rattler work in a short-lived child process that ends with os._exit once its result is written.

py-rattler 0.28 crashes now and then at interpreter shutdown, after its work is done (SIGSEGV or SIGABRT
while its runtime's threads are torn down; docs/upstream-reports.md). A process that skips the teardown
never does. So no torchforge process that goes on after py-rattler work imports rattler itself: solve,
install, index and the upload check run here, and the caller gets their return value or their error.

The child is not retried: a crash is reported with its signal, never hidden.
"""

from __future__ import annotations

import importlib
import os
import pickle
import re
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from torchforge import fileops
from torchforge.errors import ForgeError, ToolFailedError
from torchforge.proc import Command, Runner

# py-rattler's errors from the Rust side carry the system's error as "... (os error 28)", and often the path.
_OS_ERROR = re.compile(r"\(os error (\d+)\)")
_PATH = re.compile(r"`([^`]+)`|path: ([^,\s]+)")


def call(target: str, *args: Any, **kwargs: Any) -> Any:
    """`module:function(*args, **kwargs)` in a child process; its result, or its ForgeError / OSError raised here."""
    with fileops.private_scratch("rattler") as work:
        request, answer = work / "request.pickle", work / "answer.pickle"
        request.write_bytes(pickle.dumps((target, args, kwargs)))
        command = Command(argv=(sys.executable, "-m", "torchforge.rattlerchild", str(request), str(answer)))
        done = Runner().run(command, check=False)
        if done.returncode in (-signal.SIGINT, 130):
            raise KeyboardInterrupt
        if done.returncode != 0 or not answer.is_file():
            raise ToolFailedError(f"py-rattler ({target}) ended with {_status(done.returncode)} before its result "
                                  f"was written{_panic(done.output)}", _hint(done.output), tail=done.output[-4000:])
        kind, *payload = pickle.loads(answer.read_bytes())
    if kind == "ok":
        return payload[0]
    if _panic(done.output):
        # A panic py-rattler caught and turned into an error ("the operation was cancelled") is still a crash:
        # said as the panic it was, as when it aborts the child.
        raise ToolFailedError(f"py-rattler ({target}) failed{_panic(done.output)}", _hint(done.output),
                              tail=done.output[-4000:])
    if kind == "forge":
        module, name, message, hint = payload
        raise getattr(importlib.import_module(module), name)(message, hint)
    if kind == "os":
        raise OSError(*payload)
    raise RuntimeError(f"py-rattler ({target}): {payload[0]}")


def _status(returncode: int) -> str:
    if returncode < 0:
        return f"signal {signal.Signals(-returncode).name}"
    return f"exit status {returncode}"


def _panic(output: str) -> str:
    """The message of a Rust panic in the child's output (the line after "panicked at"), not its backtrace."""
    lines = output.splitlines()
    for number, line in enumerate(lines[:-1]):
        if " panicked at " in line:
            return f": it panicked: {lines[number + 1].strip()[:400]}"
    return ""


def _hint(output: str) -> str:
    if _panic(output):
        return ("py-rattler crashed on what it was reading: check the channel's packages (a damaged or hostile one "
                "does this); if they are sound, report it with this message")
    return "run the command again; if it recurs, report it with this message"


def _end_with_parent() -> None:
    """End this child when the process that started it is gone (killed by SIGKILL): an orphan would go on
    writing into a folder the rerun removes."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.2)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def _answer(target: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    module, _, name = target.partition(":")
    try:
        return ("ok", getattr(importlib.import_module(module), name)(*args, **kwargs))
    except ForgeError as exc:
        return ("forge", type(exc).__module__, type(exc).__qualname__, exc.message, exc.hint)
    except OSError as exc:
        return ("os", exc.errno, exc.strerror, exc.filename)
    except Exception as exc:
        return _os_error(exc) or ("bug", f"{type(exc).__name__}: {exc}")  # a bug: reported as an internal error


def _os_error(exc: Exception) -> tuple[Any, ...] | None:
    """A py-rattler error that is a system error (a full disk, a read-only folder) as ("os", errno, text, path):
    the caller translates it like any OSError (fileops.translate), not as a bug."""
    text = str(exc)
    found = _OS_ERROR.search(text)
    if found is None:
        return None
    number = int(found.group(1))
    path = _PATH.search(text)
    return ("os", number, os.strerror(number), (path.group(1) or path.group(2)) if path else None)


def _main(request: Path, answer: Path) -> None:
    _end_with_parent()
    target, args, kwargs = pickle.loads(request.read_bytes())
    outcome = _answer(target, args, kwargs)
    with answer.open("wb") as out:
        pickle.dump(outcome, out)
    sys.stdout.flush()
    sys.stderr.flush()
    # The answer is written and flushed: end without interpreter teardown, where py-rattler crashes.
    os._exit(0)


if __name__ == "__main__":
    _main(Path(sys.argv[1]), Path(sys.argv[2]))
