"""Maintainer tool: the wheel columns of torchforge/data/official_stack.toml's [[release]] rows.

    python scripts/official_stack_wheels.py            # exit 1 and say so if a row is stale
    python scripts/official_stack_wheels.py --write    # rewrite the rows

Each row's pairing (pytorch, torchvision, torchaudio) is the table's own (pytorch/test-infra's RELEASE_DICT,
cited in [sources]). For each companion release pip downloads one macOS arm64 wheel (the smallest, no CUDA) and
its .dist-info/METADATA is read: the torch requirement must pin the row's pytorch exactly (else the script stops),
and the other Requires-Dist lines without an extra are the package's run requirements (their conda names are
the PyPI ones: numpy, pillow, requests). The file name and sha256 are written with them.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from pathlib import Path

from packaging.requirements import Requirement

TABLE = Path(__file__).resolve().parent.parent / "torchforge" / "data" / "official_stack.toml"
MARKER = "# ---- [[release]] rows: scripts/official_stack_wheels.py --write ----\n"
PYTHON = {"2.1": "3.11", "2.2": "3.11", "2.3": "3.11"}  # the newest Python with a wheel of every release


def download(spec: str, python: str, folder: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "download", spec, "--no-deps", "--only-binary=:all:",
                    "--platform", "macosx_11_0_arm64", "--python-version", python, "-d", str(folder), "-q"],
                   check=True)
    name, version = spec.split("==")
    (wheel,) = folder.glob(f"{name}-{version}-*.whl")
    return wheel


def read_wheel(wheel: Path, pytorch: str) -> tuple[list[str], str]:
    """(run requirements besides torch, the row's citation) of one wheel."""
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        lines = archive.read(metadata).decode().splitlines()
    requires = [Requirement(line.split(":", 1)[1].strip()) for line in lines if line.startswith("Requires-Dist:")]
    plain = [r for r in requires if r.marker is None]
    (torch,) = [r for r in plain if r.name == "torch"]
    if str(torch.specifier) != f"=={pytorch}":
        raise SystemExit(f"{wheel.name} requires {torch}, not torch=={pytorch}: the pairing is wrong")
    others = [f"{r.name} {r.specifier}".strip() for r in plain if r.name != "torch"]
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    return others, f"{wheel.name} sha256 {digest}: Requires-Dist " + "; ".join(map(str, plain))


def rows(table: dict[str, object], folder: Path) -> str:
    text = ""
    for release in table["release"]:  # type: ignore[union-attr]
        pytorch = release["pytorch"]
        python = PYTHON.get(pytorch.rsplit(".", 1)[0], "3.12")
        text += f'\n[[release]]\npytorch = "{pytorch}"\n'
        text += f'torchvision = "{release["torchvision"]}"\ntorchaudio = "{release["torchaudio"]}"\n'
        cited = {}
        for package in ("torchvision", "torchaudio"):
            others, cited[package] = read_wheel(download(f"{package}=={release[package]}", python, folder), pytorch)
            text += f"{package}_requires = [{', '.join(f'{o!r}'.replace(chr(39), chr(34)) for o in others)}]\n"
        text += "".join(f'{package}_wheel = "{line}"\n' for package, line in cited.items())
    return text


def main(argv: list[str]) -> int:
    current = TABLE.read_text(encoding="utf-8")
    head = current.split(MARKER)[0]
    with tempfile.TemporaryDirectory() as scratch:
        new = head + MARKER + rows(tomllib.loads(current), Path(scratch))
    if "--write" in argv:
        TABLE.write_text(new, encoding="utf-8")
        return 0
    if new != current:
        print(f"{TABLE} is stale: rerun with --write", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
