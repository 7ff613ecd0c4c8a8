"""The pipeline's RPATH step on a built package: untouched when clean, fixed and re-archived when not."""

from __future__ import annotations

import hashlib
import json
import subprocess
import time
from pathlib import Path

import pytest
from conda_package_handling import api as cph

from torchforge.elf import read_elf
from torchforge.errors import AuditFailedError
from torchforge.postbuild import fix_and_audit_package
from torchforge.proc import Runner
from torchforge.rpath import Layout, audit

SITE = "lib/python3.11/site-packages"


def _package_with_needed(tmp_path: Path, needed: Path) -> Path:
    """Like _package, but libfixture.so also needs `needed`, which the package does not ship."""
    tmp_path.mkdir()
    # --no-as-needed: Debian's gcc would drop a library no symbol is taken from
    return _package(tmp_path, "$ORIGIN", link=["-Wl,--no-as-needed", f"-L{needed.parent}", "-lmissing"])


def _package(tmp_path: Path, rpath: str | None, link: list[str] | None = None, shared_link: bool = False) -> Path:
    """A conda package with torch/lib/libfixture.so (built by gcc) carrying `rpath`; with `shared_link`, also the
    symlink torch/lib/libc10.so -> ../../../../libc10.so that the conda-forge flavour's pytorch ships: it resolves
    only in an environment, where libtorch installs lib/libc10.so, so in the package alone it dangles."""
    stage = tmp_path / "stage"
    lib = stage / SITE / "torch" / "lib"
    lib.mkdir(parents=True)
    (tmp_path / "f.c").write_text("int fixture(void) { return 42; }\n")
    flags = [f"-Wl,-rpath,{rpath}", "-Wl,--disable-new-dtags"] if rpath else []
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib / "libfixture.so"), str(tmp_path / "f.c"), *flags,
                    *(link or [])], check=True)
    relative = f"{SITE}/torch/lib/libfixture.so"
    data = (stage / relative).read_bytes()
    (stage / "info").mkdir()
    (stage / "info" / "index.json").write_text(json.dumps({
        "name": "pytorch", "version": "2.9.0", "build": "py3.11_cpu_0", "build_number": 0, "depends": [],
        "subdir": "linux-64", "platform": "linux", "arch": "x86_64", "timestamp": int(time.time() * 1000)}))
    paths = [{"_path": relative, "path_type": "hardlink", "sha256": hashlib.sha256(data).hexdigest(),
              "size_in_bytes": len(data)}]
    if shared_link:
        (lib / "libc10.so").symlink_to("../../../../libc10.so")
        paths.append({"_path": f"{SITE}/torch/lib/libc10.so", "path_type": "softlink", "sha256": "0" * 64,
                      "size_in_bytes": 21})
    (stage / "info" / "paths.json").write_text(json.dumps({"paths_version": 1, "paths": paths}))
    (stage / "info" / "files").write_text("".join(p["_path"] + "\n" for p in paths))
    out = tmp_path / "out"
    out.mkdir()
    cph.create(str(stage), [p["_path"] for p in paths] + ["info/index.json", "info/paths.json", "info/files"],
               "pytorch-2.9.0-py3.11_cpu_0.conda", out_folder=str(out))
    return out / "pytorch-2.9.0-py3.11_cpu_0.conda"


def test_a_clean_package_is_left_untouched(tmp_path: Path) -> None:
    package = _package(tmp_path, "$ORIGIN:$ORIGIN/../../../..")
    before = package.read_bytes()
    assert fix_and_audit_package(package, Runner()) == package
    assert package.read_bytes() == before


def test_a_build_machine_rpath_is_fixed_and_paths_json_follows(tmp_path: Path) -> None:
    package = _package(tmp_path, "/usr/local/cuda/lib64")
    assert not audit(package, Layout.CONDA).ok
    fix_and_audit_package(package, Runner())
    assert audit(package, Layout.CONDA).ok
    tree = tmp_path / "check"
    cph.extract(str(package), dest_dir=str(tree))
    library = tree / SITE / "torch" / "lib" / "libfixture.so"
    assert "/usr/local/cuda" not in (read_elf(library).rpath or "")
    entry = json.loads((tree / "info" / "paths.json").read_text())["paths"][0]
    assert entry["sha256"] == hashlib.sha256(library.read_bytes()).hexdigest()
    assert entry["size_in_bytes"] == library.stat().st_size


def test_a_fix_keeps_a_symlink_that_resolves_only_in_the_environment(tmp_path: Path) -> None:
    """The conda-forge flavour's pytorch links torch/lib/libc10.so to libtorch's lib/libc10.so: a fix of another
    library rewrites the archive with the link as it was (its paths.json entry untouched), not a failure."""
    package = _package(tmp_path, "/usr/local/cuda/lib64", shared_link=True)
    fix_and_audit_package(package, Runner())
    assert audit(package, Layout.CONDA).ok
    tree = tmp_path / "check"
    cph.extract(str(package), dest_dir=str(tree))
    link = tree / SITE / "torch" / "lib" / "libc10.so"
    assert link.is_symlink() and str(link.readlink()) == "../../../../libc10.so"
    entries = json.loads((tree / "info" / "paths.json").read_text())["paths"]
    assert entries[1] == {"_path": f"{SITE}/torch/lib/libc10.so", "path_type": "softlink", "sha256": "0" * 64,
                          "size_in_bytes": 21}
    library = tree / SITE / "torch" / "lib" / "libfixture.so"
    assert entries[0]["sha256"] == hashlib.sha256(library.read_bytes()).hexdigest()


def test_dry_run_prints_the_patchelf_commands_and_never_rewrites(tmp_path: Path) -> None:
    package = _package(tmp_path, "/usr/local/cuda/lib64")
    before = package.read_bytes()
    runner = Runner(dry_run=True)
    fix_and_audit_package(package, runner)
    assert package.read_bytes() == before
    assert any("--set-rpath" in command.argv for command in runner.history)


def test_a_library_that_cannot_be_resolved_fails_the_step(tmp_path: Path) -> None:
    (tmp_path / "g.c").write_text("int g(void) { return 1; }\n")
    # relink with a dependency that exists nowhere in the package or the environment layout
    missing = tmp_path / "libmissing.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(missing), str(tmp_path / "g.c")], check=True)
    broken = _package_with_needed(tmp_path / "b", missing)
    before = broken.read_bytes()
    with pytest.raises(AuditFailedError):
        fix_and_audit_package(broken, Runner())
    assert broken.read_bytes() == before


def test_a_link_into_another_package_survives_the_fix(tmp_path: Path) -> None:
    """pytorch's torch/lib links point at libtorch's libraries in <prefix>/lib, another package: dangling inside
    this one. Fixing the package's RPATHs keeps them as they are (their paths.json entry too)."""
    package = _package(tmp_path, "/usr/local/cuda/lib64")
    tree = tmp_path / "tree"
    cph.extract(str(package), dest_dir=str(tree))
    link = f"{SITE}/torch/lib/libc10.so"
    (tree / link).symlink_to("../../../../libc10.so")
    paths = json.loads((tree / "info" / "paths.json").read_text())
    paths["paths"].append({"_path": link, "path_type": "softlink", "sha256": "0" * 64, "size_in_bytes": 0})
    (tree / "info" / "paths.json").write_text(json.dumps(paths))
    members = [e["_path"] for e in paths["paths"]] + ["info/index.json", "info/paths.json", "info/files"]
    package.unlink()
    cph.create(str(tree), members, package.name, out_folder=str(package.parent))
    fix_and_audit_package(package, Runner())
    assert audit(package, Layout.CONDA).ok
    fixed = tmp_path / "fixed"
    cph.extract(str(package), dest_dir=str(fixed))
    assert (fixed / link).is_symlink() and str((fixed / link).readlink()) == "../../../../libc10.so"
    entry = next(e for e in json.loads((fixed / "info" / "paths.json").read_text())["paths"] if e["_path"] == link)
    assert entry["sha256"] == "0" * 64
