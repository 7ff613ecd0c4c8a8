"""`torchforge ci github`: the GitHub Actions workflow of a `CiPlan` (torchforge.ci): a build job per recipe
(in its image through `torchforge build --container`), a test job per Python, the upload and promote jobs after
every test.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from ruamel.yaml.comments import CommentedMap
from ruamel.yaml.scalarstring import LiteralScalarString

from torchforge.ci import (
    ALL, ARCHIVE_GLOBS, CHANNEL_DIR, CiPlan, Job, Provider, SMOKE_VARIABLE, TestJob, Upload, choice_description,
    header, load_data, note_channels, promote_commands, smoke_script, stats_command, test_commands, timeout_minutes,
    upload_command)


def _uses(step: CommentedMap, name: str) -> CommentedMap:
    action = load_data().actions[name]
    step["uses"] = action.ref
    step.yaml_add_eol_comment(action.version, "uses")
    return step


def _step(name: str, run: str, when: str | None = None) -> CommentedMap:
    # Key order of every step: name, if, uses or run, with, env.
    step = CommentedMap(name=name)
    if when is not None:
        step["if"] = when
    step["run"] = run
    return step


def _action_step(name: str, action: str, with_: Mapping[str, Any] | None = None, when: str | None = None) -> CommentedMap:
    step = CommentedMap(name=name)
    if when is not None:
        step["if"] = when
    _uses(step, action)
    if with_:
        step["with"] = CommentedMap(with_)
    return step


def _runs_on(labels: tuple[str, ...]) -> str | list[str]:
    return labels[0] if len(labels) == 1 else list(labels)


def _github_container_steps(plan: CiPlan, job: Job) -> list[CommentedMap]:
    """The first steps of a job running in its image: no setup-python (its Python is the image's, or the
    derivation's conda), torchforge in a venv of the job's own, put on PATH for the later steps."""
    steps = [_action_step("Check out", "checkout", {"persist-credentials": False})]
    if job.derive_script:
        added = f" and cuDNN {job.derive_cudnn}" if job.derive_cudnn else ""
        steps.append(_step(f"Add conda-build{added} to the image (torchforge's derivation)",
                           LiteralScalarString(job.derive_script + f'echo "{job.derive_prefix}/bin" >> "$GITHUB_PATH"\n')))
    install = ["python3 -m venv .torchforge-venv",
               ".torchforge-venv/bin/python -m pip install " + shlex.quote(plan.requirement),
               'echo "$PWD/.torchforge-venv/bin" >> "$GITHUB_PATH"']
    if job.cuda_home:
        install.append('echo "$CUDA_HOME/bin" >> "$GITHUB_PATH"')  # the checks look for nvcc on PATH
    steps.append(_step("Install torchforge", LiteralScalarString("\n".join(install) + "\n")))
    return steps


def _github_setup_steps(plan: CiPlan) -> list[CommentedMap]:
    tools = load_data().tools
    packages = [plan.requirement]
    return [
        # No token left in .git/config for later steps (zizmor: artipacked).
        _action_step("Check out", "checkout", {"persist-credentials": False}),
        _action_step("Set up Python for torchforge", "setup-python", {"python-version": tools.python}),
        _step("Install torchforge", "python -m pip install " + " ".join(shlex.quote(p) for p in packages)),
    ]


def _in_list(values: Sequence[str], expression: str) -> str:
    # fromJSON of a literal list: one `contains` instead of a chain of ==.
    items = ",".join(f'"{v}"' for v in values)
    return f"contains(fromJSON('[{items}]'), {expression})"


def _github_build_job(plan: CiPlan, job: Job) -> CommentedMap:
    data = load_data()
    limits = data.limits
    condition = _in_list(plan.run_selectors[job.key], "inputs.variant")
    needs = list(job.needs) + ([job.after] if job.after else [])
    if job.after:
        # Start after the warm-up job whatever its result, but only if the magma package was built.
        hard = " && ".join(f"needs.{n}.result == 'success'" for n in job.needs)
        condition = "!cancelled() && " + (hard + " && " if hard else "") + condition
    cache_key = job.cache_prefix + "${{ github.run_id }}-${{ github.run_attempt }}-" + job.key
    cache_with = {"path": job.cache_path, "key": cache_key}
    steps = _github_container_steps(plan, job) if job.in_container else _github_setup_steps(plan)
    for need in job.needs:
        steps.append(_action_step(f"Download the packages of {need}", "download-artifact",
                                  {"name": f"packages-{need}", "path": CHANNEL_DIR}))
    steps += [
        _action_step("Restore the compile cache", "cache-restore", {**cache_with, "restore-keys": job.cache_prefix}),
        # Where the image cannot host the JavaScript actions (checkout, cache, artifacts need glibc 2.28:
        # actions/checkout#1590, e.g. the CentOS 7 builder images), only the build runs in it, through the
        # runner's docker; a `container:` job is already inside it.
        _build_step(plan, job),
        _step("Compile cache statistics", stats_command(job, plan.remote_cache is not None), when="${{ always() }}"),
        # Saved even when the build fails or times out: the next attempt resumes from the objects compiled so far.
        _action_step("Save the compile cache", "cache-save", cache_with, when="${{ always() }}"),
        _action_step("Keep the packages for later jobs", "upload-artifact", {
            "name": f"packages-{job.key}",
            "path": LiteralScalarString("\n".join(ARCHIVE_GLOBS) + "\n"),
            "if-no-files-found": "error",
            "retention-days": limits.artifact_days,
        }),
    ]
    body = CommentedMap()
    body["name"] = job.package
    if needs:
        body["needs"] = needs
    body["if"] = "${{ " + condition + " }}"
    body["runs-on"] = _runs_on(job.runner)
    if job.in_container:
        body["container"] = CommentedMap(image=job.image)
        env = job.image_env
        if env:
            body["env"] = CommentedMap(env)
    body["timeout-minutes"] = timeout_minutes(job.runner)
    body["permissions"] = CommentedMap({"contents": "read"})
    body["steps"] = steps
    return body


def _build_step(plan: CiPlan, job: Job) -> CommentedMap:
    step = _step(f"Build {job.package}",
                 shlex.join([*job.argv, "--container"] if job.image and not job.in_container else job.argv))
    if plan.remote_cache is not None:  # its secrets reach only this step, by name
        step["env"] = plan.remote_cache.github_env()
    return step


def _github_upload_job(plan: CiPlan, upload: Upload) -> CommentedMap:
    data = load_data()
    steps = _github_setup_steps(plan)
    steps.append(_action_step("Download every package", "download-artifact",
                              {"pattern": "packages-*", "path": CHANNEL_DIR, "merge-multiple": True}))
    where = f" (label {upload.staging})" if upload.staging else ""
    step = _step(f"Upload to {upload.target}{where}", upload_command(upload, ""))
    if upload.token_vars:
        # The secret reaches only this step's environment, by name; torchforge reads it and masks it.
        step["env"] = CommentedMap({name: "${{ secrets." + name + " }}" for name in upload.token_vars})
    steps.append(step)
    body = CommentedMap()
    body["name"] = f"upload to {upload.target}"
    # After the tests: a package whose test failed or did not run is never uploaded.
    body["needs"] = [job.key for job in plan.jobs] + [test.key for test in plan.tests]
    # Upload what this run built (jobs not chosen are skipped), and nothing if any build failed.
    body["if"] = ("${{ !cancelled() && inputs.upload && !contains(needs.*.result, 'failure') "
                  "&& contains(needs.*.result, 'success') }}")
    body["runs-on"] = _runs_on(upload.runner)
    body["timeout-minutes"] = data.limits.upload_minutes
    body["environment"] = data.upload.environment
    body["permissions"] = CommentedMap({"contents": "read"})
    body["steps"] = steps
    return body


def _github_test_job(plan: CiPlan, test: TestJob) -> CommentedMap:
    build = test.build
    steps = _github_container_steps(plan, build) if build.in_container else _github_setup_steps(plan)
    for need in test.needs:
        steps.append(_action_step(f"Download the packages of {need}", "download-artifact",
                                  {"name": f"packages-{need}", "path": CHANNEL_DIR}))
    index, create, check = test_commands(plan, test, "")
    steps += [_step("Index the packages into a channel", index),
              _step("Install them into a fresh environment", create),
              _step("Test " + ("on the GPU" if test.gpu else "on the CPU"), check)]
    body = CommentedMap()
    body["name"] = f"test {build.package}" + (f" on Python {test.python}" if test.python else "")
    body["needs"] = list(test.needs)
    body["runs-on"] = _runs_on(test.runner)
    if build.in_container:
        body["container"] = CommentedMap(image=build.image)
        if test.gpu:
            body["container"]["options"] = load_data().test.github_gpu_container_options
        env = build.image_env
        if env:
            body["env"] = CommentedMap(env)
    body["timeout-minutes"] = load_data().limits.test_minutes
    body["permissions"] = CommentedMap({"contents": "read"})
    body["steps"] = steps
    return body


def _github_promote_job(plan: CiPlan, upload: Upload) -> CommentedMap:
    data = load_data()
    steps = _github_setup_steps(plan)
    step = _step(f"Promote from label {upload.staging} to {', '.join(upload.promote_to)}",
                 LiteralScalarString("\n".join(promote_commands(upload, "")) + "\n"))
    if upload.token_vars:
        step["env"] = CommentedMap({name: "${{ secrets." + name + " }}" for name in upload.token_vars})
    steps.append(step)
    body = CommentedMap()
    body["name"] = f"promote on {upload.target}"
    body["needs"] = ["upload"]
    body["runs-on"] = _runs_on(upload.runner)
    body["timeout-minutes"] = data.limits.upload_minutes
    # Give this environment required reviewers: the job waits for one to approve the promotion.
    body["environment"] = data.upload.promote_environment
    body["permissions"] = CommentedMap({"contents": "read"})
    body["steps"] = steps
    return body




def github_workflow(plan: CiPlan) -> CommentedMap:
    inputs = CommentedMap()
    inputs["variant"] = CommentedMap(
        description=choice_description(plan),
        type="choice", default=ALL, options=list(plan.choices),
    )
    if plan.upload is not None:
        inputs["upload"] = CommentedMap(description=f"Upload the packages to {plan.upload.target}",
                                        type="boolean", default=True)
    doc = CommentedMap()
    doc["name"] = "torchforge"
    # Multi-hour builds are started on purpose, never by every push.
    doc["on"] = CommentedMap(workflow_dispatch=CommentedMap(inputs=inputs))
    doc["permissions"] = CommentedMap()  # nothing by default; each job asks for what it reads
    # One matrix run at a time per ref; a second waits instead of cancelling hours of compiling.
    doc["concurrency"] = CommentedMap({"group": "torchforge-${{ github.ref }}", "cancel-in-progress": False})
    # Windows runners run the same POSIX command lines through Git's bash.
    doc["defaults"] = CommentedMap(run=CommentedMap(shell="bash"))
    if plan.tests and not plan.test_script:
        doc["env"] = CommentedMap({SMOKE_VARIABLE: LiteralScalarString(smoke_script())})
    jobs = CommentedMap()
    for job in plan.jobs:
        jobs[job.key] = _github_build_job(plan, job)
        note_channels(jobs, job, indent=2)
    for test in plan.tests:
        jobs[test.key] = _github_test_job(plan, test)
    if plan.upload is not None:
        jobs["upload"] = _github_upload_job(plan, plan.upload)
        if plan.upload.staging:
            jobs["promote"] = _github_promote_job(plan, plan.upload)
    doc["jobs"] = jobs
    doc.yaml_set_start_comment(header(plan, Provider.GITHUB))
    return doc


# ---- GitLab CI ----------------------------------------------------------------------------------------------
