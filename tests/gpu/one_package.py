"""One package of the stack built alone, every core for it, with the wall and CPU time of each step (issue 35):
where a package's time goes when nothing else runs beside it.

    python one_package.py WHEELS PROJECT
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from bench.bench_repack import Timeline
from torchforge.binaries.plan import CudaLibs
from torchforge.binaries.stack import plan_digest, plan_wheels
from torchforge.proc import Runner
from torchforge.repack import build_archive


def main() -> int:
    wheels, project = Path(sys.argv[1]), sys.argv[2]
    stack = plan_wheels(sorted(wheels.glob("*.whl")), CudaLibs.WHEELS)
    package = next(p for p in stack.packages if p.wheel.project == project)
    timeline = Timeline()
    with tempfile.TemporaryDirectory() as tmp:
        build_archive(package, Path(tmp) / "out", Runner(), specs=stack.specs, work=Path(tmp),
                      extra={"repack_plan": plan_digest(package)},
                      on_step=lambda what: timeline.step(package.filename, what))
        timeline.write(Path(tmp) / "timeline.txt")
        print((Path(tmp) / "timeline.txt").read_text(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
