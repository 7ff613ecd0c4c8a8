"""`torchforge ci github|gitlab` for the conda-forge flavour (the default from 2.6): one build job per recipe folder
(libtorch, pytorch per Python and the metapackage from one engine run), a test job per Python (CPU on the build
runner, CUDA on the GPU runner), the upload gated by every test, staging and promote where the target has labels.
The files go through the same real linters as the official flavour's (tests/test_ci.py)."""

from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.test_ci import (
    above_low, actionlint, ci, dry_run_build, gitlab_graph, gitlab_schema, load, installed_by_tests, zizmor_findings,
)
from torchforge.ci import Provider
from torchforge.cli import main as cli_main

CPU_RECIPE = "libtorch-2.13.0-cpu-linux_64"
CUDA_RECIPE = "libtorch-2.13.0-cuda129-sm50_60_70_75_80_86_90_100_120PTX-linux_64"
CPU_AND_CUDA = ("--pytorch", "2.13.0", "--cuda", "cpu,12.9", "--py", "3.11,3.12")
LINT_CASES = {
    "cpu-and-cuda-staged": (*CPU_AND_CUDA, "--upload-to", "file:///srv/channel", "--gpu-runner", "gpu"),
    "cuda-arch-list-quetz": ("--pytorch", "2.13.0", "--cuda", "12.9", "--py", "3.12", "--arch-list", "8.0;9.0",
                             "--build-number", "2", "--upload-to", "quetz+https://q.example/ch"),
    "with-torchvision-and-torchaudio": (*CPU_AND_CUDA, "--with", "torchvision,torchaudio", "--upload-to",
                                        "file:///srv/channel", "--gpu-runner", "gpu"),
    "flavour-pinned-with-channel": ("--pytorch", "2.7.0", "--flavour", "conda-forge", "--cuda", "cpu", "--py", "3.11",
                                    "-c", "file:///srv/extra", "--upload-to", "anaconda://myorg"),
}


@pytest.mark.parametrize("case", list(LINT_CASES))
def test_github_jobs_pass_actionlint_and_zizmor(tmp_path: Path, case: str) -> None:
    code, path = ci(tmp_path, Provider.GITHUB, *LINT_CASES[case])
    assert code == 0 and any(key.startswith("build-") for key in load(path)["jobs"])
    assert_each_job_installs_the_committed_torchforge(jobs_of(load(path), Provider.GITHUB), tmp_path)
    actionlint(tmp_path, "gpu")
    findings = above_low(zizmor_findings(tmp_path))
    assert findings == [], json.dumps(findings, indent=1)[:4000]


@pytest.mark.parametrize("case", list(LINT_CASES))
def test_gitlab_jobs_pass_the_schema(tmp_path: Path, case: str) -> None:
    code, path = ci(tmp_path, Provider.GITLAB, *LINT_CASES[case])
    assert code == 0 and load(path)["stages"][0] == "recipe"
    assert_each_job_installs_the_committed_torchforge(jobs_of(load(path), Provider.GITLAB), tmp_path)
    gitlab_schema(tmp_path)


def jobs_of(doc: dict[str, Any], provider: Provider) -> dict[str, tuple[set[str], list[str], list[str]]]:
    """{job key: (keys it needs, its runner labels, every line it runs)} of either provider's file."""
    if provider is Provider.GITHUB:
        return {key: ({*body.get("needs", [])}, [body["runs-on"]] if isinstance(body["runs-on"], str) else body["runs-on"],
                      [line for step in body["steps"] if "run" in step for line in step["run"].splitlines()])
                for key, body in doc["jobs"].items()}
    return {key: ({n["job"] for n in body.get("needs", [])}, body["tags"], body["script"])
            for key, body in doc.items() if isinstance(body, dict) and "script" in body}


def assert_each_job_installs_the_committed_torchforge(jobs: dict[str, tuple[set[str], list[str], list[str]]],
                                                   root: Path) -> None:
    """Every job that runs torchforge installs it first, once, from the wheel `ci` wrote into the repository (the
    one exact torchforge of the CI file), into the interpreter whose `torchforge` the job then runs."""
    (wheel,) = (root / ".torchforge").glob("torchforge*.whl")
    running = {key: lines for key, (_, _, lines) in jobs.items()
               if any(line.split()[0].endswith("/torchforge") or line.split()[0] == "torchforge" for line in lines if line.split())}
    assert {key for key in jobs if key.startswith(("build-", "test-", "upload"))} <= set(running), running.keys()
    for key, lines in running.items():
        first = next(i for i, line in enumerate(lines) if line.split() and line.split()[0].endswith("torchforge"))
        installs = [shlex.split(line) for line in lines[:first] if " -m pip install " in line]
        assert len(installs) == 1, (key, lines[:first])
        (argv,) = installs
        assert argv[-1] == f"./.torchforge/{wheel.name}" and argv[-4:-1] == ["-m", "pip", "install"], (key, argv)
        interpreter, command = Path(argv[0]).parent, Path(lines[first].split()[0]).parent
        assert interpreter == command or command == Path("."), (key, argv[0], lines[first])


@pytest.mark.parametrize("provider", list(Provider))
def test_one_build_job_per_recipe_folder_a_test_per_python_and_the_upload_after_every_test(
        tmp_path: Path, provider: Provider) -> None:
    code, path = ci(tmp_path, provider, *CPU_AND_CUDA, "--gpu-runner", "gpu-a100",
                    "--upload-to", "file:///srv/channel")
    assert code == 0
    doc = load(path)
    jobs = jobs_of(doc, provider)
    builds = {key: lines for key, (_, _, lines) in jobs.items() if any("torchforge build " in line for line in lines)}
    text = path.read_text()
    assert len(builds) == 2 and all(recipe in text for recipe in (CPU_RECIPE, CUDA_RECIPE))
    for lines in builds.values():  # every Python of the folder in one `torchforge build`
        (argv,) = [shlex.split(line) for line in lines if "torchforge build " in line]
        assert argv[argv.index("--py") + 1] == "3.11,3.12" and "--container" not in argv
    tests = {key: job for key, job in jobs.items() if key.startswith("test-")}
    assert len(tests) == 4
    for key, (needs, runner, lines) in tests.items():
        (build,) = needs
        assert build in builds
        on_gpu = any("--cuda 12.9" in line for line in builds[build])
        assert ("gpu-a100" in runner) is on_gpu and (runner == jobs[build][1]) is not on_gpu, (key, runner)
        (create,) = [line for line in lines if line.startswith("conda create ")]
        specs = [spec for spec in shlex.split(create) if " ==2.13.0 " in spec]
        python = "py311" if "py311" in key or "py3.11" in key else "py312"
        tag = "cuda129" if on_gpu else "cpu"
        assert sorted(spec.split()[0] for spec in specs) == sorted(
            ["libtorch", "pytorch", "pytorch-gpu" if on_gpu else "pytorch-cpu"]), specs
        assert any(spec.startswith(f"pytorch ==2.13.0 {tag}_mkl_torchforge_{python}_h") for spec in specs), specs
    assert jobs["upload"][0] == set(builds) | set(tests)
    assert jobs["promote"][0] == {"upload"}
    assert_each_job_installs_the_committed_torchforge(jobs, tmp_path)


def test_each_build_job_plans_exactly_what_its_tests_install_and_fills_the_cache_it_saves(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Each build job's own command, dry-run in the checkout (with --source of a folder there): one engine run that
    yields every package the test jobs install, into the compile cache the job saves and restores."""
    shutil.copytree(Path(__file__).parent / "fixtures" / "torch_split", tmp_path / "torch_split")
    monkeypatch.chdir(tmp_path)
    code, path = ci(tmp_path, Provider.GITLAB, *CPU_AND_CUDA, "--source", "torch_split")
    assert code == 0
    doc = load(path)
    graph, commands = gitlab_graph(doc)
    installed = installed_by_tests(doc, graph)
    planned = set()
    for job in (CPU_RECIPE, CUDA_RECIPE):
        (line,) = [line for line in commands[job] if "torchforge build " in line]
        text = dry_run_build(line, doc[job], capsys)
        assert text.count("--recipe forge-channel/recipes/") == 1, job  # one engine run for the folder
        planned |= set(re.findall(r"\b((?:libtorch|pytorch(?:-cpu|-gpu)?)-2\.13\.0-\S+_h[0-9a-f]+_\d+)\b", text))
    assert any(stem.startswith("pytorch-2.13.0-cpu_mkl_torchforge_py311_") for stem in installed)
    assert len(installed) == 8 and installed == planned, (installed, planned)


def test_a_flag_of_the_official_flavour_is_refused_and_nothing_is_written(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, path = ci(tmp_path, Provider.GITLAB, "--pytorch", "2.13.0", "--cuda", "cpu", "--py", "3.12", "--debug")
    assert code != 0 and not path.exists() and not (tmp_path / ".torchforge").exists()
    assert "--debug applies to --flavour official only" in " ".join(capsys.readouterr().err.split())


@pytest.mark.parametrize("provider", list(Provider))
def test_with_one_build_job_per_companion_folder_after_its_pytorch_job_a_test_per_python_and_the_upload_after_all(
        tmp_path: Path, provider: Provider, capsys: pytest.CaptureFixture[str]) -> None:
    """--with torchvision,torchaudio (issue 32): each companion of each recipe folder is a job after the folder's
    job, running that folder's `torchforge build` with `--with NAME` (which reuses the folder's packages it
    downloads and builds the companion for every Python); a test per Python installs the companion (its pin brings
    that exact pytorch from the job's channel); the upload and its staging wait for every test."""
    code, path = ci(tmp_path, provider, *CPU_AND_CUDA, "--with", "torchvision,torchaudio", "--gpu-runner", "gpu-a100",
                    "--upload-to", "file:///srv/channel")
    assert code == 0
    jobs = jobs_of(load(path), provider)
    builds = {key: lines for key, (_, _, lines) in jobs.items() if any("torchforge build " in line for line in lines)}
    argv = {key: next(shlex.split(line) for line in lines if "torchforge build " in line) for key, lines in builds.items()}
    folders = {key for key, words in argv.items() if "--with" not in words}
    companions = {key: words[words.index("--with") + 1] for key, words in argv.items() if "--with" in words}
    assert len(folders) == 2 and sorted(companions.values()) == ["torchaudio", "torchaudio", "torchvision", "torchvision"]
    for key, name in companions.items():
        (folder,) = jobs[key][0]
        assert folder in folders  # after the job that builds its pytorch, with that job's exact command
        assert [w for w in argv[key] if w not in ("--with", name)] == argv[folder]
        assert argv[key][argv[key].index("--py") + 1] == "3.11,3.12"
        # the companion packages that command plans are exactly those its tests install
        capsys.readouterr()
        assert cli_main([*argv[key][1:-2], "--out", str(tmp_path / "dry" / key), "--dry-run"]) == 0
        dry = capsys.readouterr()
        planned = set(re.findall(rf"\b({name}-\d[\d.]*-\w+_\d+)\b", dry.out + dry.err))
        tests = {t: lines for t, (needs, _, lines) in jobs.items() if t.startswith("test-") and needs == {key}}
        installed = {"-".join(spec.replace("==", "").split()) for lines in tests.values() for line in lines
                     if line.startswith("conda create ") for spec in shlex.split(line) if " ==" in spec}
        assert len(tests) == 2 and len(planned) == 2 and installed == planned, (installed, planned)
    tests = {key for key in jobs if key.startswith("test-")}
    assert len(tests) == 4 + 8
    assert jobs["upload"][0] == set(builds) | tests
    assert jobs["promote"][0] == {"upload"}


def test_with_of_the_official_flavour_is_a_job_per_companion_after_its_pytorch_job(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The official flavour plans torchvision/torchaudio for 2.1-2.5 (docs/recipes.md): each is a job after its
    variant's job, running that job's exact command with `--with NAME`, and the upload waits for it."""
    code, path = ci(tmp_path, Provider.GITHUB, "--pytorch", "2.5.1", "--cuda", "cpu", "--py", "3.12",
                    "--with", "torchvision", "--upload-to", "file:///srv/channel")
    assert code == 0, capsys.readouterr().err
    jobs = jobs_of(load(path), Provider.GITHUB)
    argv = {key: next(shlex.split(line) for line in lines if "torchforge build " in line)
            for key, (_, _, lines) in jobs.items() if any("torchforge build " in line for line in lines)}
    (companion,) = [key for key, words in argv.items() if "--with" in words]
    (variant,) = jobs[companion][0]
    assert [w for w in argv[companion] if w not in ("--with", "torchvision")] == argv[variant]
    assert argv[variant][argv[variant].index("--pytorch") + 1] == "2.5.1"
    assert companion in jobs["upload"][0] and variant in jobs["upload"][0]
    actionlint(tmp_path)
    assert above_low(zizmor_findings(tmp_path)) == []