"""The stack file (issue 39): a saved request read by every command with --stack. Malformed files are refused with
their line (exit 2) before anything is planned; a file and the flags that say the same plan the same recipes, in
both flavours and the repack route; `ci --stack` writes pipelines the real linters accept; `init` writes a file
that loads and says what the command line said."""

from __future__ import annotations

import filecmp
import json
import os
import shlex
import shutil
from pathlib import Path

import pytest

from tests.test_ci import above_low, actionlint, ci, gitlab_schema, load, zizmor_findings
from tests.test_ci_conda_forge import jobs_of
from torchforge.binaries.plan import CudaLibs
from torchforge.binaries.stack import plan_wheels
from torchforge.ci import Provider
from torchforge.cli import main
from torchforge.stackfile import load as stack_load
from torchforge.stackfile import requests
from torchforge.stackfile.plan import wheels_plan

SCATTER = Path(__file__).parent / "fixtures" / "sdists" / "torch_scatter-2.1.2.tar.gz"
GOOD = """\
python = ["3.11"]
platform = "linux-64"

[pytorch]
from = "source"
version = "2.5.1"
cuda = "12.4"

[companions]
torchvision = "source"

[[extensions]]
spec = "torch-scatter==2.1.2"

[channels]
next_to = ["conda-forge"]
out = "forge-channel"
"""

# (what is wrong, the edit of GOOD that makes it so, the line the refusal names, words of the message)
MALFORMED = [
    ("an unknown key at the top", ('platform = "linux-64"', 'platform = "linux-64"\npythons = ["3.12"]'), 3,
     "pythons: unknown key"),
    ("an unknown key in a table", ('cuda = "12.4"', 'cuda = "12.4"\nverison = "2.5.1"'), 8, "pytorch.verison: unknown key"),
    ("a string for a number", ('platform = "linux-64"', 'platform = "linux-64"\nbuild_number = "1"'), 3,
     "build_number: Input should be a valid integer"),
    ("a string for a list", ('python = ["3.11"]', 'python = "3.11"'), 1, "python: Input should be a valid tuple"),
    ("a value the key does not take", ('from = "source"', 'from = "pip"'), 5, "pytorch.from: Input should be"),
    ("a key of another route", ('cuda = "12.4"', 'cuda = "12.4"\nmatch = "pytorch 2.5.1"'), 8,
     "pytorch.match: goes with from = channel"),
    ("an arch list for a CPU stack", ('cuda = "12.4"\n', 'cuda = "cpu"\n'), None, None),
    ("an extension that is no SPEC", ('spec = "torch-scatter==2.1.2"', 'spec = "torch-scatter==2.1.2"\n\n'
                                      '[[extensions]]\nspec = "causal-conv1d"'), 16, "extensions[1].spec"),
    ("a companion a built torch cannot repack", ('torchvision = "source"', 'torchvision = "wheels"'), 10,
     "companions.torchvision: = 'wheels'"),
    ("a release that is missing", ('version = "2.5.1"\n', ''), 4, "pytorch.version: is missing"),
    ("an unknown companion", ('torchvision = "source"', 'torchtext = "source"'), 10, "companions.torchtext"),
    ("an unknown platform", ('platform = "linux-64"', 'platform = "linux-32"'), 2, "unknown platform 'linux-32'"),
    ("broken TOML", ('[channels]', '[channels'), 15, "not TOML"),
    ("a build variable torchforge sets", ('spec = "torch-scatter==2.1.2"',
                                          'spec = "torch-scatter==2.1.2"\nenv = { MAX_JOBS = "64" }'), 14,
     "extensions[0].env.MAX_JOBS: torchforge sets MAX_JOBS"),
]
# the arch-list case: an arch list written for a CPU stack
MALFORMED[6] = ("an arch list for a CPU stack", ('cuda = "12.4"\n', 'cuda = "cpu"\n'), 2, "arch_list: a CPU stack")


def write(folder: Path, text: str, name: str = "stack.toml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text)
    return folder / name


@pytest.mark.parametrize(("why", "edit", "line", "words"), MALFORMED, ids=[case[0] for case in MALFORMED])
def test_a_malformed_stack_file_is_refused_with_its_line(
        why: str, edit: tuple[str, str], line: int, words: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    text = GOOD.replace(*edit)
    if why.startswith("an arch list"):
        text = text.replace('platform = "linux-64"', 'arch_list = "9.0"')
    assert text != GOOD
    path = write(tmp_path, text)
    assert main(["matrix", "--stack", str(path)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"{path}:{line}" in err and words in err, err
    assert "what would work:" in err
    assert not (tmp_path / "forge-channel").exists()


def test_the_good_file_of_those_cases_is_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The file each malformed case starts from loads: every refusal above is the edit's."""
    assert main(["matrix", "--stack", str(write(tmp_path, GOOD)), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {row.get("kind") for row in rows} >= {"extension"}


def test_a_stack_file_and_the_selection_flags_together_are_refused(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["build", "--stack", str(write(tmp_path, GOOD)), "--pytorch", "2.5.1", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "the stack file already says what that flag says" in err and "--pytorch" in err


@pytest.mark.parametrize(("command", "flags", "named"), [
    ("build", ["--dry-run", "--py", "3.12", "--extension", "torch-scatter==2.1.2"], "--py, --extension"),
    ("matrix", ["--arch-list", "9.0"], "--arch-list"),
    ("render", ["--flavour", "official", "--out", "r"], "--flavour"),
    ("doctor", ["--out", "elsewhere"], "--out"),
    ("ci", ["github", "--out", "wf", "--cuda", "12.6"], "--cuda"),
    ("install", ["--prefix", "p", "pytorch", "--channel", "c"], "SPECS, --channel"),
])
def test_each_command_refuses_what_the_stack_file_says_and_only_that(
        command: str, flags: list[str], named: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One list of what a stack file says, read from each command's own options: the options given are named
    (those left at their default, e.g. build's --format, are not)."""
    stack = write(tmp_path, GOOD)
    assert main([command, "--stack", str(stack), *flags]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"--stack {stack} and {named}: the stack file already says" in err, err


def _same_tree(left: Path, right: Path) -> None:
    compared = filecmp.dircmp(left, right)
    assert not compared.left_only and not compared.right_only and not compared.diff_files, compared.report()
    for sub in compared.common_dirs:
        _same_tree(left / sub, right / sub)


@pytest.mark.parametrize(("stack", "flags"), [
    (GOOD.replace("\n[[extensions]]\nspec = \"torch-scatter==2.1.2\"\n", "").replace(
        'cuda = "12.4"', 'cuda = "12.4"\nflavour = "official"').replace('platform = "linux-64"',
                                                                        'platform = "linux-64"\narch_list = "9.0;8.0"'),
     ["--pytorch", "2.5.1", "--cuda", "12.4", "--py", "3.11", "--arch-list", "8.0;9.0", "--with", "torchvision",
      "--flavour", "official"]),
    (GOOD.replace("\n[[extensions]]\nspec = \"torch-scatter==2.1.2\"\n", "").replace(
        'version = "2.5.1"\ncuda = "12.4"', 'version = "2.13.0"\ncuda = "cpu"\nflavour = "conda-forge"').replace(
        'python = ["3.11"]', 'python = ["3.11", "3.12"]').replace('platform = "linux-64"', 'build_number = 2'),
     ["--pytorch", "2.13.0", "--cuda", "cpu", "--py", "3.11,3.12", "--build-number", "2", "--with", "torchvision",
      "--flavour", "conda-forge"]),
], ids=["official", "conda-forge"])
def test_the_same_request_by_file_and_by_flags_renders_the_same_recipes(
        stack: str, flags: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path / "team", stack)
    assert main(["render", "--stack", str(path), "--out", str(tmp_path / "by-file")]) == 0
    assert main(["render", *flags, "--out", str(tmp_path / "by-flags")]) == 0
    assert len(list((tmp_path / "by-file").iterdir())) >= 2
    _same_tree(tmp_path / "by-file", tmp_path / "by-flags")
    capsys.readouterr()
    assert main(["matrix", "--stack", str(path), "--json"]) == 0
    by_file = capsys.readouterr().out
    assert main(["matrix", *flags, "--json"]) == 0
    assert json.loads(by_file) == json.loads(capsys.readouterr().out)


def test_the_same_extensions_by_file_and_by_flags_plan_the_same_rows(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """An extension SPEC of the file is the --extension of the flags (a local sdist relative to the file)."""
    (tmp_path / "team" / "sdists").mkdir(parents=True)
    os.link(SCATTER, tmp_path / "team" / "sdists" / SCATTER.name)
    path = write(tmp_path / "team", GOOD.replace('"torch-scatter==2.1.2"', f'"sdists/{SCATTER.name}"'))
    assert main(["matrix", "--stack", str(path), "--json"]) == 0
    by_file = json.loads(capsys.readouterr().out)
    assert main(["matrix", "--pytorch", "2.5.1", "--cuda", "12.4", "--py", "3.11", "--with", "torchvision",
                 "--extension", str(tmp_path / "team" / "sdists" / SCATTER.name), "--json"]) == 0
    by_flags = json.loads(capsys.readouterr().out)
    assert by_file == by_flags and any(row.get("package") == "torch-scatter" for row in by_file)


def test_an_extensions_variables_by_file_and_by_flags_plan_the_same_package(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """[[extensions]] env is --extension-env NAME:KEY=VALUE: the same rows, the variable in the build string."""
    path = write(tmp_path, GOOD.replace('spec = "torch-scatter==2.1.2"',
                                        'spec = "torch-scatter==2.1.2"\nenv = { WITH_SYMBOLS = "1" }'))
    assert main(["matrix", "--stack", str(path), "--json"]) == 0
    by_file = json.loads(capsys.readouterr().out)
    assert main(["matrix", "--pytorch", "2.5.1", "--cuda", "12.4", "--py", "3.11", "--with", "torchvision",
                 "--extension", "torch-scatter==2.1.2", "--extension-env", "torch-scatter:WITH_SYMBOLS=1",
                 "--json"]) == 0
    assert by_file == json.loads(capsys.readouterr().out)
    assert main(["matrix", "--stack", str(write(tmp_path / "plain", GOOD)), "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    scatter = [row for row in by_file if row.get("package") == "torch-scatter"]
    assert scatter and all(row["variables"] == {"WITH_SYMBOLS": "1"} for row in scatter)
    assert {row["build_string"] for row in scatter}.isdisjoint(
        row["build_string"] for row in plain if row.get("package") == "torch-scatter")


def test_an_extension_with_variables_is_planned_once_from_its_source(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A local sdist with an env: the loader reads its name (to check the env) and the plan reuses what it read,
    rather than packing and hashing the archive a second time (a git SPEC would be cloned twice)."""
    from torchforge.extensions import plan as extension_plan
    sdists = tmp_path / "sdists"
    sdists.mkdir()
    shutil.copy(SCATTER, sdists)
    path = write(tmp_path, GOOD.replace('spec = "torch-scatter==2.1.2"',
                                        f'spec = "sdists/{SCATTER.name}"\nenv = {{ WITH_SYMBOLS = "1" }}'))
    planned = []
    real = extension_plan.planned_source
    monkeypatch.setattr(extension_plan, "planned_source", lambda spec, runner: planned.append(spec.text) or
                        real(spec, runner))
    assert main(["matrix", "--stack", str(path), "--json"]) == 0
    scatter = [row for row in json.loads(capsys.readouterr().out) if row.get("package") == "torch-scatter"]
    assert planned == [str(sdists / SCATTER.name)], planned
    assert scatter and all(row["variables"] == {"WITH_SYMBOLS": "1"} for row in scatter), scatter


REPACKED = """\
python = ["3.11"]
build_number = 2

[pytorch]
from = "wheels"
version = "2.13.0"
cuda = "cpu"
wheels = ["wheels"]
cuda_libs = "wheels"

[[extensions]]
spec = "sdists/torch_scatter-2.1.2.tar.gz"

[channels]
next_to = ["conda-forge"]
out = "channel"
"""


@pytest.fixture()
def repacked_stack(torch_wheel: Path, tmp_path: Path) -> Path:
    """A repository holding a stack file of the real torch 2.13.0 CPU wheel (linked in) and torch-scatter's sdist."""
    for folder, source in (("wheels", torch_wheel), ("sdists", SCATTER)):
        (tmp_path / folder).mkdir()
        try:  # committed there, as a CI checkout has them
            os.link(source, tmp_path / folder / source.name)
        except OSError:
            shutil.copyfile(source, tmp_path / folder / source.name)
    return write(tmp_path, REPACKED)


def test_a_repacked_stack_plans_the_repack_its_flags_make(repacked_stack: Path, torch_wheel: Path) -> None:
    """`repack WHEEL --cuda-libs wheels --build-number 2` and the file plan the same packages; a file whose torch is
    not the wheel's is refused naming the key."""
    stack = stack_load.read(repacked_stack)
    repack = requests.repack_request(stack)
    flags = [(repacked_stack.parent / "wheels" / torch_wheel.name).resolve()]  # repack wheels/torch-...whl
    assert wheels_plan(stack, repack, repack.wheels) == plan_wheels(flags, CudaLibs("wheels"), 2)
    wrong = write(repacked_stack.parent, REPACKED.replace('version = "2.13.0"', 'version = "2.12.0"'), "wrong.toml")
    with pytest.raises(Exception, match=r"\[pytorch\] version is '2.12.0', the torch wheel's is '2.13.0'"):
        stack = stack_load.read(wrong)
        wheels_plan(stack, requests.repack_request(stack), stack.wheels)


@pytest.mark.parametrize("provider", list(Provider))
def test_ci_of_a_repacked_stack_builds_it_once_tests_it_then_uploads(
        repacked_stack: Path, provider: Provider, capsys: pytest.CaptureFixture[str]) -> None:
    root = repacked_stack.parent
    code, path = ci(root, provider, "--stack", str(repacked_stack), "--upload-to", "file:///srv/channel")
    assert code == 0, capsys.readouterr().err
    jobs = jobs_of(load(path), provider)
    builds = {key: shlex.split(next(line for line in lines if "torchforge build " in line))
              for key, (_, _, lines) in jobs.items() if any("torchforge build " in line for line in lines)}
    (build,) = builds.values()
    assert build[build.index("build") + 1:build.index("build") + 3] == ["--stack", "stack.toml"]
    tests = {key for key, (needs, _, _) in jobs.items() if key.startswith("test-")}
    assert len(tests) == 2 and all(jobs[key][0] == set(builds) for key in tests)  # pytorch, torch-scatter
    assert jobs["upload"][0] == {*builds, *tests}
    assert "torchforge ci " + provider.value + " --stack stack.toml" in path.read_text()
    if provider is Provider.GITHUB:
        actionlint(root)
        assert above_low(zizmor_findings(root)) == []
    else:
        gitlab_schema(root)


def test_init_writes_a_file_that_reads_as_the_request(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "stack.toml"
    assert main(["init", "--from", "source", "--pytorch", "2.5.1", "--cuda", "12.4", "--py", "3.11",
                 "--arch-list", "9.0", "--with", "torchvision", "--extension", "torch-scatter==2.1.2",
                 "--out", str(path)]) == 0
    text = path.read_text()
    assert text.startswith("# torchforge stack file") and "# the Pythons X.Y" in text
    stack = stack_load.read(path)
    request = requests.request(stack)
    assert (request.pytorch, request.cuda, request.python, request.arch_list) == ("2.5.1", "12.4", "3.11", "9.0")
    assert request.with_packages == ("torchvision",) and request.extensions == ("torch-scatter==2.1.2",)
    assert main(["init", "--from", "source", "--pytorch", "2.5.1", "--py", "3.11", "--out", str(path)]) == 2
    assert "exists" in capsys.readouterr().err


def test_a_pytorch_already_in_a_channel_is_the_for_route_of_the_flags(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """[pytorch] from = "channel" with a match spec plans what `--for MATCH --channel CHANNEL` plans (issue 38's
    Request.for_pytorch): the extension for that file, no pytorch build."""
    from tests.pkgfactory import make_package
    from torchforge.localchannel import index

    channel = tmp_path / "team" / "have"
    make_package(channel / "linux-64", "pytorch", "2.13.0", "whl_py3.11_cpu_0", depends=["python >=3.11,<3.12.0a0"])
    index(channel)
    text = GOOD.replace('from = "source"\nversion = "2.5.1"\ncuda = "12.4"',
                        'from = "channel"\nversion = "2.13.0"\ncuda = "cpu"\nmatch = "pytorch ==2.13.0 whl_*"').replace(
        '[companions]\ntorchvision = "source"\n', '').replace('next_to = ["conda-forge"]', 'next_to = ["have"]')
    path = write(tmp_path / "team", text)
    assert main(["matrix", "--stack", str(path), "--json"]) == 0
    by_file = json.loads(capsys.readouterr().out)
    assert main(["matrix", "--for", "pytorch ==2.13.0 whl_*", "--channel", str(channel), "--platform", "linux-64",
                 "--extension", "torch-scatter==2.1.2", "--json"]) == 0
    by_flags = json.loads(capsys.readouterr().out)
    assert by_file == by_flags
    assert [row["kind"] for row in by_file] == ["pytorch", "extension"] and by_file[0]["status"] == "in channel"


def test_the_docs_example_is_the_gpu_runs_stack_file_and_reads() -> None:
    """docs/stack-file.md shows tests/gpu/stack.toml itself, which the schema reads (its paths exist only in the GPU
    run's work folder: tests/gpu/stack_file.py puts them there)."""
    import tomllib

    from torchforge.stackfile.schema import StackFile

    text = (Path(__file__).parent / "gpu" / "stack.toml").read_text()
    assert f"```toml\n{text}```" in (Path(__file__).parent.parent / "docs" / "stack-file.md").read_text()
    model = StackFile.model_validate(stack_load._tuples(tomllib.loads(text)))
    assert (model.pytorch.from_, model.pytorch.version, model.pytorch.cuda, model.arch_list) == ("wheels", "2.11.0",
                                                                                                  "13.0", "9.0")
    assert [e.spec for e in model.extensions] == ["sdists/causal_conv1d-1.7.0.tar.gz", "sdists/mamba_ssm-2.3.2.post1.tar.gz"]
