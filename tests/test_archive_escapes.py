"""The one extraction rule (torchforge.safeextract) through the real commands: hostile wheels, .conda and
.tar.bz2 packages and source tarballs, built here, make `rpath audit`, `repack`, `upload` (to a folder; quetz and
anaconda in their own test modules) and `render --source/--magma-source` exit 2 with a message naming the archive
and the member, and nothing lands outside: an existing file keeps its bytes, no file appears beside it, no
channel is made."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.hostile import Case, Member, cases, hostile_package, hostile_tarball, hostile_wheel
from tests.test_upload_helpers import cli

USAGE = 2
ORIGINAL = b"the victim's own bytes\n"
WHEEL_CASES = ("absolute", "dotdot", "symlink")  # a zip has no hardlinks; device types are checked too, below
MAGMA_HEADER = b"#define MAGMA_VERSION_MAJOR 2\n#define MAGMA_VERSION_MINOR 6\n#define MAGMA_VERSION_MICRO 1\n"


class Scene:
    """A victim file that an escape would overwrite, an empty folder where a new file would appear, and a
    private TMPDIR (the commands' scratch folders) that must be empty again afterwards."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.victim = root / "victim.txt"
        self.victim.write_bytes(ORIGINAL)
        self.outside = root / "outside"
        self.outside.mkdir()
        self.tmp = root / "tmp"
        self.tmp.mkdir()
        self.cases = {case.id: case for case in cases(self.victim, self.outside)}

    def run(self, *args: str) -> tuple[int, str]:
        result = cli(*args, env={"TMPDIR": str(self.tmp)})
        text = result.stdout + result.stderr
        assert "Traceback" not in text and "internal error" not in text, text
        return result.returncode, " ".join(text.split())

    def assert_untouched(self) -> None:
        assert self.victim.read_bytes() == ORIGINAL
        assert not os.path.exists(self.victim.parent / "escaped")
        assert os.listdir(self.outside) == []
        # The scratch folders are gone: only the per-user root they live in (torchforge-<uid>) may stay.
        left = [p for p in self.tmp.rglob("*") if not p.is_dir() or p.is_symlink() or p.parent != self.tmp]
        assert left == [], left


@pytest.fixture
def scene(tmp_path: Path) -> Scene:
    return Scene(tmp_path)


def assert_refused(code: int, text: str, archive: Path, case: Case) -> None:
    assert code == USAGE, (case.id, text)
    assert f"{archive}: member '{case.refused}' {case.why}" in text, (case.id, text)


# ------------------------------------------------------------------------------------------------- wheels


@pytest.mark.parametrize("case_id", WHEEL_CASES)
def test_rpath_audit_refuses_a_wheel_with_a_member_outside(case_id: str, scene: Scene) -> None:
    case = scene.cases[case_id]
    wheel = hostile_wheel(scene.root / "wheel", case.members)
    code, text = scene.run("rpath", "audit", str(wheel))
    assert_refused(code, text, wheel, case)
    scene.assert_untouched()


@pytest.mark.parametrize("case_id", WHEEL_CASES)
def test_repack_refuses_a_wheel_with_a_member_outside_and_makes_no_channel(case_id: str, scene: Scene) -> None:
    case = scene.cases[case_id]
    wheel = hostile_wheel(scene.root / "wheel", case.members)
    channel = scene.root / "chan"
    code, text = scene.run("repack", str(wheel), "--out", str(channel))
    assert_refused(code, text, wheel, case)
    assert not channel.exists()
    scene.assert_untouched()


@pytest.mark.parametrize("kind, words", [("chr", "is a character device"), ("fifo", "is a fifo")])
def test_a_wheel_member_of_a_device_type_is_refused(kind: str, words: str, scene: Scene) -> None:
    wheel = hostile_wheel(scene.root / "wheel", (Member("torch/dev0", kind),))
    code, text = scene.run("rpath", "audit", str(wheel))
    assert code == USAGE and f"{wheel}: member 'torch/dev0' {words}" in text, text
    scene.assert_untouched()


@pytest.mark.parametrize("name", ["C:/Windows/escaped.dll", "\\\\server\\share\\escaped"])
def test_a_wheel_member_at_a_windows_absolute_path_is_refused(name: str, scene: Scene) -> None:
    # Wheels and packages also install on Windows, where a drive or a UNC root is absolute.
    wheel = hostile_wheel(scene.root / "wheel", (Member(name),))
    code, text = scene.run("rpath", "audit", str(wheel))
    assert code == USAGE and f"{wheel}: member {name!r} is an absolute path" in text, text
    scene.assert_untouched()


# -------------------------------------------------------------------------------------- conda packages

PACKAGE_CASES = ("absolute", "dotdot", "symlink", "relative-symlink", "link-chain", "hardlink", "device", "fifo")


@pytest.mark.parametrize("fmt", [".conda", ".tar.bz2"])
@pytest.mark.parametrize("case_id", PACKAGE_CASES)
def test_rpath_audit_refuses_a_package_with_a_member_outside(case_id: str, fmt: str, scene: Scene) -> None:
    case = scene.cases[case_id]
    package = hostile_package(scene.root / "out" / "linux-64", case.members, fmt)
    code, text = scene.run("rpath", "audit", str(package))
    assert_refused(code, text, package, case)
    scene.assert_untouched()


@pytest.mark.parametrize("fmt", [".conda", ".tar.bz2"])
@pytest.mark.parametrize("case_id", PACKAGE_CASES)
def test_upload_to_a_folder_refuses_a_package_with_a_member_outside(case_id: str, fmt: str, scene: Scene) -> None:
    # The install check after publishing died with SIGABRT and left the package listed; now nothing is sent.
    case = scene.cases[case_id]
    package = hostile_package(scene.root / "out" / "linux-64", case.members, fmt)
    channel = scene.root / "chan"
    for extra in ((), ("--no-verify",)):
        code, text = scene.run("upload", str(package), "--to", channel.as_uri(), *extra)
        assert_refused(code, text, package, case)
        assert not channel.exists()
    scene.assert_untouched()


def test_a_good_package_still_audits_and_uploads(scene: Scene) -> None:
    package = hostile_package(scene.root / "out" / "linux-64", (Member("share/inside", "symlink", "hello/hello.txt"),))
    code, text = scene.run("rpath", "audit", str(package))
    assert code == 0, text
    code, text = scene.run("upload", str(package), "--to", (scene.root / "chan").as_uri())
    assert code == 0, text
    assert (scene.root / "chan" / "linux-64" / package.name).is_file()


# ------------------------------------------------------------------------------- source and MAGMA tarballs

RENDER = ("render", "--pytorch", "2.13.0", "--flavour", "official", "--cuda", "12.6", "--py", "3.12")


@pytest.mark.parametrize("case_id", ("absolute", "dotdot", "symlink", "hardlink", "device"))
def test_a_magma_source_tarball_with_a_member_outside_is_refused(case_id: str, scene: Scene) -> None:
    case = scene.cases[case_id]
    tarball = hostile_tarball(scene.root / "magma-2.6.1.tar.gz", "magma-2.6.1",
                              {"include/magma_types.h": MAGMA_HEADER, "CMakeLists.txt": b"project(MAGMA)\n"},
                              case.members)
    out = scene.root / "recipes"
    code, text = scene.run(*RENDER, "--magma-source", str(tarball), "--out", str(out))
    assert_refused(code, text, tarball, case)
    assert not out.exists()
    scene.assert_untouched()


@pytest.mark.parametrize("case_id", ("absolute", "dotdot", "symlink", "fifo"))
def test_a_pytorch_source_tarball_with_a_member_outside_is_refused(case_id: str, scene: Scene) -> None:
    case = scene.cases[case_id]
    tarball = hostile_tarball(scene.root / "pytorch-v2.13.0.tar.gz", "pytorch-v2.13.0",
                              {"setup.py": b"# PyTorch\n"}, case.members)
    out = scene.root / "recipes"
    code, text = scene.run("render", "--pytorch", "2.13.0", "--cuda", "cpu", "--py", "3.12",
                           "--source", str(tarball), "--out", str(out))
    assert_refused(code, text, tarball, case)
    assert not out.exists()
    scene.assert_untouched()
