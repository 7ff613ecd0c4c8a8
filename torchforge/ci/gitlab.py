"""`torchforge ci gitlab`: the GitLab CI pipeline of a `CiPlan` (torchforge.ci): the same jobs and graph as the
GitHub workflow, as GitLab stages, `needs:` and rules.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence

from ruamel.yaml.comments import CommentedMap
from ruamel.yaml.scalarstring import LiteralScalarString

from torchforge import platforms
from torchforge.ci import (
    ALL, ARCHIVE_GLOBS, CiPlan, Job, Provider, SMOKE_VARIABLE, TestJob, Upload, choice_description, header,
    load_data, note_channels, promote_commands, smoke_script, stats_command, test_commands, upload_command)


def _gitlab_bin(platform: str) -> str:
    return ".torchforge-venv/Scripts/" if platforms.get(platform).facts.windows else ".torchforge-venv/bin/"


def _gitlab_install(plan: CiPlan, platform: str) -> list[str]:
    packages = [plan.requirement]
    # A venv of the job's own: no root and no image assumptions; commands stay plain argv (any shell runs them).
    return ["python3 -m venv .torchforge-venv",
            _gitlab_bin(platform) + "python -m pip install " + " ".join(shlex.quote(p) for p in packages)]


def _gitlab_rule(values: Sequence[str]) -> str:
    return " || ".join(f'$TORCHFORGE_VARIANT == "{v}"' for v in values)


def _gitlab_build_job(plan: CiPlan, job: Job, names: Mapping[str, str]) -> CommentedMap:
    limits = load_data().limits
    bindir = _gitlab_bin(job.platform)
    body = CommentedMap()
    body["stage"] = job.kind
    body["tags"] = list(job.runner)
    body["timeout"] = limits.gitlab_build_timeout
    needs = [CommentedMap(job=names[n], artifacts=True) for n in job.needs]
    if job.after:
        # GitLab has no "after, whatever its result": the warm-up job is optional (absent when not chosen),
        # and a failed warm-up skips the other Pythons of that CUDA version.
        needs.append(CommentedMap(job=names[job.after], artifacts=False, optional=True))
    body["needs"] = needs
    body["rules"] = [CommentedMap({"if": _gitlab_rule(plan.run_selectors[job.key])})]
    derive = _gitlab_in_image(job, body)
    # GitLab overwrites a cache key in place, so one key per compile-cache group is reused by every Python
    # of that group; `when: always` keeps the objects of a failed or timed-out build.
    body["cache"] = CommentedMap(key=job.cache_prefix.rstrip("-"), paths=[job.cache_path + "/"], when="always")
    # Some builder images keep nvcc out of PATH; the checks before the build look for it there, the recipes in CUDA_HOME.
    toolkit = ['export PATH="$CUDA_HOME/bin:$PATH"'] if job.cuda_home else []
    remote = plan.remote_cache.gitlab_script() if plan.remote_cache is not None else []
    body["script"] = [*derive, *_gitlab_install(plan, job.platform), *toolkit, *remote, bindir + shlex.join(job.argv)]
    body["after_script"] = [bindir + stats_command(job)]
    body["artifacts"] = CommentedMap(paths=list(ARCHIVE_GLOBS), expire_in=f"{limits.artifact_days} days")
    return body


def _gitlab_in_image(job: Job, body: CommentedMap) -> list[str]:
    """Set the job's image and variables; the script lines that must run first in it (the derivation)."""
    if job.image:
        # The job runs in the CUDA version's build image (toolkit, cuDNN, NCCL, compiler, conda-build).
        body["image"] = job.image
    variables = job.image_env
    if variables:
        body["variables"] = CommentedMap(variables)
    # In a base image: the derivation's script adds conda + conda-build first (GitLab cannot pull the image
    # `torchforge build --container` derives locally), and its Python runs torchforge.
    # A subshell: the script's `set -eu` and `cd` must not outlive it (GitLab runs all lines in one shell).
    return [LiteralScalarString(f"(\n{job.derive_script})\n"), f'export PATH="{job.derive_prefix}/bin:$PATH"'] \
        if job.derive_script else []


def _gitlab_test_job(plan: CiPlan, test: TestJob, names: Mapping[str, str]) -> CommentedMap:
    build = test.build
    body = CommentedMap()
    body["stage"] = "test"
    # A CUDA variant's runner needs the GPU passed into its containers (docker executor: gpus = "all").
    body["tags"] = list(test.runner)
    body["timeout"] = load_data().limits.gitlab_test_timeout
    body["needs"] = [CommentedMap(job=names[n], artifacts=True) for n in test.needs]
    body["rules"] = [CommentedMap({"if": _gitlab_rule(plan.run_selectors[build.key])})]
    derive = _gitlab_in_image(build, body)
    bindir = _gitlab_bin(build.platform)
    body["script"] = [*derive, *_gitlab_install(plan, build.platform), *test_commands(plan, test, bindir)]
    return body


def _gitlab_promote_job(plan: CiPlan, upload: Upload) -> CommentedMap:
    platform = plan.jobs[0].platform
    body = CommentedMap()
    body["stage"] = "promote"
    body["tags"] = list(upload.runner)
    body["timeout"] = load_data().limits.gitlab_upload_timeout
    body["needs"] = [CommentedMap(job="upload", artifacts=False)]
    # Started by hand once the staged packages were looked at; the pipeline waits for it.
    body["rules"] = [CommentedMap({"if": '$TORCHFORGE_UPLOAD == "true"', "when": "manual"})]
    body["environment"] = CommentedMap(name=load_data().upload.promote_environment)
    body["script"] = [*_gitlab_install(plan, platform), *promote_commands(upload, _gitlab_bin(platform))]
    return body


def _gitlab_upload_job(plan: CiPlan, upload: Upload, names: Mapping[str, str]) -> CommentedMap:
    limits = load_data().limits
    platform = plan.jobs[0].platform
    body = CommentedMap()
    body["stage"] = "upload"
    body["tags"] = list(upload.runner)
    body["timeout"] = limits.gitlab_upload_timeout
    # Optional: jobs left out by the variant choice do not block the upload of the ones that ran; a failed
    # test job does (GitLab starts a job only after every job it needs succeeded).
    body["needs"] = [CommentedMap(job=names[j.key], artifacts=True, optional=True) for j in plan.jobs] + \
        [CommentedMap(job=names[t.key], artifacts=False, optional=True) for t in plan.tests]
    body["rules"] = [CommentedMap({"if": '$TORCHFORGE_UPLOAD == "true"'})]
    # A protected environment limits the token variable to protected branches and can require approval.
    body["environment"] = CommentedMap(name=load_data().upload.environment)
    body["script"] = [*_gitlab_install(plan, platform), upload_command(upload, _gitlab_bin(platform))]
    return body


def gitlab_pipeline(plan: CiPlan) -> CommentedMap:
    # GitLab job names can hold dots, so jobs carry the package ids users know from `torchforge matrix`.
    # Two tests of one job and Python (a stack's one job builds pytorch and its extensions) keep their keys.
    shared = {t.name for t in plan.tests if [u.name for u in plan.tests].count(t.name) > 1}
    names = {job.key: job.package for job in plan.jobs} | {t.key: t.key if t.name in shared else t.name
                                                            for t in plan.tests}
    doc = CommentedMap()
    # Like workflow_dispatch: multi-hour pipelines start from the web form, the API or a trigger, never on push.
    sources = " || ".join(f'$CI_PIPELINE_SOURCE == "{s}"' for s in ("web", "api", "trigger"))
    doc["workflow"] = CommentedMap(name="torchforge $TORCHFORGE_VARIANT", rules=[CommentedMap({"if": sources})])
    variables = CommentedMap()
    variables["TORCHFORGE_VARIANT"] = CommentedMap(
        value=ALL, options=list(plan.choices),
        description=choice_description(plan),
    )
    if plan.upload is not None:
        variables["TORCHFORGE_UPLOAD"] = CommentedMap(
            value="true", options=["true", "false"], description=f"Upload the packages to {plan.upload.target}")
    if plan.tests and not plan.test_script:
        # No description: not a field of the run form. Not expanded: the text is Python, not GitLab variables.
        variables[SMOKE_VARIABLE] = CommentedMap(value=LiteralScalarString(smoke_script()), expand=False)
    doc["variables"] = variables
    staged = plan.upload is not None and bool(plan.upload.staging)
    doc["stages"] = [*plan.build_stages, "test"] + (["upload"] if plan.upload is not None else []) + \
        (["promote"] if staged else [])
    for job in plan.jobs:
        doc[names[job.key]] = _gitlab_build_job(plan, job, names)
        note_channels(doc, job, indent=0, key=names[job.key])
    for test in plan.tests:
        doc[names[test.key]] = _gitlab_test_job(plan, test, names)
    if plan.upload is not None:
        doc["upload"] = _gitlab_upload_job(plan, plan.upload, names)
        if plan.upload.staging:
            doc["promote"] = _gitlab_promote_job(plan, plan.upload)
    doc.yaml_set_start_comment(header(plan, Provider.GITLAB))
    return doc


# ---- output -------------------------------------------------------------------------------------------------
