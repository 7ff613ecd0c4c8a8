"""How often a process that used py-rattler ends in a crash (a signal) after its work was done.

`python -m bench.rattler_exits --runs 200` runs each in-process py-rattler use (solve, install, index, the
upload check) in `--runs` fresh processes and counts the runs that exited on a signal or non-zero:

  --mode inprocess   the use's own function in a process that exits normally (interpreter teardown): what
                     every torchforge process did before py-rattler work moved into `torchforge.rattlerchild`;
  --mode product     the public function torchforge calls, which runs the work in a child that ends with
                     os._exit once its result is written.

Not part of `make bench` (it takes minutes): run it with `nice` on a shared machine.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_SETUP = """
import sys
from pathlib import Path
channel = Path(sys.argv[1]); scratch = Path(sys.argv[2])
"""

# The test package has no site-packages, which install_from_channel reports once the install is done.
_INSTALL = """
from torchforge.errors import UsageError
try:
    install(channel, scratch / 'prefix', 'hello')
except UsageError as exc:
    assert 'installed no site-packages' in str(exc), exc
assert (scratch / 'prefix' / 'share' / 'hello' / 'hello.txt').is_file()
"""

# What each use runs: (in-process body, product body). The in-process bodies call the py-rattler functions
# directly; the product bodies call what torchforge's commands call.
USES: dict[str, tuple[str, str]] = {
    "solve": (
        "from bench.rattler_exits import solve_once\n"
        "solve_once(channel.as_uri(), scratch)\n",
        "from torchforge.rattlerchild import call\n"
        "call('bench.rattler_exits:solve_once', channel.as_uri(), scratch)\n",
    ),
    "install": (
        "from torchforge.repack import _install_here as install\n" + _INSTALL,
        "from torchforge.repack import install_from_channel as install\n" + _INSTALL,
    ),
    "index": (
        "from torchforge.localchannel import _index_here\n"
        "_index_here(channel)\n",
        "from torchforge.localchannel import index\n"
        "index(channel)\n",
    ),
    "upload-check": (
        "from torchforge.archives import inspect_archive\n"
        "from torchforge.uploaders.rattler_check import _check_here\n"
        "archives = [inspect_archive(p) for p in sorted(channel.glob('*/*.conda'))]\n"
        "print(_check_here(channel.as_uri(), archives, work=scratch))\n",
        "from torchforge.archives import inspect_archive\n"
        "from torchforge.uploaders.rattler_check import check_channel\n"
        "archives = [inspect_archive(p) for p in sorted(channel.glob('*/*.conda'))]\n"
        "print(check_channel(channel.as_uri(), archives, work=scratch))\n",
    ),
}


def solve_once(channel_url: str, scratch: Path) -> None:
    """The solve of doctor's and build's channel check (torchforge.channelcheck), once."""
    from rattler import Gateway

    from torchforge.channelcheck import _solve

    failure = _solve(["hello"], [channel_url], "linux-64", Gateway(cache_dir=scratch / "gw"))
    assert failure is None, failure


def _channel(where: Path) -> Path:
    sys.path.insert(0, str(ROOT))
    from tests.pkgfactory import make_package

    channel = where / "channel"
    make_package(channel / "linux-64", name="hello", depends=["world"])
    make_package(channel / "noarch", name="world", subdir="noarch")
    subprocess.run([sys.executable, "-c", _SETUP + USES["index"][1], str(channel), str(where)], check=True, cwd=ROOT)
    return channel


def _one(use: str, mode: str, channel: Path, n: int, where: Path) -> int:
    body = USES[use][0 if mode == "inprocess" else 1]
    with tempfile.TemporaryDirectory(prefix=f"run-{use}-{n}-", dir=where) as scratch:
        if use == "index":  # each run indexes its own copy, so parallel runs do not share a lock
            import shutil

            own = Path(scratch) / "channel"
            shutil.copytree(channel, own)
            target = own
        else:
            target = channel
        done = subprocess.run([sys.executable, "-c", _SETUP + body, str(target), scratch], cwd=ROOT,
                              capture_output=True, text=True)
    if done.returncode != 0 and done.returncode > 0:
        print(f"  {use} run {n}: exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
    return done.returncode


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.rattler_exits")
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--mode", choices=("inprocess", "product"), default="product")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("uses", nargs="*", default=list(USES))
    args = parser.parse_args()
    failed = False
    with tempfile.TemporaryDirectory(prefix="rattler-exits-") as tmp:
        where = Path(tmp)
        channel = _channel(where)
        for use in args.uses:
            with ThreadPoolExecutor(args.jobs) as pool:
                codes = list(pool.map(lambda n: _one(use, args.mode, channel, n, where), range(args.runs)))
            tally = Counter(codes)
            crashes = sum(c for code, c in tally.items() if code != 0)
            failed |= crashes > 0
            print(f"{use:13} {args.mode:9} runs {args.runs:4}  not clean {crashes:3}  exit codes {dict(sorted(tally.items()))}",
                  flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
