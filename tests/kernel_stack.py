"""tests/fixtures/vision_kernels (a miniature of torchvision's compiled ops; its README says what it stands in for)
built through the extension recipe against the one pytorch of a repacked channel, installed into a fresh prefix
next to that pytorch with py-rattler, run, and its CUDA library's archs checked.

Used in the suite by tests/test_extension_build.py (the torch 2.13.0 CPU wheel, a CPU build) and on the GPU machine
by tests/gpu/kernel_stack.sh (its torch 2.11.0+cu130 stack repacked, `--arch-list 9.0`, run on the GPU):

    python -m tests.kernel_stack CHANNEL WORK --site SITE_PACKAGES --torch-python PYTHON [--arch-list 9.0]

Requirements the channel's packages name but do not hold come from SITE_PACKAGES as packages with their real files
(pip, setuptools, sympy ...: what the build and `import torch` run), or else as torchforge's stand-ins (python:
this machine's interpreter in a venv-shaped package).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import tempfile
import json
import os
import subprocess
import sys
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from tests.rattler_in_child import solve_and_install
from tests.stack_env import stand_in_specs
from torchforge import archcheck
from torchforge.engines.rattler_build import RattlerBuildEngine
from torchforge.errors import AuditFailedError
from torchforge.extensions.metadata import read_metadata
from torchforge.extensions.recipe import ExtensionInputs, extension_recipe
from torchforge.havepytorch import in_channel
from torchforge.extensions.sdist import fetch, parse_spec
from torchforge.flavours.base import Plan
from torchforge.localchannel import index
from torchforge.pipeline import BuildSettings, Pipeline, StepResult, plan_steps
from torchforge.remotecache import remote_cache
from torchforge.proc import Runner
from torchforge.safeextract import extract_conda
from torchforge.standin import Stub, make_stub_channel, write_stub

FIXTURE = Path(__file__).parent / "fixtures" / "vision_kernels"
# What the build itself runs from the host prefix (pip install . under setuptools, wheel and ninja).
BUILD_TOOLS = ("pip", "setuptools", "wheel", "ninja")
CHECK = """
import sys, torch, vision_kernels as vk
boxes = torch.tensor([[0., 0., 2., 3.], [1., 1., 4., 5.], [2., 0., 3., 1.]])
want = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
assert torch.equal(vk.box_area(boxes), want), vk.box_area(boxes)
iou = vk.box_iou(boxes, boxes)
assert torch.allclose(iou.diagonal(), torch.ones(3)), iou
print("torch", torch.__version__, "from", torch.__file__)
print("vision_kernels built with torch", vk.torch_version, "cuda", vk.cuda, "kernel", vk.built_with_cuda())
print("cpu box_area ok:", vk.box_area(boxes).tolist())
if "--cuda" in sys.argv:
    big = torch.rand(1 << 20, 4) * 100
    big[:, 2:] += big[:, :2]
    gpu = vk.box_area(big.cuda())
    assert gpu.is_cuda
    err = (gpu.cpu() - vk.box_area(big)).abs().max().item()
    assert err == 0.0, err
    print("cuda box_area on", torch.cuda.get_device_name(), "sm_%d%d" % torch.cuda.get_device_capability(),
          "matches the CPU op on", big.shape[0], "boxes: max error", err)
    print("cuda box_iou ok:", torch.allclose(vk.box_iou(big[:64].cuda(), big[:64].cuda()).cpu(), vk.box_iou(big[:64], big[:64])))
"""


def _distributions(site: Path) -> dict[str, importlib.metadata.Distribution]:
    return {canonicalize_name(d.metadata["Name"]): d for d in importlib.metadata.distributions(path=[str(site)])}


def _requires(dist: importlib.metadata.Distribution, known: dict[str, importlib.metadata.Distribution]) -> tuple[str, ...]:
    """The distribution's unconditional requirements that `known` holds, by name (the carried packages' depends)."""
    names = []
    for text in dist.requires or ():
        try:
            requirement = Requirement(text)
        except InvalidRequirement:
            continue
        if requirement.marker is None and canonicalize_name(requirement.name) in known:
            names.append(canonicalize_name(requirement.name))
    return tuple(dict.fromkeys(names))


def carried_stub(name: str, site: Path, series: str) -> Stub | None:
    """The pip distribution `name` installed in `site` as a conda package of that name (`typing_extensions` as
    a requirement spells it) with its real files (its RECORD: the modules under site-packages, its commands under
    bin/), depending on what it requires from `site`; None when `site` lacks it."""
    known = _distributions(site)
    dist = known.get(canonicalize_name(name))
    if dist is None:
        return None
    root, files = site.resolve(), {}
    for entry in dist.files or ():
        path = Path(dist.locate_file(entry)).resolve()
        if "__pycache__" in path.parts or not path.is_file():
            continue
        if path.is_relative_to(root):
            files[f"lib/python{series}/site-packages/{path.relative_to(root).as_posix()}"] = path.read_bytes()
        elif path.parent.name == "bin":
            files[f"bin/{path.name}"] = path.read_bytes()
    return Stub(name, dist.version, files=files, depends=_requires(dist, known))


def carried_stubs(names: list[str], site: Path, series: str) -> dict[str, Stub]:
    """`names` that `site` holds, and what they require from it, each as a package with its real files (canonical
    name -> stub), depending on the others by the name each has here (`typing_extensions` as a spec spells it)."""
    carried: dict[str, Stub] = {}
    pending = list(names)
    while pending:
        stub = carried_stub(pending.pop(0), site, series)
        if stub is not None and canonicalize_name(stub.name) not in carried:
            carried[canonicalize_name(stub.name)] = stub
            pending += [d for d in stub.depends if d not in carried]
    return {key: dataclasses.replace(stub, depends=tuple(carried[d].name for d in stub.depends))
            for key, stub in carried.items()}


def stub_channel(torch_channel: Path, recipe_specs: list[str], site: Path, series: str, out: Path) -> list[str]:
    """Every requirement the torch channel's packages and the recipe name, beside the torch channel's own: real
    from `site` where it has them, else a stand-in. Returns the names carried with their real files."""
    data = json.loads((torch_channel / "linux-64" / "repodata.json").read_text())
    own = {r["name"] for r in (*data.get("packages", {}).values(), *data.get("packages.conda", {}).values())}
    specs = [s for s in dict.fromkeys([*stand_in_specs(torch_channel), *recipe_specs, *BUILD_TOOLS])
             if s.split()[0] not in own and s.split()[0] != "pytorch"]
    carried = carried_stubs([s.split()[0] for s in specs if s.split()[0] != "python"], site, series)
    make_stub_channel(out, [s for s in specs if canonicalize_name(s.split()[0]) not in carried])
    for stub in carried.values():
        write_stub(stub, out / "linux-64")
    index(out)
    return sorted(stub.name for stub in carried.values())


def inputs_for(torch_channel: Path, arch_list: str, torch_python: str, work: Path,
               source: str = str(FIXTURE)) -> ExtensionInputs:
    """The source (the fixture, another folder, an sdist) as an sdist, its metadata read with `torch_python`, for
    the channel's one pytorch (channels are filled in once the stand-ins exist)."""
    archive = fetch(parse_spec(source), work / "sdist", torch_python, Runner())
    return ExtensionInputs(archive, read_metadata(archive, torch_python, Runner(), work),
                           in_channel(torch_channel, "linux-64"), arch_list, ())


def build(inputs: ExtensionInputs, out: Path) -> StepResult:
    """KERNEL_STACK_CACHE_URL (tests/gpu/speed.sh): the build also uses that compile cache server; its MAX_JOBS is
    then chosen per build from memory and the package's per-job peak, as `torchforge build` chooses it."""
    engine = RattlerBuildEngine()
    url = os.environ.get("KERNEL_STACK_CACHE_URL")
    settings = BuildSettings(out=out, remote_cache=remote_cache(url), size_jobs=url is not None,
                             extra_env={"MAX_JOBS": str(os.cpu_count() or 1)} if url else {})
    recipe = extension_recipe(inputs, engine.recipe_format.value)
    (result,) = Pipeline(engine, Runner(), settings).run(plan_steps(Plan("extension", (recipe,)), settings))
    return result


def run_check(prefix: Path, cuda: bool, cwd: Path, code: str = CHECK) -> str:
    """`code` (CHECK: the fixture's) in the prefix's python, LD_LIBRARY_PATH and PYTHONPATH empty: every library
    from the prefix."""
    env = {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": "", "HOME": str(cwd)}
    done = subprocess.run([str(prefix / "bin" / "python"), "-c", code, *(["--cuda"] if cuda else [])],
                          capture_output=True, text=True, env=env, cwd=cwd)
    if done.returncode != 0:
        raise RuntimeError(f"the check failed (exit {done.returncode}):\n{done.stdout}\n{done.stderr[-4000:]}")
    return done.stdout


def arch_report(package: Path, arch_lists: list[str]) -> list[str]:
    """What the fatbin reader finds in each library of the package with device code, then one line per arch list:
    the arch check's verdict, with its message when it fails."""
    lines = []
    with tempfile.TemporaryDirectory(prefix="kernel-stack-") as scratch:
        tree = Path(scratch) / "pkg"
        extract_conda(package, tree)
        for path in sorted(p for p in tree.rglob("*.so") if archcheck.has_device_code(p)):
            sass, ptx = archcheck.device_code(path)
            lines.append(f"device code {path.relative_to(tree)}: SASS {sorted(sass)}, PTX {sorted(ptx)}")
    for arch_list in arch_lists:
        try:
            archcheck.check_package(package, arch_list)
            lines.append(f"arch check {arch_list!r}: passed")
        except AuditFailedError as exc:
            lines.append(f"arch check {arch_list!r}: failed: {exc.message}")
    return lines


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("channel", type=Path)
    parser.add_argument("work", type=Path)
    parser.add_argument("--site", type=Path, required=True, help="site-packages of the real pure-Python packages")
    parser.add_argument("--torch-python", required=True, help="a python with torch importable (the sdist's metadata)")
    parser.add_argument("--arch-list", default="")
    parser.add_argument("--also-check", action="append", default=[], help="another arch list to check the package for")
    parser.add_argument("--source", action="append", default=[],
                        help="an extension's source (sdist, folder), built in order; default: the fixture")
    parser.add_argument("--check", action="append", default=[], type=Path,
                        help="a Python file run in the prefix after the install (default: the fixture's check)")
    return parser.parse_args(argv)


def build_all(args: argparse.Namespace, work: Path) -> list[tuple[ExtensionInputs, Path]] | None:
    """Every source built, in order, for the channel's pytorch; None (and the log said) at the first failure."""
    sources = args.source or [str(FIXTURE)]
    planned = [inputs_for(args.channel, args.arch_list, args.torch_python, work / f"src{i}", source)
               for i, source in enumerate(sources)]
    pytorch = planned[0].pytorch
    print(f"pytorch in the channel: {pytorch.version} {pytorch.build} (python {pytorch.python}, cuda {pytorch.cuda})")
    specs = [s for inputs in planned for part in inputs.requirements("rattler-build").values() for s in part]
    carried = stub_channel(args.channel, [s for s in specs if not s.startswith("pytorch ")], args.site,
                           pytorch.python, work / "stubs")
    print("carried with their real files:", ", ".join(carried))
    built = []
    for inputs in planned:
        inputs = dataclasses.replace(inputs, channels=tuple(c.resolve().as_uri() for c in (args.channel, work / "stubs")))
        result = build(inputs, work / "out")
        log_tail = result.log.read_text()[-20000:] if result.log else ""
        if not result.ok:
            print(f"build of {inputs.stem} failed: {result.error}\n{log_tail[-6000:]}")
            return None
        package = work / "out" / "linux-64" / f"{inputs.stem}.conda"
        print(f"built {package.name} in {result.seconds:.0f} s (rattler-build, arch list {args.arch_list or 'none'})")
        print("\n".join(line for line in log_tail.splitlines() if "gencode" in line.lower() or "torchforge" in line)[-3000:])
        built.append((inputs, package))
    return built


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    work = args.work.resolve()
    built = build_all(args, work)
    if built is None:
        return 1
    pytorch, names = built[0][0].pytorch, [inputs.metadata.conda_name for inputs, _ in built]
    virtual = {"__glibc": "2.28", "__unix": "0", "__linux": "6.0", **({"__cuda": pytorch.cuda} if pytorch.cuda else {})}
    records = solve_and_install([work / "out", args.channel, work / "stubs"], names, work / "prefix", virtual=virtual)
    chosen = {r.name: f"{r.version} {r.build}" for r in records}
    print(f"installed {len(records)} packages: {', '.join(f'{n} {chosen[n]}' for n in names)}, pytorch {chosen['pytorch']}")
    print(json.dumps({r.name: list(r.depends) for r in records if r.name in names}))
    gpu = bool(pytorch.cuda) and bool(os.environ.get("KERNEL_STACK_GPU"))
    for code in [p.read_text() for p in args.check] or [CHECK]:
        print(run_check(work / "prefix", gpu, work, code), end="")
    if pytorch.cuda:
        for _, package in built:
            print("\n".join(arch_report(package, [args.arch_list, *args.also_check])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
