"""`torchforge explain` on a PyTorch-CUDA-sized log (200,000 long ninja lines, ~70 MB): throughput, and its
ratio to reading the same file line by line (the floor any scanner has to pay)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from bench import Row, timed
from torchforge.diagnose import explain_log

LINES = 200_000
QUICK_LINES = 2_000


def run(quick: bool = False) -> list[Row]:
    lines = QUICK_LINES if quick else LINES
    line = "[1208/6244] Building CXX object caffe2/CMakeFiles/torch_cuda.dir/x.cu.o " + "-DFLAG " * 40 + "\n"
    with tempfile.TemporaryDirectory(prefix="bench-explain-") as tmp:
        log = Path(tmp) / "big.log"
        log.write_text(line * lines + "g++: fatal error: Killed signal terminated program cc1plus\n", encoding="utf-8")
        size_mb = log.stat().st_size / 1e6

        def read_lines() -> None:
            with log.open(encoding="utf-8", errors="replace") as fh:
                for _ in fh:
                    pass

        floor = timed(read_lines, repeat=3)
        scan = timed(lambda: explain_log(log), repeat=3)
    return [
        Row("explain", f"scan {lines:,} lines ({size_mb:.0f} MB)", f"{scan:.2f} s", f"{size_mb / scan:.0f} MB/s"),
        Row("explain", "scan / plain line read", f"{scan / floor:.1f}x", "cost of the signatures over reading"),
    ]
