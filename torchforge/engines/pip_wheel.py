"""`--format wheel`'s engine: `pip wheel SOURCE --no-deps --no-build-isolation -w STAGING` in the current
interpreter. It reads no recipe folder: the job names the source, and its environment is the variant's (see
torchforge/wheelbuild.py), with the compile cache's variables where the cache is on. The pipeline then repairs
the wheel into the output folder (torchforge.wheel.repair) instead of publishing a conda package.

With the compile cache, setuptools' and ninja's compiles use $CC / $CXX, which no CMake launcher reaches: the
command sources the cache's route.sh first (as the conda recipes' build scripts do), which points them at the
cache's compiler wrappers.
"""

from __future__ import annotations

import importlib.util
import sys

from torchforge.compilecache import COMPILERS_VARIABLE
from torchforge.engines import BuildJob
from torchforge.errors import UsageError
from torchforge.proc import Command

NAME = "pip"
# route.sh, then pip: "$@" is pip's argv, so the command line stays the one without the cache after `--`.
_ROUTE_THEN_RUN = f'. "${COMPILERS_VARIABLE}/route.sh" && exec "$@"'


class PipWheelEngine:
    name = NAME
    # None: it reads no recipe folder, and a wheel plan renders none (the protocol's attribute is the conda
    # engines' recipe format, a type of the official flavour's render module, which engines here do not import).
    recipe_format = None

    def available(self) -> bool:
        return importlib.util.find_spec("pip") is not None

    def command(self, job: BuildJob) -> Command:
        if not job.source:
            raise UsageError("--format wheel needs --source (a PyTorch checkout with its submodules)",
                             "pass --source PATH_TO_CHECKOUT (or a URL pip can build from)")
        # -v: setuptools' compiler lines reach the log, which the compile cache's statistics count
        pip = (sys.executable, "-m", "pip", "wheel", job.source, "--no-deps", "--no-build-isolation", "-v",
               "-w", str(job.staging_dir))
        env = dict(job.env)
        if COMPILERS_VARIABLE not in env:
            return Command(argv=pip, env=env)
        # route.sh asks $PYTHON's sysconfig for the compiler setuptools would use
        return Command(argv=("bash", "-c", _ROUTE_THEN_RUN, "pip-wheel", *pip), env={**env, "PYTHON": sys.executable})
