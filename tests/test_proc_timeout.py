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


def test_a_command_in_its_own_group_is_stopped_with_its_children_and_they_are_named() -> None:
    """A script whose child never ends holds the output open after the script itself is stopped: without the
    group the read would wait for `sleep 600` (issue 40 item 14)."""
    with pytest.raises(ToolTimeoutError) as stopped:  # without the group: the read waits 600 s for `sleep`
        Runner().run(Command(argv=("sh", "-c", "sleep 600; echo never"), own_group=True), check=False, timeout=1)
    assert "did not finish within 1 s and was stopped (stopped: pid " in stopped.value.message
    assert ": sleep 600" in stopped.value.message, stopped.value.message
