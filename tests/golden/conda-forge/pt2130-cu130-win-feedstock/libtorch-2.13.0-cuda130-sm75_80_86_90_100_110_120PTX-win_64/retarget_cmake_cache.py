# Rendered by torchforge 0.1.0 for libtorch-2.13.0-cuda130-sm75_80_86_90_100_110_120PTX-win_64 (flavour conda-forge, feedstock 74dd3d46ff0c). Re-render instead of editing.
"""retarget_cmake_cache.py OLD NEW: libtorch's CMake cache (built with Python 3.12) pointed at the Python
running this, so each pytorch output compiles only the bindings again. Only lines that name Python change: a CUDA
or library version with the same digits stays."""

import re
import sys

BUILT = "3.12"
major, minor = BUILT.split(".")
now = sys.version_info
rules = [
    (rf"(?<![\d.]){major}\.{minor}\.\d+", f"{now[0]}.{now[1]}.{now[2]}"),  # full versions: v3.12.8
    (rf"(?<![\d.]){major}\.{minor}(?![\d.])", f"{now[0]}.{now[1]}"),
    (rf"(?<!\d){major};{minor};\d+", f"{now[0]};{now[1]};{now[2]}"),  # CMake lists: Python;3;12;8;64
    (rf"(?<!\d){major};{minor}(?!\d)", f"{now[0]};{now[1]}"),
    (rf"(?i)(python|cp|cpython-){major}{minor}(?!\d)", rf"\g<1>{now[0]}{now[1]}"),  # python312.lib, cp312
]
source, target = sys.argv[1:3]
lines = []
with open(source, encoding="utf-8") as cache:
    for line in cache:
        if "python" in line.lower():
            for pattern, replacement in rules:
                line = re.sub(pattern, replacement, line)
        lines.append(line)
with open(target, "w", encoding="utf-8") as cache:
    cache.writelines(lines)
