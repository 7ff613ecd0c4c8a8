"""conda-build: `conda build RECIPE --python X.Y --output-folder STAGING -c file://OUT ... --override-channels`."""

from __future__ import annotations

from torchforge.engines import BuildJob, which
from torchforge.proc import Command
from torchforge.render import RecipeFormat


class CondaBuildEngine:
    name = "conda-build"
    recipe_format = RecipeFormat.CONDA_BUILD

    def available(self) -> bool:
        # `conda build` is a conda subcommand provided by the conda-build package: both must be there.
        return which("conda") is not None and which("conda-build") is not None

    def command(self, job: BuildJob) -> Command:
        argv = ["conda", "build", str(job.recipe_dir)]
        if job.python:
            argv += ["--python", job.python]
        argv += ["--output-folder", str(job.staging_dir)]
        if job.work_dir is not None:
            argv += ["--croot", str(job.work_dir)]
        for channel in job.channels:
            argv += ["-c", channel]
        # --override-channels: only the local channel and the ones asked for, never a user's .condarc defaults;
        # --no-anaconda-upload: publishing is `torchforge upload`'s job.
        argv += ["--override-channels", "--no-anaconda-upload"]
        if not job.test:
            argv.append("--no-test")
        return Command(argv=tuple(argv), env=dict(job.env))
