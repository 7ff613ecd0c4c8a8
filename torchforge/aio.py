"""Run py-rattler's coroutines so that a Ctrl-C is never lost."""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Coroutine
from types import FrameType
from typing import Any, TypeVar

T = TypeVar("T")


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run`, except that a Ctrl-C always ends in KeyboardInterrupt.

    asyncio.run answers SIGINT by cancelling its task and raises KeyboardInterrupt only if that task ends
    cancelled; a py-rattler future that completes anyway returns normally, the Ctrl-C is lost and the command
    exits 0. asyncio installs its handler only over Python's default one, so a plain raising handler of our own
    keeps it out and the interrupt reaches the caller. A handler someone else set (a deferred interrupt) stays.
    """
    if threading.current_thread() is not threading.main_thread() or (
        signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        return asyncio.run(coro)
    previous = signal.signal(signal.SIGINT, _raise_interrupt)
    try:
        return asyncio.run(coro)
    finally:
        signal.signal(signal.SIGINT, previous)
