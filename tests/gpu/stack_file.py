"""The GPU run's preparation of tests/gpu/stack.toml on a machine with no network (issue 39), before
`torchforge build --stack` runs there:

    python stack_file.py prepare WORK --torch-python PY --site SITE

1. WORK/stack.toml (tests/gpu/stack.toml), WORK/sdists/ (tests/fixtures/sdists); WORK/wheels/ is rebuild_wheels.py's;
2. the repack of the stack's wheels into its output channel (what `build --stack` does first; it then finds each
   package repacked from its wheel and reuses it), so that
3. the channel the stack installs next to, WORK/standin, can be made: every requirement of the repacked packages and
   of the extensions' recipes (their sdists' metadata read with PY, where torch 2.11.0 is importable) that the
   channel does not hold, with its real files from SITE where SITE has it, else a stand-in
   (tests/kernel_stack.stub_channel: tilelang, apache-tvm-ffi, quack-kernels are stand-ins there);
4. the metadata venv `build --stack` asks for (torch of the stack's release importable), as a wrapper of PY in
   XDG_CACHE_HOME: the machine cannot pip-install torch.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from tests.kernel_stack import inputs_for, stub_channel
from torchforge.binaries.stack import repack_planned
from torchforge.extensions.plan import METADATA_TOOLS, READY, cache_root
from torchforge.proc import Runner
from torchforge.stackfile import load, requests
from torchforge.stackfile.plan import wheels_plan

HERE = Path(__file__).resolve().parent
SDISTS = HERE.parent / "fixtures" / "sdists"


def metadata_venv(version: str, torch_python: str) -> Path:
    """The venv torchforge.extensions.plan.metadata_python would make, as a wrapper of `torch_python`."""
    venv = cache_root() / f"metadata-torch-{version}"
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    wrapper = venv / "bin" / "python"
    wrapper.write_text(f'#!/bin/sh\nexec {torch_python} "$@"\n')
    wrapper.chmod(0o755)
    (venv / READY).write_text("\n".join((f"torch=={version}", *METADATA_TOOLS)))
    return venv


def prepare(work: Path, torch_python: str, site: Path) -> int:
    shutil.copyfile(HERE / "stack.toml", work / "stack.toml")
    (work / "sdists").mkdir(exist_ok=True)
    for sdist in SDISTS.glob("*.tar.gz"):
        shutil.copyfile(sdist, work / "sdists" / sdist.name)
    (work / "standin" / "noarch").mkdir(parents=True, exist_ok=True)  # a channel folder before it is filled
    stack = load.read(work / "stack.toml")
    planned = wheels_plan(stack, requests.repack_request(stack), stack.wheels)
    print(f"repack of {len(planned.packages)} wheel(s) into {stack.out} (zstd level 1: the machine's time)")
    result = repack_planned(planned, stack.out, Runner(), zstd_level=1)
    print(", ".join(sorted(p.archive.name for p in result.packages)))
    specs = []
    for number, spec in enumerate(stack.extensions):
        inputs = inputs_for(stack.out, stack.model.arch_list or "", torch_python, work / f"metadata{number}", spec)
        specs += [s for part in inputs.requirements("rattler-build").values() for s in part
                  if not s.startswith("pytorch ")]
        print(f"{inputs.metadata.name} {inputs.metadata.version}: requires {', '.join(inputs.metadata.requires)}")
    carried = stub_channel(stack.out, specs, site, stack.model.python[0], work / "standin")
    print("in the stand-in channel with their real files:", ", ".join(carried))
    print("metadata venv:", metadata_venv(stack.model.pytorch.version, torch_python))
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("step", choices=("prepare",))
    parser.add_argument("work", type=Path)
    parser.add_argument("--torch-python", required=True)
    parser.add_argument("--site", type=Path, required=True)
    args = parser.parse_args(argv)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    return prepare(args.work.resolve(), args.torch_python, args.site)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
