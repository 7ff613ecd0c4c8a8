"""Where one package's build time goes, each part alone with every core (issue 35): the wheel's unpack, the
RPATH step, the zstd stream of its files with nothing else, the tar + zip writer around that stream, the files'
sha256 and the archive's digests. Wall and CPU seconds (all threads, and child processes) for each part; a
part whose CPU is far below cores x wall is bound by one thread.

    python compress_probe.py WHEELS PROJECT
"""

from __future__ import annotations

import json
import os
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from torchforge.binaries.plan import CudaLibs
from torchforge.binaries.stack import plan_wheels
from torchforge.condawriter import CHUNK, Options, write_conda, zstd
from torchforge.proc import Runner
from torchforge.repack import DEFAULT_ZSTD_LEVEL, _stage, hash_files, payload_of, zstd_workers
from torchforge.repodata import archive_digests
from torchforge.rpath import Layout
from torchforge.rpath.fix import fix_and_audit


def _cpu() -> float:
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def timed(name: str, work: Callable[[], object]) -> object:
    wall, cpu = time.perf_counter(), _cpu()
    result = work()
    wall, cpu = time.perf_counter() - wall, _cpu() - cpu
    print(f"{name:44s} {wall:6.1f} s wall  {cpu:7.1f} s CPU  {cpu / max(wall, 1e-6):5.1f} cores", flush=True)
    return result


def zstd_only(stage: Path, files: list[str], chunk: int) -> None:
    options = {zstd.CompressionParameter.compression_level: DEFAULT_ZSTD_LEVEL,
               zstd.CompressionParameter.nb_workers: zstd_workers(-1)}
    compressor = zstd.ZstdCompressor(options=options)
    for rel in files:
        with open(stage / rel, "rb") as fh:
            while data := fh.read(chunk):
                compressor.compress(data)
    compressor.flush()


def main() -> int:
    wheels, project = Path(sys.argv[1]), sys.argv[2]
    stack = plan_wheels(sorted(wheels.glob("*.whl")), CudaLibs.WHEELS)
    package = next(p for p in stack.packages if p.wheel.project == project)
    print(f"{package.filename}: wheel {package.wheel.path.stat().st_size / 1e9:.2f} GB; {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory() as tmp:
        stage = Path(tmp) / "pkg"
        staged = timed("unpack (+ linked depends)", lambda: _stage(package, stage, stack.specs, lambda _s: None))
        (stage / "info").mkdir()
        (stage / "info" / "index.json").write_text(json.dumps({"depends": list(staged.plan.depends)}))  # type: ignore[attr-defined]
        timed("RPATH fix + audit", lambda: fix_and_audit(stage, Layout.CONDA, Runner(),
                                                          keep_provided=staged.plan.keep_wheel_rpaths))  # type: ignore[attr-defined]
        payload, links = payload_of(stage)
        total = sum((stage / r).stat().st_size for r in payload)
        print(f"{len(payload)} files, {total / 1e9:.2f} GB")
        timed("zstd stream only, 1 MiB reads", lambda: zstd_only(stage, payload, CHUNK))
        timed("zstd stream only, 8 MiB reads", lambda: zstd_only(stage, payload, 8 << 20))
        dest = Path(tmp) / "probe.conda"
        options = Options(DEFAULT_ZSTD_LEVEL, zstd_workers(-1), 0)
        timed("tar + zstd + zip writer (no hashing)",
              lambda: write_conda(stage, dest, sorted(payload + links), lambda: ["info/index.json"], options))
        timed("sha256 of every file, every core", lambda: hash_files(stage, payload))
        timed("archive sha256 + md5", lambda: archive_digests(dest))
    return 0


if __name__ == "__main__":
    sys.exit(main())
