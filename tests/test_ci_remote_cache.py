"""`torchforge ci --cache-url`: every build job uses the compile cache server beside its CI cache, read-only on
untrusted pipelines, without it in tag pipelines where asked; the files pass actionlint, zizmor and GitLab's
schema, and hold the secrets' names only."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.test_ci import above_low, actionlint, ci, gitlab_schema, load, zizmor_findings
from torchforge.ci import Provider

HTTP = "https://ci:${CACHE_TOKEN}@cache.example/ccache"
REDIS = "redis://:${CACHE_TOKEN}@cache.example:6379"
SELECTION = ("--pytorch", "2.5.1", "--cuda", "12.4", "--py", "3.11,3.12", "--platform", "linux-64")
SECRET = "s3cr3t-value-of-the-ci"


def test_github_jobs_use_the_server_read_only_when_untrusted_and_pass_the_linters(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CACHE_TOKEN", SECRET)  # set where `ci` runs: it must never be written
    code, path = ci(tmp_path, Provider.GITHUB, *SELECTION, "--cache-url", HTTP, "--no-remote-cache-for-releases")
    assert code == 0
    actionlint(tmp_path, "gpu")
    findings = above_low(zizmor_findings(tmp_path))
    assert findings == [], json.dumps(findings, indent=1)[:4000]
    text = path.read_text()
    assert SECRET not in text
    builds = [step for job in load(path)["jobs"].values() for step in job["steps"]
              if str(step.get("name", "")).startswith("Build ")]
    assert len(builds) == 3  # magma, two Pythons
    for step in builds:
        env = step["env"]
        assert env["CACHE_TOKEN"] == "${{ secrets.CACHE_TOKEN }}"
        assert "!startsWith(github.ref, 'refs/tags/')" in env["TORCHFORGE_CACHE_URL"] and HTTP in env["TORCHFORGE_CACHE_URL"]
        assert "github.event.pull_request.head.repo.full_name != github.repository" in env["TORCHFORGE_CACHE_READ_ONLY"]


def test_gitlab_jobs_pass_the_schema_and_decide_read_only_from_the_ref_and_the_source_project(tmp_path: Path) -> None:
    code, path = ci(tmp_path, Provider.GITLAB, *SELECTION, "--cache-url", REDIS, "--no-remote-cache-for-releases")
    assert code == 0
    gitlab_schema(tmp_path)
    doc = load(path)
    script = next(job["script"] for job in doc.values() if isinstance(job, dict) and "script" in job
                  and any("torchforge build" in line for line in job["script"]))
    lines = [line for line in script if "TORCHFORGE_CACHE" in line]

    def decided(**ci_env: str) -> tuple[str, str]:
        shown = subprocess.run(["bash", "-euc", "\n".join([*lines, 'printf "%s|%s" "${TORCHFORGE_CACHE_URL:-}" '
                                                           '"${TORCHFORGE_CACHE_READ_ONLY:-}"'])],
                               env={"PATH": "/usr/bin:/bin", "CI_PROJECT_ID": "7", **ci_env},
                               capture_output=True, text=True, check=True).stdout
        url, read_only = shown.split("|")
        return url, read_only

    assert decided(CI_COMMIT_REF_PROTECTED="true") == (REDIS, "")  # the project's protected branch: writes
    assert decided(CI_COMMIT_REF_PROTECTED="false") == (REDIS, "true")
    assert decided(CI_COMMIT_REF_PROTECTED="true", CI_MERGE_REQUEST_SOURCE_PROJECT_ID="9") == (REDIS, "true")  # a fork's MR
    assert decided(CI_COMMIT_REF_PROTECTED="true", CI_MERGE_REQUEST_SOURCE_PROJECT_ID="7") == (REDIS, "")
    assert decided(CI_COMMIT_REF_PROTECTED="true", CI_COMMIT_TAG="v2.5.1")[0] == ""  # a release: no remote cache


def test_a_password_in_the_url_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    code, path = ci(tmp_path, Provider.GITHUB, *SELECTION, "--cache-url", "redis://:hunter2@cache.example:6379")
    assert code == 2 and not path.exists()
    code, path = ci(tmp_path, Provider.GITLAB, *SELECTION, "--no-remote-cache-for-releases")
    assert code == 2 and not path.exists()
