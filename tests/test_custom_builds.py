"""Custom builds never pass for official ones: options that change the binary put a short hash of the variant's
settings into the build string, the settings are recorded in the package, and the reuse check compares them.
Variables torchforge sets or checks are validated the same way from --env as from their options."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.pkgfactory import make_package
from torchforge.cli import main
from tests.official_report import selection_from_flags
from torchforge.engines.rattler_build import RattlerBuildEngine
from torchforge.flavours.official.magmasource import MagmaSource
from torchforge.pipeline import Action, BuildSettings
from torchforge.sequence import official_steps
from torchforge.flavours.official.render import plan
from torchforge.flavours.official.resolve import classify
from torchforge.flavours.official.resolved import Status
from torchforge.flavours.official.variant import Options, Request, Selection, parse_env

OFFICIAL = "py3.12_cuda12.4_cudnn9.1.0_0"


def _variant(**options: object):
    return classify(Request("2.5.1", "12.4", "3.12", "linux-64", Options(**options)))  # type: ignore[arg-type]


def test_every_binary_changing_option_gives_a_distinct_non_official_build_string() -> None:
    assert _variant().build_string == OFFICIAL
    customs = {
        "arch a": _variant(arch_list="8.0;9.0"),
        "arch b": _variant(arch_list="9.0"),
        "env": _variant(extra_env=parse_env(["USE_NCCL=0"])),
        "patch": _variant(patch_digests=("0" * 64,)),
        "debug": _variant(debug=True),
        "source": _variant(source="https://mirror.example/pytorch.git"),
    }
    strings = {name: v.build_string for name, v in customs.items()}
    assert len(set(strings.values())) == len(strings), strings
    for name, variant in customs.items():
        assert variant.status is Status.BUILDABLE, name
        assert variant.build_string.startswith("py3.12_cuda12.4_cudnn9.1.0_") and "_tf" in variant.build_string, name
        assert variant.build_string.endswith("_0") and variant.build_string != OFFICIAL
        assert json.loads(variant.settings), name
    assert json.loads(customs["arch a"].settings) == {"arch_list": "8.0;9.0"}
    assert "_debug_tf" in strings["debug"]


def test_arch_list_from_env_is_checked_like_the_option() -> None:
    by_option = _variant(arch_list="12.0")
    by_env = _variant(extra_env=parse_env(["TORCH_CUDA_ARCH_LIST=12.0"]))
    assert by_option.status is by_env.status is Status.REFUSED
    assert by_option.refusals == tuple(r for r in by_env.refusals)
    assert "GPU arch 12.0 is outside what nvcc 12.4 accepts" in by_env.refusals[0]
    # The same list through either door is the same package.
    by_flag, by_var = _variant(arch_list="8.0;9.0"), _variant(extra_env=parse_env(["TORCH_CUDA_ARCH_LIST=8.0;9.0"]))
    assert (by_flag.arch_list, by_flag.build_string) == (by_var.arch_list, by_var.build_string)
    assert _variant(debug=True).build_string == _variant(extra_env=parse_env(["DEBUG=1"])).build_string
    disagree = _variant(arch_list="8.0", extra_env=parse_env(["TORCH_CUDA_ARCH_LIST=9.0"]))
    assert "disagree" in "; ".join(disagree.refusals)


@pytest.mark.parametrize(
    ("request_", "reason"),
    [
        (Request("2.5.1", "12.4", "3.12", "linux-64", Options(extra_env=(("USE_CUDA", "0"),))), "use --cuda cpu instead"),
        (Request("2.5.1", "cpu", "3.12", "linux-64", Options(extra_env=(("USE_CUDA", "1"),))), "--cuda X.Y"),
        (Request("2.5.1", "12.4", "3.12", "linux-64", Options(extra_env=(("USE_MAGMA", "off"),))), "as 0 or 1"),
        (Request("2.5.1", "12.4", "3.12", "win-64", Options(extra_env=(("USE_MAGMA", "1"),))), "no magma-cuda package for win-64"),
    ],
)
def test_switches_torchforge_sets_are_validated_from_env(request_: Request, reason: str) -> None:
    variant = classify(request_)
    assert variant.status is Status.REFUSED and reason in "; ".join(variant.refusals), variant.refusals


def test_use_magma_0_drops_magma_from_the_plan_and_the_recipe(tmp_path: Path) -> None:
    selection = Selection("2.5.1", ("12.4",), ("3.12",), "linux-64", Options(extra_env=(("USE_MAGMA", "0"),)))
    render_plan = plan(selection)
    assert render_plan.magma == () and render_plan.variants[0].magma is None
    assert main(["render", "--pytorch", "2.5.1", "--cuda", "12.4", "--py", "3.12", "--env", "USE_MAGMA=0",
                 "--out", str(tmp_path / "r")]) == 0
    assert [p.name for p in (tmp_path / "r").iterdir()] == ["pytorch-2.5.1-cu124-py312-linux_64"]
    meta = (tmp_path / "r" / "pytorch-2.5.1-cu124-py312-linux_64" / "meta.yaml").read_text()
    assert "magma-cuda124" not in meta and "USE_MAGMA=0" in (tmp_path / "r" / "pytorch-2.5.1-cu124-py312-linux_64" / "build.sh").read_text()


def test_patch_content_is_part_of_the_build_string(tmp_path: Path) -> None:
    strings = []
    for text in ("--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+one\n", "--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+two\n"):
        patch = tmp_path / "fix.patch"
        patch.write_text(text)
        out = tmp_path / f"r-{len(strings)}"
        assert main(["render", "--pytorch", "2.5.1", "--cuda", "12.4", "--py", "3.12", "--patch", str(patch),
                     "--env", "USE_MAGMA=0", "--out", str(out)]) == 0
        meta = (out / "pytorch-2.5.1-cu124-py312-linux_64" / "meta.yaml").read_text()
        strings.append(next(line.split()[1] for line in meta.splitlines() if line.strip().startswith("string:")))
    assert strings[0] != strings[1] and all("_tf" in s for s in strings)


def test_reuse_check_compares_the_recorded_settings(tmp_path: Path) -> None:
    out = tmp_path / "channel"
    selection = Selection("2.5.1", ("12.4",), ("3.12",), "linux-64", Options(arch_list="8.0;9.0"))
    variant = plan(selection).variants[0]
    settings = BuildSettings(out=out, magma_only=False)
    engine = RattlerBuildEngine()
    # A package with the planned name but other recorded settings is rebuilt, not silently reused.
    make_package(out / "linux-64", "pytorch", "2.5.1", variant.build_string,
                 about_extra={"torchforge_settings": json.dumps({"arch_list": "9.0"})})
    step = next(s for s in official_steps(plan(selection), engine, settings) if s.kind == "pytorch")
    assert step.action is Action.BUILD and "built with other settings" in step.reason
    make_package(out / "linux-64", "pytorch", "2.5.1", variant.build_string,
                 about_extra={"torchforge_settings": variant.settings})
    step = next(s for s in official_steps(plan(selection), engine, settings) if s.kind == "pytorch")
    assert step.action is Action.REUSE


def test_a_custom_magma_never_takes_the_official_name() -> None:
    official = _variant().magma
    custom = _variant(arch_list="8.0;9.0").magma
    tree = MagmaSource("tree", "/srv/magma-2.6.1", "2.6.1")  # a local tree may differ from the release tarball
    mirrored = classify(Request("2.5.1", "12.4", "3.12", "linux-64", Options(magma_source=tree))).magma
    assert official is not None and custom is not None and mirrored is not None
    assert official.build_string == "1" and official.status is Status.OFFICIAL
    assert custom.build_string.startswith("tf") and custom.build_string.endswith("_1")
    assert custom.status is Status.BUILDABLE and json.loads(custom.settings) == {"gencode": ["80", "90"]}
    assert len({official.build_string, custom.build_string, mirrored.build_string}) == 3
    # a mirror URL of the release tarball is pinned to the release's sha256: the same package, the official name
    url = MagmaSource("url", "https://mirror.example/magma-2.6.1.tar.gz")
    via_mirror = classify(Request("2.5.1", "12.4", "3.12", "linux-64", Options(magma_source=url))).magma
    assert via_mirror is not None and via_mirror.build_string == "1" and via_mirror.status is Status.OFFICIAL


def test_a_custom_build_of_an_earlier_magma_build_is_pinned_by_its_own_build_string() -> None:
    """1.12.1 cu116 links magma 2.6.1 build 0; with --arch-list that build becomes torchforge's own (tf<hash>_0),
    and the pytorch recipe asks for exactly it, never for the official build 0 or the current build 1."""
    official = classify(Request("1.12.1", "11.6", "3.10", "linux-64")).magma
    custom = classify(Request("1.12.1", "11.6", "3.10", "linux-64", Options(arch_list="8.0;8.6"))).magma
    assert official is not None and custom is not None
    assert official.host_spec == "magma-cuda116 ==2.6.1 0"
    assert custom.build_string.startswith("tf") and custom.build_string.endswith("_0")
    assert custom.host_spec == f"magma-cuda116 ==2.6.1 {custom.build_string}"
    assert custom.id == official.id == "magma-cuda116-2.6.1-build0-linux_64"
    current = classify(Request("1.13.1", "11.6", "3.10", "linux-64")).magma
    assert current is not None and current.host_spec == "magma-cuda116 ==2.6.1"


@pytest.mark.parametrize(
    "custom",
    [["matrix", "--debug"], ["matrix", "--arch-list", "8.0"], ["matrix", "--env", "USE_NCCL=0"],
     ["matrix", "--build-number", "3"], ["render", "--source", "tests/fixtures/torch_like"]],
    ids=["debug", "arch-list", "env", "build-number", "source"],
)
def test_options_that_only_customise_a_build_leave_the_default_release_alone(
        custom: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 25 item 2: CUDA 11.8 with Python 3.10 had official conda packages up to 2.5.1; a custom option
    makes the build custom, it does not make 2.5.1's packages unpublished."""
    official = "PyTorch 2.5.1: the newest release with official conda packages of CUDA 11.8 with Python 3.10"
    assert main(["matrix", "--cuda", "11.8", "--py", "3.10"]) == 0
    assert official in " ".join(capsys.readouterr().err.split())
    out = ["--out", str(tmp_path / "recipes")] if custom[0] == "render" else []
    assert main([*custom, *out, "--cuda", "11.8", "--py", "3.10"]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert official in err and "no release published" not in err, err
    if custom[1] != "--build-number":  # and it says the options make the build custom
        assert f"{custom[1]} makes it a custom build" in err, err


# ---------------------------------------------------------------- issue 25 item 3: what a local --source holds

FIXTURE = Path(__file__).parent / "fixtures" / "torch_like"


def _build_string(source: str, arch_list: str | None = None) -> str:
    selection = selection_from_flags("2.5.1", "12.4", "3.12", None, arch_list=arch_list, source=source,
                                     env=["USE_MAGMA=0"])
    variant = classify(selection.requests()[0])
    assert variant.status is Status.BUILDABLE and variant.build_string, variant.refusals
    return variant.build_string


def _git(tree: Path, *argv: str) -> None:
    subprocess.run(["git", "-C", str(tree), "-c", "user.name=t", "-c", "user.email=t@example.org", *argv],
                   check=True, capture_output=True)


def test_a_local_source_is_identified_by_its_content_not_its_spelling(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tree = tmp_path / "torch_like"
    shutil.copytree(FIXTURE, tree)
    monkeypatch.chdir(tmp_path)
    spellings = {_build_string(s) for s in ("torch_like", str(tree), "./torch_like/", "../" + tmp_path.name + "/torch_like")}
    assert len(spellings) == 1, spellings
    before = spellings.pop()
    readme = tree / "README.md"
    readme.write_text(readme.read_text() + "edited\n")
    edited = _build_string("torch_like")
    assert edited != before
    (tree / "README.md").chmod(0o755)  # a mode is content too
    assert _build_string("torch_like") != edited


def test_a_git_source_is_identified_by_head_and_its_uncommitted_changes(tmp_path: Path) -> None:
    tree = tmp_path / "checkout"
    shutil.copytree(FIXTURE, tree)
    _git(tree, "init", "-q")
    _git(tree, "add", "-A")
    _git(tree, "commit", "-qm", "one")
    clean = _build_string(str(tree))
    (tree / "build").mkdir()  # what git ignores is not the source
    (tree / ".gitignore").write_text("build/\n")
    _git(tree, "add", ".gitignore")
    _git(tree, "commit", "-qm", "ignore build/")
    committed = _build_string(str(tree))
    assert committed != clean
    (tree / "build" / "object.o").write_bytes(b"\0")
    assert _build_string(str(tree)) == committed
    setup = tree / "setup.py"
    setup.write_text(setup.read_text() + "# edited\n")
    dirty = _build_string(str(tree))
    assert dirty != committed
    (tree / "new.py").write_text("x = 1\n")  # an untracked file is an uncommitted change
    untracked = _build_string(str(tree))
    assert untracked not in (dirty, committed)
    (tree / "new.py").unlink()
    _git(tree, "checkout", "--", "setup.py")
    assert _build_string(str(tree)) == committed


def test_the_source_fixture_inside_this_checkout_is_identified_by_its_own_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """tests/fixtures/torch_like lives inside torchforge's own git tree: spelled three ways, one build string."""
    monkeypatch.chdir(FIXTURE.parents[2])
    strings = {_build_string(s) for s in ("tests/fixtures/torch_like", str(FIXTURE), "./tests/fixtures/torch_like/")}
    assert len(strings) == 1, strings


def test_equivalent_arch_lists_give_one_hash() -> None:
    strings = {_variant(arch_list=a).build_string for a in ("8.0;9.0", "9.0;8.0", "8.0;;9.0", " 8.0 ; 9.0 ")}
    assert len(strings) == 1, strings
    assert _variant(arch_list="8.0;9.0").arch_list == "8.0;9.0"
    assert _variant(arch_list="8.0;9.0+PTX").build_string not in strings


def test_the_reuse_message_says_what_it_compared(tmp_path: Path) -> None:
    out = tmp_path / "channel"
    tree = tmp_path / "src"
    shutil.copytree(FIXTURE, tree)
    selection = selection_from_flags("2.5.1", "12.4", "3.12", None, arch_list="9.0;8.0", source=str(tree),
                                     env=["USE_MAGMA=0"])
    variant = plan(selection).variants[0]
    make_package(out / "linux-64", "pytorch", "2.5.1", variant.build_string,
                 about_extra={"torchforge_settings": variant.settings})
    step = next(s for s in official_steps(plan(selection), RattlerBuildEngine(), BuildSettings(out=out, magma_only=False))
                if s.kind == "pytorch")
    assert step.action is Action.REUSE
    assert "same settings" in step.reason and "arch list 8.0;9.0" in step.reason, step.reason
    assert "source sha256:" in step.reason and "env USE_MAGMA=0" in step.reason, step.reason


def test_a_local_magma_tree_is_identified_by_its_content(tmp_path: Path) -> None:
    tree = tmp_path / "magma"
    (tree / "include").mkdir(parents=True)
    header = tree / "include" / "magma_types.h"
    header.write_text("#define MAGMA_VERSION_MAJOR 2\n#define MAGMA_VERSION_MINOR 6\n#define MAGMA_VERSION_MICRO 1\n")

    def magma_build_string(location: str) -> str:
        selection = selection_from_flags("2.5.1", "12.4", "3.12", None, magma_source=location)
        magma = classify(selection.requests()[0]).magma
        assert magma is not None
        return magma.build_string

    before = magma_build_string(str(tree))
    assert magma_build_string(f"{tree}/") == before
    (tree / "CMakeLists.txt").write_text("project(magma)\n")
    assert magma_build_string(str(tree)) != before


def test_without_git_a_checkout_is_identified_by_its_content(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.cuda_standin import path_without
    from torchforge import sourcestate

    tree = tmp_path / "checkout"
    shutil.copytree(FIXTURE, tree)
    _git(tree, "init", "-q")
    _git(tree, "add", "-A")
    _git(tree, "commit", "-qm", "one")
    assert sourcestate.identity(str(tree)).startswith("git-tree:")
    monkeypatch.setenv("PATH", path_without("git", tmp_path / "bin"))
    assert sourcestate.identity(str(tree)) == f"sha256:{sourcestate.folder_digest(tree)}"
