"""The one runner's time limit ends a child that never writes and never exits (a hung interpreter, a client
waiting on a dead server): the read of its output cannot block past the limit (issue 34, item 10)."""

from __future__ import annotations

import pytest

from torchforge.errors import ToolFailedError, ToolTimeoutError
from torchforge.proc import Command, Runner


def test_a_silent_child_past_its_time_limit_is_stopped_and_named() -> None:
    with pytest.raises(ToolTimeoutError) as stopped:
        Runner().run(Command(argv=("sleep", "60")), check=False, timeout=1)
    assert stopped.value.message == "`sleep 60` did not finish within 1 s and was stopped"
    assert isinstance(stopped.value, ToolFailedError)  # callers that handle a failed tool handle this too


def test_a_child_that_ends_in_time_is_not_affected() -> None:
    done = Runner().run(Command(argv=("sh", "-c", "echo ready")), timeout=30)
    assert done.returncode == 0 and done.output == "ready\n"
