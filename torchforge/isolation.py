"""Running code torchforge did not write (an sdist's setup.py) with no network and no writes outside given folders.

A command is wrapped as `unshare --user --map-root-user --net --mount -- PYTHON isolation_child.py WRITABLE... --
ARGV`: util-linux's unshare gives it a user namespace (no privileges needed), a network namespace with only a
loopback interface that is down (no address, local or remote, is reachable: a socket opened directly fails as
well as a proxy-aware download), and a mount namespace where torchforge/isolation_child.py remounts every mount
read-only except the writable folders. Where the machine refuses user namespaces (a kernel with
`kernel.unprivileged_userns_clone=0` or `user.max_user_namespaces=0`, a container runtime's seccomp profile,
Ubuntu's AppArmor restriction), torchforge refuses to run the code (exit 5) and says what would work, unless
TORCHFORGE_UNISOLATED=1 is set, which runs it unisolated after a warning.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
from collections.abc import Sequence
from functools import cache
from pathlib import Path

from torchforge.console import warn
from torchforge.errors import ToolFailedError, ToolMissingError
from torchforge.proc import Command, Runner

UNSHARE = ("unshare", "--user", "--map-root-user", "--net", "--mount")
CHILD = Path(__file__).with_name("isolation_child.py")
UNISOLATED_VARIABLE = "TORCHFORGE_UNISOLATED"
HINT = ("allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1 and user.max_user_namespaces "
        "> 0; in a container: `docker run --security-opt seccomp=unconfined`, or `--privileged`), install util-linux's "
        f"`unshare`, or set {UNISOLATED_VARIABLE}=1 to run the sdist's code on this machine as it is (network and "
        "all your files within its reach)")


def child_script() -> str:
    """The in-namespace half, for a recipe to carry (the build runs it with its own Python)."""
    return CHILD.read_text()


def wrap(command: Command, writable: Sequence[Path], python: str = sys.executable) -> Command:
    """`command` run in the namespaces, `writable` (created) its only writable folders, the first its TMPDIR."""
    for folder in writable:
        folder.mkdir(parents=True, exist_ok=True)
    argv = (*UNSHARE, "--", python, str(CHILD), *(str(p.resolve()) for p in writable), "--", *command.argv)
    return dataclasses.replace(command, argv=argv)


@cache
def _unavailable() -> str | None:
    """Why this machine cannot isolate (None: it can): the wrapper run once on `true`."""
    with tempfile.TemporaryDirectory(prefix="torchforge-isolation-") as tmp:
        try:
            Runner().run(wrap(Command(("true",)), [Path(tmp)]))
        except (ToolMissingError, ToolFailedError) as exc:
            return " ".join((str(exc), getattr(exc, "tail", "") or "")).strip()
    return None


def required(what: str) -> bool:
    """True: `what` (whose code runs, for the messages) runs isolated; False: this machine cannot isolate and
    TORCHFORGE_UNISOLATED=1 lets it run as it is (after a warning). Refused (exit 5) otherwise."""
    why = _unavailable()
    if why is None:
        return True
    if os.environ.get(UNISOLATED_VARIABLE) == "1":
        warn(f"{what} runs WITHOUT isolation ({UNISOLATED_VARIABLE}=1): it can reach the network and write "
             f"wherever you can (this machine cannot isolate it: {why.splitlines()[0]})")
        return False
    raise ToolMissingError(f"{what} must run isolated (no network, no writes outside its folder), and this machine "
                           f"cannot isolate it: {why}", HINT)


def isolated(command: Command, writable: Sequence[Path], what: str) -> Command:
    """`command` isolated (`required`), or as it is where TORCHFORGE_UNISOLATED=1 allows that."""
    return wrap(command, writable) if required(what) else command
