"""Write the `torchforge ci` golden files into tests/golden/ci/ (`python -m tests.golden.ci_regenerate`).

Each case runs the real command line, so the goldens hold exactly what a user gets, header included.
Review the diff before committing.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from functools import cache
from pathlib import Path

from torchforge import selfwheel
from torchforge.ci import Provider
from torchforge.cli import main as cli_main
from torchforge.proc import Command, Runner

HERE = Path(__file__).parent
GOLDEN = HERE / "ci"

# Two CUDA versions x two Pythons: two magma jobs, four pytorch jobs, the cache warm-up chain and an upload.
SELECTION: tuple[str, ...] = ("--pytorch", "2.5.1", "--cuda", "11.8,12.4", "--py", "3.10,3.12",
                              "--upload-to", "anaconda://my-org")


_WHEELS = tempfile.TemporaryDirectory(prefix="torchforge-ci-wheel-")  # removed when the process ends


@cache
def self_wheel() -> Path:
    """This checkout's wheel, built once per process: `ci` commits it beside the file (ci.toml
    torchforge_wheel_dir), and building it for every emitted file would take seconds each. Built offline: the
    build backend (hatchling) is in the test extra, so pip asks no index for it (`ci` without --wheel would)."""
    root = selfwheel.source_tree()
    assert root is not None, "the suite runs from a checkout"
    Runner().run(Command((sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                          "--quiet", "--wheel-dir", _WHEELS.name, str(root))))
    return selfwheel.check(Path(_WHEELS.name) / selfwheel.wheel_name())


def golden_path(provider: Provider) -> Path:
    return GOLDEN / f"{provider.value}.yml"


def emit(provider: Provider, out: Path, extra: tuple[str, ...] = ()) -> Path:
    """Run `torchforge ci PROVIDER ...SELECTION --out OUT` and return the written file."""
    code = cli_main(["ci", provider.value, *SELECTION, *extra, "--wheel", str(self_wheel()), "--out", str(out)])
    if code != 0:
        raise SystemExit(f"torchforge ci {provider.value} exited with {code}")
    return out / provider.path


def main() -> int:
    shutil.rmtree(GOLDEN, ignore_errors=True)
    for provider in Provider:
        with tempfile.TemporaryDirectory() as tmp:
            written = emit(provider, Path(tmp))
            target = golden_path(provider)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(written, target)
            print(target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
