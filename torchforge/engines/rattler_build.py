"""The embedded rattler-build engine (py-rattler-build from PyPI), run as a worker subprocess.

Running it in a child process keeps one path for every build: the runner logs the exact command, streams
its output to the variant's log file, and a crash in the engine cannot take torchforge down with it.
"""

from __future__ import annotations

import sys

from torchforge.engines import BuildJob
from torchforge.proc import Command
from torchforge.templates import RecipeFormat


class RattlerBuildEngine:
    name = "rattler-build"
    recipe_format = RecipeFormat.RATTLER_BUILD

    def available(self) -> bool:
        try:
            import rattler_build  # noqa: F401
        except ImportError:
            return False
        return True

    def command(self, job: BuildJob) -> Command:
        argv = [sys.executable, "-m", "torchforge.engines.rattler_worker", "--recipe", str(job.recipe_dir),
                "--output-dir", str(job.staging_dir)]
        for channel in job.channels:
            argv += ["--channel", channel]
        for stem in job.outputs:
            argv += ["--fresh", stem]
        if not job.test:
            argv.append("--no-test")
        return Command(argv=tuple(argv), env=dict(job.env))
