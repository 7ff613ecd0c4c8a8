"""What the wheels of a stack become: the consistency checks (one torch; the same Python, torch version and
CUDA build across torch, torchvision and torchaudio; every component pin met) and, per wheel, the conda
package: name, version, build string, build number, run requirements. Nothing here touches a file system.

Choices (docs/repack.md says them to users):
- Build strings begin with `whl_`, which no official conda build (`py3.12_cuda12.8_cudnn9.10.2_0`), no
  torchforge source build (the same shape) and no conda-forge build (`cuda128_mkl_py312_h..._200`) has; CUDA
  builds say where their CUDA libraries come from: `whl_cf_` (conda-forge packages) or `whl_nv_` (NVIDIA's
  wheels repacked), so the two kinds never share a file name.
- A CUDA build gets build number +200 over the CPU build and run-depends on `__cuda >=MAJOR`: solvers prefer
  it where a driver is present and can never choose it where none is (conda-forge's scheme,
  conda-forge-peer.md: "+200 ... wherever __cuda is present", "run: __cuda").
- torchvision and torchaudio depend on exactly the pytorch package of the same stack (version and build).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum

from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from torchforge.binaries.catalog import catalog, pypi_to_conda
from torchforge.binaries.wheels import StackWheel
from torchforge.errors import UsageError

CUDA_BUILD_OFFSET = 200
TOOLKIT = "cuda-toolkit"


class CudaLibs(str, Enum):
    CONDA_FORGE = "conda-forge"
    WHEELS = "wheels"


@dataclass(frozen=True)
class PackagePlan:
    wheel: StackWheel
    name: str
    version: str
    build: str
    build_number: int
    python: str
    depends: tuple[str, ...]
    constrains: tuple[str, ...] = ()
    keep_wheel_rpaths: bool = False  # wheels mode: RPATH entries into site-packages/nvidia/... stay
    drop: frozenset[str] = frozenset()  # wheel paths not packaged (a file another package of the stack owns)

    @property
    def filename(self) -> str:
        return f"{self.name}-{self.version}-{self.build}.conda"


@dataclass(frozen=True)
class StackPlan:
    packages: tuple[PackagePlan, ...]
    mode: CudaLibs
    cuda: str | None
    python: str
    warnings: tuple[str, ...] = ()
    ignored: tuple[StackWheel, ...] = ()  # component wheels not needed in conda-forge mode
    # conda package name → the exact spec other packages of the stack use for it (pytorch, CUDA libraries):
    # a package that links a library of one of these gets that spec as a run requirement.
    specs: dict[str, str] = field(default_factory=dict)


def marker_env(python: str) -> dict[str, str]:
    env = dict(default_environment())
    env.update(python_version=python, python_full_version=f"{python}.0", sys_platform="linux",
               platform_system="Linux", platform_machine="x86_64", os_name="posix",
               implementation_name="cpython", platform_python_implementation="CPython")
    return env


def active(requires: Iterable[str], python: str) -> list[Requirement]:
    """The requirements that apply on linux-64 with `python`, extras excluded."""
    env = marker_env(python)
    found = []
    for line in requires:
        try:
            req = Requirement(line)
        except InvalidRequirement as exc:
            raise UsageError(f"a requirement in the wheel cannot be read: {line!r} ({exc})") from exc
        if req.marker is None or req.marker.evaluate({**env, "extra": ""}):
            found.append(req)
    return found


def python_pin(python: str) -> str:
    major, minor = (int(x) for x in python.split("."))
    return f"python >={python},<{major}.{minor + 1}.0a0"


def conda_spec(spec: SpecifierSet, *, release_prefix: bool) -> str:
    """A PEP 440 specifier as a conda version spec. `==X` with `release_prefix` becomes `X.*`: conda-forge's
    NCCL and cuSPARSELt carry a fourth version part the wheels do not (nccl 2.27.5.1 for nvidia-nccl 2.27.5)."""
    parts = []
    for item in sorted(spec, key=str):
        if item.operator == "==" and release_prefix and not item.version.endswith(".*"):
            parts.append(f"{item.version}.*")
        elif item.operator == "==" and item.version.endswith(".*"):
            parts.append(item.version)
        else:
            parts.append(f"{item.operator}{item.version}")
    return ",".join(parts)


def _refuse(problems: Sequence[str], hint: str) -> None:
    if problems:
        raise UsageError("the wheels do not form one stack: " + "; ".join(problems), hint)


def _check_one_of_each(wheels: Sequence[StackWheel]) -> StackWheel:
    by_project: dict[str, list[StackWheel]] = {}
    for wheel in wheels:
        by_project.setdefault(wheel.project, []).append(wheel)
    doubled = [f"{len(ws)} wheels of {name} ({', '.join(w.path.name for w in ws)})"
               for name, ws in sorted(by_project.items()) if len(ws) > 1]
    _refuse(doubled, "pass one wheel per project; repack each stack with its own command")
    torch = by_project.get("torch")
    if not torch:
        raise UsageError("no torch wheel among the wheels", "a stack is built around one torch wheel: pass it too")
    return torch[0]


def check_consistent(torch: StackWheel, wheels: Sequence[StackWheel]) -> None:
    """Same Python, torch version and CUDA build across the stack; refused before anything is written."""
    problems = []
    for wheel in wheels:
        if wheel.python is not None and wheel.python != torch.python:
            problems.append(f"{wheel.path.name} is for Python {wheel.python}, {torch.path.name} for Python {torch.python}")
        if wheel.local is not None and wheel.local != torch.local and wheel is not torch:
            problems.append(f"{wheel.path.name} is a {wheel.local} build, {torch.path.name} a {torch.local} build")
        for req in active(wheel.requires, torch.python or "3"):
            if canonicalize_name(req.name) == "torch" and not req.specifier.contains(torch.version, prereleases=True):
                problems.append(f"{wheel.path.name} requires torch{req.specifier}, {torch.path.name} is {torch.version}")
    _refuse(problems, "download the torchvision and torchaudio released with that torch, for the same CUDA and "
                      "Python (or let repack fetch them: --pytorch X.Y.Z --cuda X.Y --py X.Y --with torchvision,torchaudio)")


@dataclass
class _Needs:
    """Components torch requires: PyPI name → specifier (from Requires-Dist or cuda-toolkit's extras)."""

    specs: dict[str, SpecifierSet] = field(default_factory=dict)
    unpinned: list[str] = field(default_factory=list)


def _component_needs(torch: StackWheel, wheels: dict[str, StackWheel]) -> tuple[_Needs, list[Requirement]]:
    needs = _Needs()
    rest = []
    py = torch.python or "3"
    for req in active(torch.requires, py):
        name = canonicalize_name(req.name)
        if name == TOOLKIT:
            _toolkit_needs(req, wheels.get(TOOLKIT), py, needs)
        elif catalog().component(name) is not None:
            needs.specs[name] = req.specifier
        else:
            rest.append(req)
    return needs, rest


def _toolkit_needs(req: Requirement, toolkit: StackWheel | None, python: str, needs: _Needs) -> None:
    """`cuda-toolkit[cublas,...]==13.0.2`: each extra's component, pinned as the cuda-toolkit wheel pins it."""
    pins: dict[str, SpecifierSet] = {}
    if toolkit is not None and req.specifier.contains(toolkit.version, prereleases=True):
        env = marker_env(python)
        for line in toolkit.requires:
            inner = Requirement(line)
            for extra in req.extras:
                if inner.marker is not None and inner.marker.evaluate({**env, "extra": extra}) \
                        and not inner.marker.evaluate({**env, "extra": ""}):
                    pins[canonicalize_name(inner.name)] = inner.specifier
    for extra in sorted(req.extras):
        component = catalog().toolkit_extras.get(extra)
        if component is None:
            raise UsageError(f"torch requires {TOOLKIT}[{extra}], which torchforge does not know",
                             "report it: torchforge/data/binaries.toml lists the extras it maps")
        if component in pins:
            needs.specs[component] = pins[component]
        else:
            needs.specs[component] = SpecifierSet()
            needs.unpinned.append(component)


def _build_number(base: int, cuda: str | None) -> int:
    return base + CUDA_BUILD_OFFSET if cuda else base


def _cudnn(torch: StackWheel, needs: _Needs) -> str:
    for name, spec in needs.specs.items():
        if name.startswith("nvidia-cudnn"):
            pinned = next((s.version for s in spec if s.operator == "=="), None)
            if pinned:
                return "_cudnn" + ".".join(pinned.rstrip(".*").split(".")[:3])
    return ""


def _flavour(mode: CudaLibs, cuda: str | None) -> str:
    if cuda is None:
        return "whl"
    return "whl_cf" if mode is CudaLibs.CONDA_FORGE else "whl_nv"


def plan(wheels: Sequence[StackWheel], mode: CudaLibs, build_number: int = 0) -> StackPlan:
    torch = _check_one_of_each(wheels)
    check_consistent(torch, wheels)
    if torch.python is None:
        raise UsageError(f"{torch.path.name} is not a CPython wheel", "repack takes cpXY wheels of torch")
    py = torch.python
    by_name = {w.project: w for w in wheels}
    needs, rest = _component_needs(torch, by_name)
    cuda = torch.cuda
    warnings = []
    if cuda is None and needs.specs:
        raise UsageError(f"{torch.path.name} is a {torch.local} build but requires NVIDIA libraries",
                         "pass an official wheel as downloaded")
    specs, component_plans = _component_specs(needs, by_name, mode, py, build_number)
    if needs.unpinned and mode is CudaLibs.CONDA_FORGE:
        warnings.append(f"no {TOOLKIT} wheel given: {', '.join(sorted(needs.unpinned))} are pinned only through "
                        f"cuda-version (pass the {TOOLKIT} wheel, or use --pytorch to fetch the stack, for exact pins)")
    flavour = _flavour(mode, cuda)
    accel = f"cuda{cuda}" if cuda else "cpu"
    torch_number = _build_number(build_number, cuda)
    torch_build = f"{flavour}_py{py}_{accel}{_cudnn(torch, needs)}_{torch_number}"
    torch_name = catalog().projects["torch"].conda
    specs[torch_name] = f"{torch_name} =={torch.version} {torch_build}"
    cuda_deps = _cuda_deps(cuda, mode)
    projects = _project_requirements(rest, by_name, mode, py, warnings)
    torch_depends = (python_pin(py), *cuda_deps, *(specs[c] for c in _conda_names(needs, mode)), *projects)
    packages = [PackagePlan(torch, torch_name, torch.version, torch_build, torch_number, py, torch_depends,
                            ("cpuonly <0",) if cuda else ("cpuonly",), keep_wheel_rpaths=mode is CudaLibs.WHEELS)]
    for wheel in wheels:
        project = catalog().project(wheel.project)
        if project is None or wheel.project == "torch":
            continue
        if not project.cuda_variant:
            packages.append(_plain_plan(wheel, py, build_number))
            continue
        number = _build_number(build_number, cuda)
        own = conda_depends([r for r in wheel.requires if canonicalize_name(Requirement(r).name) != "torch"], py)[1:]
        packages.append(PackagePlan(wheel, project.conda, wheel.version, f"{flavour}_py{py}_{accel}_{number}", number,
                                    py, (python_pin(py), specs[torch_name], *cuda_deps, *own)))
    ignored = ()
    if mode is CudaLibs.WHEELS:
        packages.extend(component_plans)
    else:
        ignored = tuple(w for w in wheels if w.is_component or w.project == TOOLKIT)
    return StackPlan(tuple(packages), mode, cuda, py, tuple(warnings), ignored, specs)


def _cuda_deps(cuda: str | None, mode: CudaLibs) -> tuple[str, ...]:
    if cuda is None:
        return ()
    major = int(cuda.split(".")[0])
    deps = [f"__cuda >={major}"]
    if mode is CudaLibs.CONDA_FORGE:
        deps.append(f"cuda-version >={cuda},<{major + 1}.0a0")
    return tuple(deps)


def _conda_names(needs: _Needs, mode: CudaLibs) -> list[str]:
    names = []
    for name in sorted(needs.specs):
        names.append(name if mode is CudaLibs.WHEELS else catalog().components[name].conda_forge)
    return list(dict.fromkeys(names))


def _component_specs(needs: _Needs, wheels: dict[str, StackWheel], mode: CudaLibs, python: str,
                     build_number: int) -> tuple[dict[str, str], list[PackagePlan]]:
    """The spec each required component gets, and (wheels mode) the package each component wheel becomes."""
    specs: dict[str, str] = {}
    plans: list[PackagePlan] = []
    problems = []
    for name, spec in sorted(needs.specs.items()):
        wheel = wheels.get(name)
        if wheel is not None and not spec.contains(wheel.version, prereleases=True):
            problems.append(f"torch requires {name}{spec}, {wheel.path.name} is {wheel.version}")
            continue
        if mode is CudaLibs.CONDA_FORGE:
            conda = catalog().components[name].conda_forge
            pinned = spec if spec or wheel is None else SpecifierSet(f"=={wheel.version}")
            specs[conda] = f"{conda} {conda_spec(pinned, release_prefix=True)}".strip()
        elif wheel is None:
            problems.append(f"--cuda-libs wheels needs the {name}{spec} wheel")
        else:
            specs[name] = f"{name} =={wheel.version}"
    _refuse(problems, "pass the component wheels torch requires (pip download torch==X.Y.Z gets them all), "
                      "or let repack fetch them with --pytorch")
    if mode is CudaLibs.WHEELS:
        for name in sorted(needs.specs):
            plans.append(component_plan(wheels[name], python, build_number))
        plans.extend(component_plan(w, python, build_number) for n, w in sorted(wheels.items())
                     if n not in needs.specs and catalog().component(n) is not None
                     and any(canonicalize_name(r.name) == n for p in plans for r in active(p.wheel.requires, python)))
    return specs, plans


def component_plan(wheel: StackWheel, python: str, build_number: int) -> PackagePlan:
    """An NVIDIA component wheel as a conda package under its PyPI name (wheels mode): site-packages/nvidia/...
    as the wheel has it, its own requirements on other components by their PyPI names."""
    depends = [python_pin(python)]
    for req in active(wheel.requires, python):
        name = canonicalize_name(req.name)
        depends.append(f"{name} {conda_spec(req.specifier, release_prefix=False)}".strip())
    return PackagePlan(wheel, wheel.project, wheel.version, f"whl_py{python}_{build_number}", build_number, python,
                       tuple(depends))


def _project_requirements(rest: list[Requirement], wheels: dict[str, StackWheel], mode: CudaLibs, python: str,
                          warnings: list[str]) -> list[str]:
    """torch's requirements on other projects of the stack (triton) and on pure-Python projects, as conda specs."""
    depends: list[str] = []
    problems = []
    for req in rest:
        name = canonicalize_name(req.name)
        project = catalog().project(name)
        if project is None:
            depends.extend(conda_depends([str(req).split(";")[0]], python)[1:])
            continue
        wheel = wheels.get(name) or wheels.get("pytorch-triton" if name == "triton" else "triton")
        if wheel is not None and not req.specifier.contains(wheel.version, prereleases=True):
            problems.append(f"torch requires {req.name}{req.specifier}, {wheel.path.name} is {wheel.version}")
        elif wheel is None and mode is CudaLibs.WHEELS:
            problems.append(f"--cuda-libs wheels needs the {req.name}{req.specifier} wheel")
        elif wheel is None:
            warnings.append(f"no {req.name} wheel given: pytorch will take {project.conda} "
                            f"{conda_spec(req.specifier, release_prefix=False)} from your channels")
        depends.append(f"{project.conda} {conda_spec(req.specifier, release_prefix=False)}".strip())
    _refuse(problems, "pass the triton wheel torch requires (pip download gets it), or let repack fetch it")
    return depends


def _plain_plan(wheel: StackWheel, python: str, build_number: int) -> PackagePlan:
    """A project without CUDA builds (triton): its own requirements, `whl_pyX.Y_N`."""
    conda = catalog().projects[wheel.project].conda
    return PackagePlan(wheel, conda, wheel.version, f"whl_py{python}_{build_number}", build_number, python,
                       conda_depends(wheel.requires, python))


def conda_depends(requires: Iterable[str], python: str) -> tuple[str, ...]:
    """conda run requirements from Requires-Dist lines, markers evaluated for linux-64 and `python`; names
    mapped by torchforge/data/pypi_to_conda.toml. The first entry is the python pin."""
    mapping = pypi_to_conda()
    depends = [python_pin(python)]
    for req in active(requires, python):
        name = canonicalize_name(req.name)
        if name in mapping.drop:
            continue
        depends.append(f"{mapping.names.get(name, name)} {conda_spec(req.specifier, release_prefix=False)}".strip())
    return tuple(depends)
