"""Solve a repacked stack from its channel with py-rattler, install it into a fresh prefix, and check that every
DT_NEEDED of every ELF file in the prefix resolves inside it (`make repack-cuda-stack`, the GPU run).

What the channel does not carry (python, torch's pure-Python requirements) comes from a channel of metadata-only
stand-ins made here (tests/stubchannel.py): the check is about the binaries, which all come from the channel.

    python -m tests.stack_env CHANNEL PREFIX [--cuda 12.8] [--glibc 2.28] [--specs pytorch,torchvision,torchaudio]

Prints the solved packages, the same solve without __cuda (no CUDA package may be chosen), and the prefix audit;
exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from tests.stubchannel import Stub, make_stub_channel, stub_version, write_stub
from torchforge.localchannel import index
from torchforge.rpath import audit

# cuDNN links libz.so.1, which conda-forge's libzlib holds (lib/libz.so.1). Its stand-in carries the host's copy,
# and only it: a package that links libz must declare libzlib (the prefix audit checks who provides what), not
# rely on python bringing it.
ZLIB = next((p for p in (Path("/lib/x86_64-linux-gnu/libz.so.1"), Path("/usr/lib/x86_64-linux-gnu/libz.so.1"),
                         Path("/usr/lib64/libz.so.1")) if p.exists()), None)
LIBRARY_STAND_INS = {"libzlib": "lib/libz.so.1"}


def make_stand_ins(channel: Path, out: Path) -> None:
    specs = stand_in_specs(channel)
    make_stub_channel(out, [s for s in specs if s.split()[0] not in LIBRARY_STAND_INS], runnable=False)
    for spec in specs:
        if spec.split()[0] in LIBRARY_STAND_INS:
            write_stub(zlib_stand_in(spec), out / "linux-64")
    index(out)


def zlib_stand_in(spec: str = "libzlib") -> Stub:
    """libzlib with the host's libz.so.1 at its conda-forge path."""
    assert ZLIB is not None, "no libz.so.1 on this machine"
    name, version, _ = stub_version(spec)
    return Stub(name, version, files={LIBRARY_STAND_INS[name]: ZLIB.read_bytes()})


def stand_in_specs(channel: Path) -> list[str]:
    """The run requirements of the channel's packages that no package of the channel satisfies by name."""
    data = json.loads((channel / "linux-64" / "repodata.json").read_text())
    records = [*data.get("packages", {}).values(), *data.get("packages.conda", {}).values()]
    names = {r["name"] for r in records}
    wanted = {}
    for record in records:
        for spec in record.get("depends", []):
            name = spec.split()[0]
            if name not in names and not name.startswith("__"):
                wanted.setdefault(name, spec.replace("~=", ">="))
    return sorted(wanted.values())


def solve(channels: list[Path], specs: list[str], virtual: dict[str, str]) -> list[object]:
    import rattler

    return asyncio.run(rattler.solve(
        sources=[rattler.Channel(str(c.resolve())) for c in channels], specs=specs, platforms=["linux-64", "noarch"],
        virtual_packages=[rattler.GenericVirtualPackage(rattler.PackageName(n), rattler.Version(v),
                                                        rattler.BuildString("0")) for n, v in virtual.items()]))


def install(records: list[object], prefix: Path, cache: Path) -> None:
    import rattler

    asyncio.run(rattler.install(records, target_prefix=prefix.resolve(), cache_dir=cache.resolve(), show_progress=False))


def solve_and_install(channels: list[Path], specs: list[str], virtual: dict[str, str], prefix: Path) -> list[str]:
    """Solve and install in one call, for tests that run it in py-rattler's child (torchforge.rattlerchild):
    the names installed."""
    records = solve(channels, specs, virtual)
    install(records, prefix, prefix.parent / f"{prefix.name}-pkgs")
    return sorted(str(r.name.normalized) for r in records)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("channel", type=Path)
    parser.add_argument("prefix", type=Path)
    parser.add_argument("--cuda", default="12.8")
    parser.add_argument("--glibc", default="2.28")
    parser.add_argument("--specs", default="pytorch,torchvision,torchaudio")
    args = parser.parse_args(argv)
    specs = args.specs.split(",")
    stubs = args.prefix.parent / f"{args.prefix.name}-stand-ins"
    make_stand_ins(args.channel, stubs)
    channels = [args.channel, stubs]
    ok = True
    virtual = {"__glibc": args.glibc, "__unix": "0", "__linux": "6.0"}
    try:
        without = solve(channels, specs, virtual)
    except Exception as exc:  # rattler's SolverError: nothing installable without a driver is also right
        print(f"solve without __cuda: no solution ({str(exc).splitlines()[-1].strip()})")
        without = []
    chosen = {r.name.normalized: str(r.build) for r in without}
    cuda_picked = sorted(n for n, b in chosen.items() if "cuda" in b or n.startswith("nvidia-"))
    if without:
        print(f"solve without __cuda: {len(without)} packages; CUDA packages chosen: {cuda_picked or 'none'}")
        print("  " + ", ".join(f"{n}={b}" for n, b in sorted(chosen.items()) if n in specs))
    ok &= not cuda_picked
    records = solve(channels, specs, {**virtual, "__cuda": args.cuda})
    print(f"solve with __cuda={args.cuda}, __glibc={args.glibc}: {len(records)} packages")
    for record in sorted(records, key=lambda r: r.name.normalized):
        print(f"  {record.name.normalized} {record.version} {record.build}")
    install(records, args.prefix, args.prefix.parent / f"{args.prefix.name}-pkgs")
    report = audit(args.prefix)
    print(f"prefix audit: {len(report.files)} ELF files, {len(report.findings)} problem(s)")
    for finding in report.findings[:20]:
        print(f"  {finding.file}: {finding.kind.value} {finding.detail}")
    for where, what in (("system", "glibc, the GCC runtime, the driver"),
                        ("host", "host libraries of NVIDIA's optional RDMA/MPI/UCX plugins, not loaded by torch")):
        names = sorted({r.needed for f in report.files for r in f.resolutions if r.where == where})
        users = sorted({f.file.rsplit("/", 1)[-1] for f in report.files for r in f.resolutions if r.where == where})
        print(f"taken from the {where} ({what}): {' '.join(names) or 'none'}"
              + (f"\n  by {', '.join(users)}" if where == "host" and users else ""))
    return 0 if ok and report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
