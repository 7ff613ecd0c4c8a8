"""One real wheel of the stack repacked at the default zstd level with 1 thread and with every core, compared with
the package `torchforge repack` put in the channel (built beside the others): the three must be byte-identical
(issue 35; torchforge/condawriter.py says why they are).

    python same_bytes.py WHEELS CHANNEL PROJECT
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import time
from pathlib import Path

from torchforge.binaries.plan import CudaLibs
from torchforge.binaries.stack import plan_digest, plan_wheels
from torchforge.proc import Runner
from torchforge.repack import build_archive


def main() -> int:
    wheels, channel, project = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    stack = plan_wheels(sorted(wheels.glob("*.whl")), CudaLibs.WHEELS)
    package = next(p for p in stack.packages if p.wheel.project == project)
    digests = {"channel": hashlib.sha256((channel / "linux-64" / package.filename).read_bytes()).hexdigest()}
    for threads in (1, os.cpu_count() or 1):
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            archive, _report, _depends = build_archive(package, Path(tmp) / "out", Runner(), specs=stack.specs,
                                                       zstd_threads=threads, work=Path(tmp),
                                                       extra={"repack_plan": plan_digest(package)})
            digests[f"{threads} thread(s), {time.perf_counter() - start:.1f} s"] = hashlib.sha256(
                archive.read_bytes()).hexdigest()
    for how, digest in digests.items():
        print(f"{package.filename} {how}: sha256 {digest}")
    same = len(set(digests.values())) == 1
    print("same bytes" if same else "DIFFERENT bytes")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
