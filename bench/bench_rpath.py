"""RPATH audit/fix and repack on the real torch 2.13.0 CPU wheel; ratios measured in this run.

Work files live in ./.bench (gitignored). Compression at zstd level 19 (cph's default) takes 194-287 s on
468 MB here (tooling.md §2), so level 19 vs level 3 vs .tar.bz2 is measured on a SUBSET: the first
SUBSET_MB of libtorch_cpu.so (the file that is 62 % of the package), all three formats on the same bytes.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from bench import Row, timed
from torchforge.elf import iter_tree, maybe_elf, read_elf
from torchforge.proc import Command, Runner
from torchforge.binaries.plan import CudaLibs
from torchforge.binaries.stack import plan_wheels
from torchforge.repack import DEFAULT_ZSTD_LEVEL, build_archive
from torchforge.rpath import Layout, audit_tree
from torchforge.rpath.fix import find_patchelf, fix_and_audit, plan_fix

WORK = Path(__file__).resolve().parents[1] / ".bench" / "rpath"
SUBSET_MB = 32
QUICK_SUBSET_MB = 1


def _wheel(runner: Runner) -> Path:
    wheels = sorted((WORK / "wheel").glob("torch-2.13.0*.whl"))
    if not wheels:
        runner.run(Command(argv=("pip", "download", "torch==2.13.0", "--no-deps", "--quiet", "-d", str(WORK / "wheel"))))
        wheels = sorted((WORK / "wheel").glob("torch-2.13.0*.whl"))
    return wheels[0]


def _unpacked(wheel: Path) -> Path:
    root = WORK / "unpacked"
    if not (root / ".complete").exists():
        import zipfile

        shutil.rmtree(root, ignore_errors=True)
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(root)
        (root / ".complete").write_text("")
    return root


def _elf_copy(src: Path, dest: Path) -> list[Path]:
    """Copy only the ELF files (the ones RPATH tools touch), keeping their paths."""
    shutil.rmtree(dest, ignore_errors=True)
    copied = []
    for path in iter_tree(src):
        if maybe_elf(path) and read_elf(path) is not None:
            target = dest / path.relative_to(src)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
            copied.append(target)
    return copied


def _official_loop(tree: Path, runner: Runner, patchelf: str) -> int:
    """builder conda/build_pytorch.sh §1.8: patchelf --set-rpath --force-rpath on torch/*.so* and torch/lib/*.so*."""
    count = 0
    for pattern, rpath in (("torch/*.so*", "$ORIGIN:$ORIGIN/lib:$ORIGIN/../../.."), ("torch/lib/*.so*", "$ORIGIN:$ORIGIN/../../../..")):
        for so in sorted(tree.glob(pattern)):
            runner.run(Command(argv=(patchelf, "--set-rpath", rpath, "--force-rpath", str(so))))
            count += 1
    return count


def _compress_subset(lib: Path, subset_mb: int) -> list[Row]:
    from conda_package_handling import api as cph

    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-cph-", dir=WORK) as tmp:
        stage = Path(tmp) / "stage"
        (stage / "info").mkdir(parents=True)
        (stage / "info" / "index.json").write_text('{"name": "subset", "version": "0", "build": "0"}')
        with lib.open("rb") as fh:
            (stage / "payload.bin").write_bytes(fh.read(subset_mb << 20))
        files = ["payload.bin", "info/index.json"]
        results = {}
        for label, ext, kwargs in (
            ("zstd 19, 1 thread (cph default)", ".conda", {"compression_level": 19, "compression_threads": 1}),
            ("zstd 3, all threads", ".conda", {"compression_level": 3, "compression_threads": -1}),
            (f"zstd {DEFAULT_ZSTD_LEVEL}, all threads (torchforge)", ".conda",
             {"compression_level": DEFAULT_ZSTD_LEVEL, "compression_threads": -1}),
            (".tar.bz2 (bz2 level 9)", ".tar.bz2", {}),
        ):
            out = Path(tmp) / f"out{len(results)}"
            out.mkdir(parents=True)
            seconds = timed(lambda: cph.create(str(stage), files, f"subset-0-0{ext}", out_folder=str(out), **kwargs))
            size = (out / f"subset-0-0{ext}").stat().st_size
            results[label] = (seconds, size)
            rows.append(Row("compress subset", label, f"{seconds:.2f} s, {size / 1e6:.1f} MB",
                            f"first {subset_mb} MB of libtorch_cpu.so"))
        (t19, s19), (t3, s3), (tl, sl), (tbz, sbz) = results.values()
        for level, (t, s) in ((3, (t3, s3)), (DEFAULT_ZSTD_LEVEL, (tl, sl))):
            rows.append(Row("compress subset", f"level {level} vs level 19", f"{t19 / t:.0f}x faster, {100 * (s / s19 - 1):+.0f}% size",
                            "target: >=10x faster, <=15% larger"))
        rows.append(Row("compress subset", f"level {DEFAULT_ZSTD_LEVEL} vs .tar.bz2", f"{tbz / tl:.0f}x faster, {100 * (sl / sbz - 1):+.0f}% size", ""))
    return rows


def run(quick: bool = False) -> list[Row]:
    repeat = 1 if quick else 3
    runner = Runner()
    WORK.mkdir(parents=True, exist_ok=True)
    wheel = _wheel(runner)
    root = _unpacked(wheel)
    rows: list[Row] = []

    audit_s = timed(lambda: audit_tree(root), repeat=repeat)
    count = len(audit_tree(root).files)
    rows.append(Row("rpath audit", "unpacked torch 2.13 wheel", f"{audit_s:.3f} s", f"{count} ELF files; target < 0.5 s"))

    patchelf = find_patchelf(runner)
    official = WORK / "official"
    _elf_copy(root, official)
    start = time.perf_counter()
    n_official = _official_loop(official, runner, patchelf)
    official_s = time.perf_counter() - start
    ours = WORK / "ours"
    _elf_copy(root, ours)
    start = time.perf_counter()
    plan = plan_fix(ours, Layout.CONDA)
    fix_and_audit(ours, Layout.CONDA, runner)
    ours_s = time.perf_counter() - start
    rows.append(Row("rpath fix", "official patchelf loop (torch/*.so*, torch/lib/*.so*)", f"{official_s:.2f} s",
                    f"{n_official} files, no verification"))
    rows.append(Row("rpath fix", "torchforge plan+apply+verify+audit", f"{ours_s:.2f} s",
                    f"{len(plan.changes)} files (also torch/bin, torch/test); {ours_s / official_s:.2f}x the loop's time"))
    start = time.perf_counter()
    second = plan_fix(ours, Layout.CONDA)
    fix_and_audit(ours, Layout.CONDA, runner)
    rows.append(Row("rpath fix", "second fix on fixed tree", f"{time.perf_counter() - start:.2f} s",
                    f"{len(second.changes)} files rewritten (target 0)"))

    with tempfile.TemporaryDirectory(prefix="bench-repack-", dir=WORK) as tmp:
        start = time.perf_counter()
        package = plan_wheels([wheel], CudaLibs.CONDA_FORGE).packages[0]
        archive, _report, _deps = build_archive(package, Path(tmp), runner, work=WORK)
        repack_s = time.perf_counter() - start
        rows.append(Row("repack", f"torch wheel -> .conda (zstd {DEFAULT_ZSTD_LEVEL}, all threads)", f"{repack_s:.1f} s",
                        f"{archive.stat().st_size / 1e6:.1f} MB (wheel {wheel.stat().st_size / 1e6:.1f} MB)"))
    # A bad option is refused before the 190 MB wheel is read (tests/test_adversarial.py checks the order).
    from torchforge.cli import main as cli_main

    refused = WORK / "refused-channel"
    refuse_s = timed(lambda: cli_main(["repack", str(wheel), "--out", str(refused), "--zstd-level", "99"]), repeat=3)
    rows.append(Row("repack", "--zstd-level 99 refused on the torch wheel", f"{refuse_s * 1000:.0f} ms",
                    f"{refuse_s / repack_s:.4f}x a full repack; nothing written: {not refused.exists()}"))
    rows.extend(_compress_subset(root / "torch" / "lib" / "libtorch_cpu.so", QUICK_SUBSET_MB if quick else SUBSET_MB))
    shutil.rmtree(official, ignore_errors=True)
    shutil.rmtree(ours, ignore_errors=True)
    return rows
