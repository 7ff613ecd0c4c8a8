"""`make ci-local` as a test: the emitted GitLab pipeline run twice by gitlab-ci-local with podman
(tests/ci_local.py), then its logs and the directory channel it uploaded into are read back.

Skipped, with the reason, where podman, node/npm or rsync cannot run (as tests/test_container_build.py); `make
ci-local` first names every missing command at once and fails, and fails on any skip (TORCHFORGE_STRICT_SKIPS):
a target that exists to run the pipeline never passes having run nothing (tests/test_ci_local_tools.py).
About 30 minutes on two cores: `make ci-local` runs it (`-m ci_local`); `make test` deselects it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from tests import ci_local, container_image

pytestmark = pytest.mark.ci_local

RUNS = 2
JOB_LINE = re.compile(r"^(\S+)\s+starting (\S+) \((\w+)\)$", re.MULTILINE)
PASSED = re.compile(r"^ PASS  (\S+)", re.MULTILINE)
REUSED = re.compile(r"(\d+)/(\d+) objects reused")


@pytest.fixture(scope="module")
def pipeline() -> list[str]:
    """Both runs' logs (the pipeline runs once per test session: minutes on two cores)."""
    cuda = container_image.cuda_available()
    try:
        ci_local.check_tools()
        container_image.ensure(cuda=cuda)
        ci_local.ensure_gitlab_ci_local()
    except (container_image.Unavailable, ci_local.Unavailable) as exc:
        pytest.skip(f"ci-local cannot run here: {exc}")
    assert ci_local.main(cuda) == 0, (ci_local.HOME / "run-1.log").read_text()[-6000:]
    return [(ci_local.HOME / f"run-{n}.log").read_text() for n in range(1, RUNS + 1)]


def _jobs(log: str) -> list[tuple[str, str, str]]:
    """(job, image or 'shell', stage) in the order the jobs started."""
    return JOB_LINE.findall(log)


def _line_of(log: str, text: str) -> int:
    """The index of the first log line that starts with `text` (after the job-name padding)."""
    lines = [re.sub(r"\s+", " ", line) for line in log.splitlines()]
    return next(i for i, line in enumerate(lines) if line.startswith(text))


@pytest.mark.slow
def test_every_job_runs_after_what_it_needs_in_its_image_and_passes(pipeline: list[str]) -> None:
    doc = YAML(typ="safe").load((ci_local.REPO / ".gitlab-ci.yml").read_text())
    for log in pipeline:
        jobs = _jobs(log)
        assert {stage for _, _, stage in jobs} == {"magma", "pytorch", "test", "upload", "promote"} or \
            not container_image.cuda_available()
        for job, image, stage in jobs:
            started = _line_of(log, f"{job} starting ")
            for need in doc[job].get("needs", []):  # started only after each job it needs had finished
                assert _line_of(log, f"{need['job']} finished in ") < started, (job, need)
            if stage in ("magma", "pytorch", "test"):
                assert image.startswith("localhost/torchforge-conda-builder:"), (job, image)
            if stage == "test":  # its packages came as artifacts
                assert f"{job} imported artifacts" in re.sub(r"\s+", " ", log), job
        assert set(PASSED.findall(log)) == {job for job, _, _ in jobs}
        # the fixture's check passed on the installed packages, once per test job
        assert log.count("fixture check passed") == sum(stage == "test" for _, _, stage in jobs)


@pytest.mark.slow
def test_the_compile_cache_is_saved_then_reused(pipeline: list[str]) -> None:
    first, second = pipeline
    keys = set(re.findall(r"cache created in '\.gitlab-ci-local/cache/(ccache-[\w.-]+)'", first))
    assert keys and all(f"imported cache '{key}'" in second for key in keys)
    reused = [(int(h), int(c)) for h, c in REUSED.findall(second)]
    # Every object of the second run's builds came from the first run's cache (its binding too: same Python).
    assert reused and all(hits == calls > 0 for hits, calls in reused), reused


@pytest.mark.slow
def test_the_upload_staged_then_promoted_every_package(pipeline: list[str]) -> None:
    del pipeline
    channel = ci_local.CHANNEL
    staged = {p.name for p in (channel / "label" / "staging").glob("*/*.conda")}
    main = {p.name for p in channel.glob("*/*.conda")}
    assert staged and staged == main
    assert any(name.startswith("pytorch-2.13.0-py3.11_cpu_") for name in main)
    if container_image.cuda_available():
        assert any(name.startswith("magma-cuda130-") for name in main)
        assert any(name.startswith("pytorch-2.13.0-py3.11_cuda13.0_") for name in main)
    assert all(Path(channel / sub / "repodata.json").is_file() for sub in ("linux-64", "noarch"))


# ---- the conda-forge flavour's pipeline (2.13.0 cpu, torch_split) -------------------------------------------

CF_PACKAGES = ("libtorch-2.13.0-cpu_mkl_torchforge_", "pytorch-2.13.0-cpu_mkl_torchforge_py311_",
               "pytorch-cpu-2.13.0-cpu_mkl_torchforge_")


@pytest.fixture(scope="module")
def conda_forge_pipeline() -> list[str]:
    """Both runs' logs of the conda-forge flavour's pipeline (a cpu one: no CUDA image)."""
    try:
        ci_local.check_tools()
        container_image.ensure(cuda=False)
        ci_local.ensure_gitlab_ci_local()
    except (container_image.Unavailable, ci_local.Unavailable) as exc:
        pytest.skip(f"ci-local cannot run here: {exc}")
    pipeline = ci_local.CONDA_FORGE
    assert ci_local.main(False, pipeline) == 0, pipeline.log(1).read_text()[-6000:]
    return [pipeline.log(n).read_text() for n in range(1, RUNS + 1)]


@pytest.mark.slow
def test_the_conda_forge_flavours_one_build_job_its_test_upload_and_promote_run_in_order_and_pass(
        conda_forge_pipeline: list[str]) -> None:
    doc = YAML(typ="safe").load((ci_local.CONDA_FORGE.repo / ".gitlab-ci.yml").read_text())
    for log in conda_forge_pipeline:
        jobs = _jobs(log)
        assert [(job, stage) for job, _, stage in jobs] == [
            ("libtorch-2.13.0-cpu-linux_64", "recipe"), ("test-libtorch-2.13.0-cpu-linux_64-py3.11", "test"),
            ("upload", "upload"), ("promote", "promote")]
        for job, image, stage in jobs:
            started = _line_of(log, f"{job} starting ")
            for need in doc[job].get("needs", []):
                assert _line_of(log, f"{need['job']} finished in ") < started, (job, need)
            if stage in ("recipe", "test"):
                assert image == container_image.CPU, (job, image)
        assert set(PASSED.findall(log)) == {job for job, _, _ in jobs}
        assert log.count("fixture check passed") == 1
        # one engine run built all three packages of the folder
        assert re.search(rf"build {re.escape(CF_PACKAGES[0])}\w+, {re.escape(CF_PACKAGES[1])}\w+, "
                         rf"{re.escape(CF_PACKAGES[2])}\w+ \(rattler-build\)", " ".join(log.split()))


@pytest.mark.slow
def test_the_conda_forge_flavours_second_run_builds_from_the_first_runs_compile_cache(
        conda_forge_pipeline: list[str]) -> None:
    first, second = conda_forge_pipeline
    (key,) = set(re.findall(r"cache created in '\.gitlab-ci-local/cache/(ccache-[\w.-]+)'", first))
    assert key.startswith("ccache-libtorch-2.13.0-cpu-linux_64-") and f"imported cache '{key}'" in second
    reused = [(int(h), int(c)) for h, c in REUSED.findall(second)]
    assert reused and all(hits == calls > 0 for hits, calls in reused), reused


@pytest.mark.slow
def test_the_conda_forge_flavours_upload_staged_then_promoted_its_three_packages(
        conda_forge_pipeline: list[str]) -> None:
    del conda_forge_pipeline
    channel = ci_local.CONDA_FORGE.channel
    staged = {p.name for p in (channel / "label" / "staging").glob("*/*.conda")}
    main = {p.name for p in channel.glob("*/*.conda")}
    assert staged == main and len(main) == 3
    assert all(any(name.startswith(prefix) for name in main) for prefix in CF_PACKAGES), main
    assert (channel / "linux-64" / "repodata.json").is_file()
