"""The machine `make docs` runs its machine-dependent (`sample`) examples on, the same wherever it runs: a user,
mount and network namespace (`unshare`, no privileges needed) in which

- the checkout is at /tmp/torchfg, as long as `~/torchforge`, the name the example shows it by: rich lays a table
  out for the text the reader sees, so no cell is padded or wrapped for another machine's path;
- /tmp is a tmpfs of DISK_GIB (the free disk doctor reports for the output folder), /proc/meminfo says MEMORY_KB
  available, the command runs on CORES CPUs;
- PATH is the checkout's .venv/bin and /usr/local/bin, a tmpfs holding only the stand-in tools of STAND_INS (the
  CUDA 13.0 toolkit's nvcc without its libraries, gcc 12.2.0, cmake, git): this machine's own tools, conda,
  docker, nvidia-smi ... are not on it;
- no network (a channel does not answer), a clean environment (no CI, proxy or CUDA_HOME variables), HOME empty.

Where the namespaces cannot be made (no `unshare`, user namespaces disabled) the example cannot be regenerated
the same everywhere, and `make docs` says so (ShownMachineError) instead of writing this machine's figures.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHOWN_ROOT = "/tmp/torchfg"  # as long as "~/torchforge"
DISK_GIB = 45
MEMORY_KB = 20866662  # 19.9 GiB available
CORES = 2
HOME = "/tmp/home"
# What the stand-ins answer, as the real tools do (nvcc's banner of CUDA 13.0, gcc -dumpfullversion ...).
STAND_INS = {
    "nvcc": "echo 'nvcc: NVIDIA (R) Cuda compiler driver'; echo 'Cuda compilation tools, release 13.0, V13.0.88'",
    "gcc": "echo 12.2.0",
    "g++": "echo 12.2.0",
    "cmake": "echo 'cmake version 3.25.1'",
    "git": "echo 'git version 2.39.5'",
}
MEMINFO = f"MemTotal:       {MEMORY_KB * 2} kB\nMemFree:        {MEMORY_KB} kB\nMemAvailable:   {MEMORY_KB} kB\n"


class ShownMachineError(RuntimeError):
    """The documentation machine cannot be made here."""


def _script(command: str) -> str:
    """The shell script run as the namespace's root: the mounts, then `command` at the shown checkout."""
    root = shlex.quote(str(ROOT))
    lines = [
        "set -e",
        "PATH=/usr/sbin:/usr/bin:/sbin:/bin",  # the namespace's own setup; the command gets DOC_PATH
        f"case {root}/ in /tmp/*|/usr/local/*|/proc/*) echo 'the checkout is under a folder the documentation machine "
        "replaces (/tmp, /usr/local)' >&2; exit 97;; esac",
        f"mount -t tmpfs -o size={DISK_GIB}G docs-disk /tmp",
        f"mkdir -p {SHOWN_ROOT} {HOME} /tmp/.machine",
        # each entry of the checkout bound into a folder on the tmpfs: the output folder's disk is the tmpfs
        f"for entry in {root}/* {root}/.[!.]*; do [ -e \"$entry\" ] || continue; name=${{entry##*/}}; "
        f"if [ -d \"$entry\" ]; then mkdir {SHOWN_ROOT}/\"$name\"; else : > {SHOWN_ROOT}/\"$name\"; fi; "
        f"mount --bind \"$entry\" {SHOWN_ROOT}/\"$name\"; done",
        f"printf %s {shlex.quote(MEMINFO)} > /tmp/.machine/meminfo",
        "mount --bind /tmp/.machine/meminfo /proc/meminfo",
        "mount -t tmpfs docs-tools /usr/local",
        "mkdir -p /usr/local/bin /usr/local/cuda/bin",
        *(f"printf '#!/bin/sh\\n%s\\n' {shlex.quote(text)} > /usr/local/bin/{name}; chmod 755 /usr/local/bin/{name}"
          for name, text in STAND_INS.items()),
        "ln -s /usr/local/bin/nvcc /usr/local/cuda/bin/nvcc",
        f"cd {SHOWN_ROOT}",
        'export PATH="$DOC_PATH"; unset DOC_PATH',
        f"exec {shlex.join(_argv(command))}",
    ]
    return "\n".join(lines)


def _argv(command: str) -> list[str]:
    """The command's words; a script of the checkout's venv (torchforge) run by the venv's python at the shown
    checkout, so that the process's own paths (sys.executable, the tools beside it) are the shown ones too."""
    argv = shlex.split(command, comments=True)
    venv_bin = Path(sys.executable).parent
    script = venv_bin / argv[0]
    if script.is_file() and script.read_bytes().startswith(b"#!") and b"python" in script.read_bytes()[:200]:
        shown_bin = f"{SHOWN_ROOT}/{venv_bin.relative_to(ROOT)}"
        return [f"{shown_bin}/python", f"{shown_bin}/{argv[0]}", *argv[1:]]
    return argv


def cores() -> set[int]:
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < CORES:
        raise ShownMachineError(f"the documentation machine has {CORES} CPUs; this one lets the process use "
                                f"{len(allowed)}")
    return set(allowed[:CORES])


def run(command: str, columns: str) -> str:
    """stdout and stderr of `command` (a documented `$` line) on the documentation machine, one stream."""
    unshare = shutil.which("unshare")
    if unshare is None:
        raise ShownMachineError("`unshare` (util-linux) is not installed")
    venv_bin = f"{SHOWN_ROOT}/{Path(sys.executable).parent.relative_to(ROOT)}"
    env = {"DOC_PATH": f"{venv_bin}:/usr/local/bin", "HOME": HOME, "COLUMNS": columns, "NO_COLOR": "1",
           "TERM": "dumb", "LANG": "C.UTF-8", "TMPDIR": "/tmp"}
    chosen = cores()
    done = subprocess.run([unshare, "--user", "--map-root-user", "--mount", "--net", "/bin/sh", "-c",
                           _script(command)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=600, preexec_fn=lambda: os.sched_setaffinity(0, chosen), cwd="/")
    if done.returncode == 97 or (done.returncode and "unshare:" in done.stdout):
        raise ShownMachineError(done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "unshare failed")
    return done.stdout


def probe() -> None:
    """ShownMachineError where the documentation machine cannot be made here, with what failed."""
    said = run("/bin/sh -c 'echo made'", "80")
    if said.strip() != "made":
        raise ShownMachineError(said.strip().splitlines()[-1] if said.strip() else "its setup failed")


def shown(text: str) -> str:
    """The shown checkout as the reader's clone (equal lengths: the layout stays as rich made it)."""
    return text.replace(SHOWN_ROOT, "~/torchforge")
