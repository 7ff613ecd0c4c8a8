"""Rebuild wheels from an installed environment: each distribution's files (its RECORD) zipped back into a
wheel under the name its WHEEL file gives. On the lent GPU machine the torch stack is pip-installed but its
wheel files are not there (and 64 MiB travel per call): this gives `torchforge repack` real wheels of the
installed torch 2.11.0+cu130, torchvision, torchaudio, triton and the CUDA 13 component wheels.

    python rebuild_wheels.py OUT [torch torchvision torchaudio]

Follows the requirements of the named distributions (with cuda-toolkit's extras) to the wheels a stack needs:
triton, cuda-toolkit, cuda-bindings and nvidia-*. Members are stored, not compressed (repack unpacks them at
once; compressing 4 GB would cost minutes of the device's time). Prints one line per wheel.
"""

from __future__ import annotations

import csv
import sys
import zipfile
from concurrent.futures import ProcessPoolExecutor
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

STACK_PREFIXES = ("nvidia-", "triton", "cuda-toolkit", "cuda-bindings", "torchvision", "torchaudio", "torch")


def closure(roots: list[str]) -> dict[str, metadata.Distribution]:
    env = dict(default_environment())
    found: dict[str, metadata.Distribution] = {}
    seen: set[tuple[str, frozenset[str]]] = set()
    todo: list[tuple[str, frozenset[str]]] = [(canonicalize_name(r), frozenset()) for r in roots]
    while todo:
        key, extras = todo.pop()
        if (key, extras) in seen:
            continue
        seen.add((key, extras))
        try:
            dist = metadata.distribution(key)
        except metadata.PackageNotFoundError:
            continue
        found[key] = dist
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is not None and not any(req.marker.evaluate({**env, "extra": e}) for e in ("", *extras)):
                continue
            target = canonicalize_name(req.name)
            if target.startswith(STACK_PREFIXES):
                todo.append((target, frozenset(req.extras)))
    return found


def rebuild(dist_path: str, out: str) -> str:
    dist = metadata.PathDistribution(Path(dist_path))
    site = Path(dist_path).parent
    wheel_text = (Path(dist_path) / "WHEEL").read_text()
    tag = next(line.split(":", 1)[1].strip() for line in wheel_text.splitlines() if line.startswith("Tag:"))
    name = canonicalize_name(dist.metadata["Name"]).replace("-", "_")
    target = Path(out) / f"{name}-{dist.version}-{tag}.whl"
    skip = {"INSTALLER", "REQUESTED", "direct_url.json"}
    with open(Path(dist_path) / "RECORD", newline="") as fh:
        rows = [row[0] for row in csv.reader(fh) if row]
    with zipfile.ZipFile(target, "w", zipfile.ZIP_STORED) as zf:
        for rel in rows:
            path = (site / rel).resolve()
            if rel.startswith("..") or "__pycache__" in rel or Path(rel).name in skip or not path.is_file():
                continue
            zf.write(path, rel)
    return f"{target.name} {target.stat().st_size / 1e6:.1f} MB"


def main() -> int:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    dists = closure(sys.argv[2:] or ["torch", "torchvision", "torchaudio"])
    paths = [str(d._path) for d in dists.values()]  # type: ignore[attr-defined]
    with ProcessPoolExecutor() as pool:
        for line in pool.map(rebuild, paths, [str(out)] * len(paths)):
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
