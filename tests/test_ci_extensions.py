"""`torchforge ci ... --extension SPEC` (issue 33: extensions as every other recipe, `ci` included): each extension
is a build job after the job that builds its pytorch, running that job's exact command with `--extension SPEC`
(which reuses the job's packages it downloads), a test per Python that installs the planned extension file, and
the upload after all of them; the files pass the same real linters as every other CI file."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from tests.test_ci import above_low, actionlint, ci, gitlab_schema, load, zizmor_findings
from tests.test_ci_conda_forge import assert_each_job_installs_the_committed_torchforge, jobs_of
from torchforge.ci import Provider
from torchforge.cli import main as cli_main

SPECS = ("torch-scatter==2.1.2", "causal-conv1d==1.7.0")


def build_argv(jobs: dict[str, tuple[set[str], list[str], list[str]]]) -> dict[str, list[str]]:
    return {key: next(shlex.split(line) for line in lines if "torchforge build " in line)
            for key, (_, _, lines) in jobs.items() if any("torchforge build " in line for line in lines)}


def planned_files(argv: list[str], out: Path, capsys: pytest.CaptureFixture[str]) -> set[str]:
    """The extension package files the job's own command plans (its dry run's matrix of the same request)."""
    capsys.readouterr()
    matrix = [w for w in argv[2:] if w not in ("--engine", "rattler-build")]
    flags = matrix[:matrix.index("--out")]
    assert cli_main(["matrix", *flags, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    return {f"{row['package']}-{row['version']}-{row['build_string']}" for row in rows if row.get("kind") == "extension"}


@pytest.mark.parametrize("provider", list(Provider))
def test_each_extension_is_a_job_after_its_pytorch_job_with_a_test_per_python(
        tmp_path: Path, provider: Provider, capsys: pytest.CaptureFixture[str]) -> None:
    code, path = ci(tmp_path, provider, "--pytorch", "2.13.0", "--cuda", "cpu", "--py", "3.11,3.12",
                    *(w for spec in SPECS for w in ("--extension", spec)), "--upload-to", "file:///srv/channel")
    assert code == 0, capsys.readouterr().err
    jobs = jobs_of(load(path), provider)
    argv = build_argv(jobs)
    folder = [key for key, words in argv.items() if "--extension" not in words]
    extensions = {key: words[words.index("--extension") + 1] for key, words in argv.items() if "--extension" in words}
    assert len(folder) == 1 and sorted(extensions.values()) == sorted(SPECS)
    for key, spec in extensions.items():
        assert jobs[key][0] == set(folder)  # after the job that builds its pytorch, with that job's command
        assert [w for w in argv[key] if w not in ("--extension", spec)] == argv[folder[0]]
        tests = {t: lines for t, (needs, _, lines) in jobs.items() if t.startswith("test-") and needs == {key}}
        installed = {"-".join(s.replace("==", "").split()) for lines in tests.values() for line in lines
                     if line.startswith("conda create ") for s in shlex.split(line) if " ==" in s}
        assert len(tests) == 2 and installed == planned_files(argv[key], tmp_path, capsys), installed
    assert jobs["upload"][0] == {key for key in jobs if key not in ("upload", "promote")}
    assert_each_job_installs_the_committed_torchforge(jobs, tmp_path)
    if provider is Provider.GITHUB:
        actionlint(tmp_path)
        assert above_low(zizmor_findings(tmp_path)) == []
    else:
        gitlab_schema(tmp_path)


def test_an_extension_of_the_official_flavour_is_a_job_after_its_variants_job(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, path = ci(tmp_path, Provider.GITHUB, "--pytorch", "2.5.1", "--cuda", "cpu", "--py", "3.12",
                    "--extension", SPECS[0])
    assert code == 0, capsys.readouterr().err
    jobs = jobs_of(load(path), Provider.GITHUB)
    argv = build_argv(jobs)
    (extension,) = [key for key, words in argv.items() if "--extension" in words]
    (variant,) = jobs[extension][0]
    assert [w for w in argv[extension] if w not in ("--extension", SPECS[0])] == argv[variant]
    assert argv[variant][argv[variant].index("--pytorch") + 1] == "2.5.1"


def test_a_cuda_extension_job_in_its_image_installs_the_committed_torchforge_too(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A CUDA job GitHub runs inside its image installs torchforge into a venv of its own, from the same wheel."""
    code, path = ci(tmp_path, Provider.GITHUB, "--pytorch", "2.13.0", "--cuda", "12.9", "--py", "3.12",
                    "--extension", SPECS[0], "--upload-to", "file:///srv/channel")
    assert code == 0, capsys.readouterr().err
    doc = load(path)
    assert any("container" in body for body in doc["jobs"].values())  # the case this test is for
    assert_each_job_installs_the_committed_torchforge(jobs_of(doc, Provider.GITHUB), tmp_path)


SCATTER = Path(__file__).parent / "fixtures" / "sdists" / "torch_scatter-2.1.2.tar.gz"


def test_an_extension_path_follows_the_rule_of_every_path_a_pipeline_carries(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A local sdist is read by the jobs from their checkout, as --source is (issue 34 item 16): an absolute path or
    one leaving the repository is refused (exit 2, nothing written); one committed in the repository is kept."""
    repo = tmp_path / "repo"
    (repo / "sdists").mkdir(parents=True)
    (repo / "sdists" / SCATTER.name).write_bytes(SCATTER.read_bytes())
    (tmp_path / SCATTER.name).write_bytes(SCATTER.read_bytes())
    monkeypatch.chdir(repo)
    for spec, why in ((str(SCATTER), "is an absolute path"), (f"../{SCATTER.name}", "leads out of the repository")):
        code, path = ci(repo, Provider.GITHUB, "--pytorch", "2.13.0", "--cuda", "cpu", "--py", "3.11",
                        "--extension", spec)
        err = " ".join(capsys.readouterr().err.split())
        assert code == 2 and f"--extension {spec} {why}" in err and "give a path relative to the repository" in err
        assert not path.exists()
    code, path = ci(repo, Provider.GITHUB, "--pytorch", "2.13.0", "--cuda", "cpu", "--py", "3.11",
                    "--extension", f"sdists/{SCATTER.name}")
    assert code == 0, capsys.readouterr().err
    assert f"--extension sdists/{SCATTER.name}" in path.read_text()
