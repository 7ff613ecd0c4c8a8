"""rpath audit/fix on small gcc-built stand-ins for PyTorch's layout (tests/fixtures/elf/README.md)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import typer
from typer.testing import CliRunner

from torchforge.commands import rpath as rpath_commands
from torchforge.elf import read_elf
from torchforge.errors import AuditFailedError, ExitCode
from torchforge.proc import Runner
from torchforge.rpath import Kind, Layout, audit, audit_tree
from torchforge.rpath.fix import apply_plan, find_patchelf, fix_and_audit, hashed_name, plan_fix

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "elf"))
import elf_fixtures as fx  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is needed to build the ELF fixtures")


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> object:
    return fx.compile_all(tmp_path_factory.mktemp("elf-built"))


def kinds(report: object) -> set[Kind]:
    return {f.kind for f in report.findings}  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------------------------- conda


def test_conda_prefix_before_fix_is_flagged_and_does_not_load(built: object, tmp_path: Path) -> None:
    site = fx.conda_prefix(built, tmp_path)
    report = audit(tmp_path)
    assert report.layout is Layout.CONDA
    assert Kind.RUNPATH in kinds(report)
    # _C needs libbar.so from torch/lib and only searches $ORIGIN: unresolved, and really not loadable.
    assert any(f.kind is Kind.UNRESOLVED and f.file.endswith("torch/_C.so") for f in report.findings)
    with pytest.raises(AssertionError, match="libbar.so"):
        fx.call(site / "torch" / "_C.so", "ext")


def test_conda_fix_sets_official_rpaths_and_loads(built: object, tmp_path: Path) -> None:
    site = fx.conda_prefix(built, tmp_path)
    report = fix_and_audit(tmp_path, Layout.CONDA, Runner())
    assert report.ok
    torch = site / "torch"
    c_info = read_elf(torch / "_C.so")
    lib_info = read_elf(torch / "lib" / "libbar.so")
    tool_info = read_elf(torch / "bin" / "tool")
    assert c_info and lib_info and tool_info
    # official-builds.md §1.8, computed per directory; DT_RPATH, no DT_RUNPATH left.
    assert c_info.rpath == ("$ORIGIN", "$ORIGIN/lib", "$ORIGIN/../../..") and not c_info.runpath
    assert lib_info.rpath == ("$ORIGIN", "$ORIGIN/../../../..") and not lib_info.runpath
    assert tool_info.rpath == ("$ORIGIN", "$ORIGIN/../lib", "$ORIGIN/../../../..")
    assert fx.call(torch / "_C.so", "ext") == 44
    # libgpu finds libdep.so.1 in <prefix>/lib through $ORIGIN/../../../..
    assert fx.call(torch / "lib" / "libgpu.so", "gpu") == 14
    assert subprocess.run([str(torch / "bin" / "tool")], env={}).returncode == 0


def test_second_fix_rewrites_nothing(built: object, tmp_path: Path) -> None:
    fx.conda_prefix(built, tmp_path)
    fix_and_audit(tmp_path, Layout.CONDA, Runner())
    stamps = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in tmp_path.rglob("*") if p.is_file()}
    plan = plan_fix(tmp_path, Layout.CONDA)
    assert plan.changes == () and len(plan.unchanged) == 6  # 5 torch files + <prefix>/lib/libdep.so.1
    runner = Runner()
    assert apply_plan(plan, runner) == []
    assert runner.history == []  # not even the patchelf version check ran
    assert {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in stamps} == stamps


def test_dry_run_changes_nothing_and_records_patchelf_argv(built: object, tmp_path: Path) -> None:
    site = fx.conda_prefix(built, tmp_path)
    before = (site / "torch" / "_C.so").read_bytes()
    runner = Runner(dry_run=True)
    apply_plan(plan_fix(tmp_path, Layout.CONDA), runner)
    assert (site / "torch" / "_C.so").read_bytes() == before
    argvs = [c.argv for c in runner.history]
    c_argv = next(a for a in argvs if a[-1].endswith("torch/_C.so"))
    assert c_argv[1:] == ("--set-rpath", "$ORIGIN:$ORIGIN/lib:$ORIGIN/../../..", "--force-rpath", c_argv[-1])


def test_package_tree_resolves_env_libraries_through_declared_depends(built: object, tmp_path: Path) -> None:
    # A conda package (not an environment): a library from <prefix>/lib counts only if a dependency ships it.
    site = fx.conda_prefix(built, tmp_path)
    shutil.rmtree(tmp_path / "conda-meta")
    (tmp_path / "lib" / "libdep.so.1").unlink()
    (tmp_path / "info").mkdir()
    index = {"name": "pytorch", "version": "1.0", "depends": ["python >=3.11"]}
    (tmp_path / "info" / "index.json").write_text(json.dumps(index))
    with pytest.raises(AuditFailedError, match="libdep.so.1"):
        fix_and_audit(tmp_path, Layout.CONDA, Runner())
    # Make libgpu need libcudart.so.12 (the real case) and declare cuda-cudart: resolved through <prefix>/lib.
    patchelf = find_patchelf(Runner())
    gpu = site / "torch" / "lib" / "libgpu.so"
    subprocess.run([patchelf, "--replace-needed", "libdep.so.1", "libcudart.so.12", str(gpu)], check=True)
    assert audit_tree(tmp_path, Layout.CONDA).ok is False
    index["depends"] = ["python >=3.11", "cuda-cudart >=12.4,<13"]
    (tmp_path / "info" / "index.json").write_text(json.dumps(index))
    report = audit_tree(tmp_path, Layout.CONDA)
    assert report.ok
    where = {r.needed: r.where for f in report.files for r in f.resolutions}
    assert where["libcudart.so.12"] == "env" and where["libfoo.so"] == "package" and where["libc.so.6"] == "system"


# ---------------------------------------------------------------------------------------------- flagged


def test_build_machine_rpath_is_flagged(built: object, tmp_path: Path) -> None:
    site = fx.conda_prefix(built, tmp_path)
    fix_and_audit(tmp_path, Layout.CONDA, Runner())
    patchelf = find_patchelf(Runner())
    target = site / "torch" / "lib" / "libbar.so"
    subprocess.run([patchelf, "--set-rpath", "/usr/local/cuda/lib64:$ORIGIN", "--force-rpath", str(target)], check=True)
    report = audit(tmp_path)
    assert [(f.file, f.kind, f.detail) for f in report.findings] == [
        (target.relative_to(tmp_path).as_posix(), Kind.BUILD_PATH, "/usr/local/cuda/lib64")
    ]
    # and the fix takes it out again
    assert fix_and_audit(tmp_path, Layout.CONDA, Runner()).ok


def test_removed_library_is_flagged(built: object, tmp_path: Path) -> None:
    site = fx.conda_prefix(built, tmp_path)
    fix_and_audit(tmp_path, Layout.CONDA, Runner())
    (site / "torch" / "lib" / "libfoo.so").unlink()
    report = audit(tmp_path)
    flagged = {(f.file.rsplit("/", 1)[-1], f.kind) for f in report.findings}
    assert flagged == {("libbar.so", Kind.UNRESOLVED), ("tool", Kind.UNRESOLVED)}


def test_runpath_leaving_dangling_absolute_and_escaping_symlink(built: object, tmp_path: Path) -> None:
    site = fx.conda_prefix(built, tmp_path)
    fix_and_audit(tmp_path, Layout.CONDA, Runner())
    patchelf = find_patchelf(Runner())
    lib = site / "torch" / "lib"
    subprocess.run([patchelf, "--set-rpath", "$ORIGIN", str(lib / "libfoo.so")], check=True)  # RUNPATH
    subprocess.run([patchelf, "--set-rpath", "$ORIGIN:$ORIGIN/../../../../../../../elsewhere", "--force-rpath",
                    str(lib / "libbar.so")], check=True)
    subprocess.run([patchelf, "--set-rpath", "$ORIGIN:$ORIGIN/../lib64:/opt/vendor/lib", "--force-rpath",
                    str(lib / "libgpu.so")], check=True)
    outside = tmp_path.parent / f"{tmp_path.name}-outside.so"
    shutil.copy2(lib / "libfoo.so", outside)
    os.symlink(outside, lib / "libescape.so")
    report = audit(tmp_path)
    got = {(f.file.rsplit("/", 1)[-1], f.kind) for f in report.findings}
    assert got == {
        ("libfoo.so", Kind.RUNPATH),
        ("libbar.so", Kind.LEAVES),
        ("libgpu.so", Kind.DANGLING),
        ("libgpu.so", Kind.ABSOLUTE),
        ("libgpu.so", Kind.UNRESOLVED),  # its RPATH no longer reaches <prefix>/lib for libdep.so.1
        ("libescape.so", Kind.SYMLINK_ESCAPES),
    }
    # fix never follows the symlink out of the tree
    before = outside.read_bytes()
    plan = plan_fix(tmp_path, Layout.CONDA)
    assert all(not c.path.is_symlink() for c in plan.changes)
    apply_plan(plan, Runner())
    assert outside.read_bytes() == before


def test_garbled_elf_is_unreadable_not_skipped(built: object, tmp_path: Path) -> None:
    site = fx.conda_prefix(built, tmp_path)
    data = (site / "torch" / "lib" / "libfoo.so").read_bytes()
    (site / "torch" / "lib" / "libbroken.so").write_bytes(data[:64])  # header only, program headers cut off
    report = audit(tmp_path)
    assert any(f.kind is Kind.UNREADABLE and f.file.endswith("libbroken.so") for f in report.findings)


def test_cli_audit_json_and_exit_code(built: object, tmp_path: Path) -> None:
    app = typer.Typer()
    app.command("noop")(lambda: None)  # a second command keeps `rpath` a sub-command group
    rpath_commands.register(app)
    cli = CliRunner()
    fx.conda_prefix(built, tmp_path)
    result = cli.invoke(app, ["rpath", "audit", str(tmp_path), "--json"])
    assert result.exit_code == int(ExitCode.AUDIT_FAILED)
    payload = json.loads(result.stdout)
    assert payload["ok"] is False and payload["layout"] == "conda"
    assert {"runpath-not-rpath", "unresolved"} <= {f["kind"] for f in payload["findings"]}
    result = cli.invoke(app, ["rpath", "audit", str(tmp_path)])
    assert result.exit_code == int(ExitCode.AUDIT_FAILED) and "runpath-not-rpath" in result.stdout
    assert cli.invoke(app, ["rpath", "fix", str(tmp_path), "--layout", "conda"]).exit_code == 0
    result = cli.invoke(app, ["rpath", "audit", str(tmp_path), "--json"])
    assert result.exit_code == 0 and json.loads(result.stdout)["ok"] is True


# ---------------------------------------------------------------------------------------------- wheels


def test_wheel_bundled_hash_renames_and_replaces_needed(built: object, tmp_path: Path) -> None:
    root = fx.wheel_tree(built, tmp_path / "whl")
    report = audit(root)
    assert report.layout is Layout.WHEEL_BUNDLED
    assert {(f.file, f.kind) for f in report.findings} == {("torch/lib/libgpu.so", Kind.UNRESOLVED),
                                                           ("torch/_C.so", Kind.UNRESOLVED)}
    fixed = fix_and_audit(root, Layout.WHEEL_BUNDLED, Runner(), bundle=[built.dep])
    assert fixed.ok
    hashed = hashed_name(built.dep)
    assert hashed.startswith("libdep-") and hashed.endswith(".so.1") and len(hashed) == len("libdep-12345678.so.1")
    gpu = read_elf(root / "torch" / "lib" / "libgpu.so")
    assert gpu and hashed in gpu.needed and "libdep.so.1" not in gpu.needed
    assert gpu.runpath == ("$ORIGIN",)  # bundled wheels keep DT_RUNPATH, as the official ones
    c_info = read_elf(root / "torch" / "_C.so")
    assert c_info and c_info.runpath == ("$ORIGIN", "$ORIGIN/lib")
    assert fx.call(root / "torch" / "lib" / "libgpu.so", "gpu") == 14
    assert plan_fix(root, Layout.WHEEL_BUNDLED, bundle=[built.dep]).changes == ()


def test_hash_exempt_names_keep_their_name(tmp_path: Path) -> None:
    for name in ("libcudnn_ops.so.9", "libgomp.so.1", "libnvrtc-builtins.so.12.8"):
        (tmp_path / name).write_bytes(b"x")
        assert hashed_name(tmp_path / name) == name
    (tmp_path / "libcupti.so.12").write_bytes(b"x")
    assert hashed_name(tmp_path / "libcupti.so.12") == "libcupti-2d711642.so.12"  # sha256(b"x")[:8]


def test_wheel_nvidia_rpath_list_and_load(built: object, tmp_path: Path) -> None:
    root = fx.wheel_tree(built, tmp_path / "whl", nvidia=True)
    assert audit(root).layout is Layout.WHEEL_NVIDIA
    report = fix_and_audit(root, Layout.WHEEL_NVIDIA, Runner())
    assert report.ok
    gpu = read_elf(root / "torch" / "lib" / "libgpu.so")
    assert gpu and not gpu.runpath
    assert gpu.rpath[0] == "$ORIGIN/../../nvidia/cudnn/lib" and gpu.rpath[-1] == "$ORIGIN"
    c_info = read_elf(root / "torch" / "_C.so")
    # relative to torch/, not copied from torch/lib (the official C_SO_RPATH reused the torch/lib strings)
    assert c_info and c_info.rpath[0] == "$ORIGIN/../nvidia/cudnn/lib" and c_info.rpath[-2:] == ("$ORIGIN", "$ORIGIN/lib")
    resolved = {r.needed: r.where for f in report.files for r in f.resolutions if f.file == "torch/lib/libgpu.so"}
    assert resolved["libdep.so.1"] == "nvidia-pip"
    assert fx.call(root / "torch" / "lib" / "libgpu.so", "gpu") == 14


def test_patchelf_is_version_checked() -> None:
    tool = find_patchelf(Runner())
    out = subprocess.run([tool, "--version"], capture_output=True, text=True, check=True).stdout
    major_minor = tuple(int(x) for x in out.split()[-1].split(".")[:2])
    assert major_minor >= (0, 17) and major_minor[:2] != (0, 18)
