"""The conda-forge flavour built for real: libtorch's Python when --py leaves the feedstock's out, the
rattler-build recipe (libtorch once in a staging output, pytorch per Python, the metapackage), and the
PyTorch-layout fixture tests/fixtures/torch_split built through it, installed with a real solver next to
stand-ins of conda-forge's cuDNN/NCCL/MAGMA, imported, audited and consumed from CMake.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from tests.rattler_in_child import Record, solve, solve_and_install
from torchforge.cli import main
from torchforge.compilecache import BUILD_VARIABLES
from torchforge.flavours import conda_forge
from torchforge.sourcestate import Source
from torchforge.templates import RecipeFormat

SOURCE = Source("git", "https://github.com/pytorch/pytorch", "v0")


def host_python(recipe: conda_forge.CondaForgeRecipe) -> list[str]:
    return [s for s in recipe.output("libtorch").requirements["host"] if s.split()[0] == "python"]


# ---- step 1: the Python libtorch is built with --------------------------------------------------------------


def test_libtorch_keeps_the_feedstocks_python_where_the_chosen_pythons_include_it() -> None:
    recipe = conda_forge.plan("2.13.0", "linux-64", "cpu", pythons=("3.11", "3.12"))
    assert host_python(recipe) == ["python 3.12"]
    assert recipe.libtorch_python == "3.12"
    assert json.loads(recipe.settings)["libtorch_python"] == "3.12"
    assert not [w for w in recipe.warnings if "Python" in w]


def test_libtorch_builds_with_the_first_chosen_python_when_the_feedstocks_is_left_out(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    recipe = conda_forge.plan("2.13.0", "linux-64", "13.0", pythons=("3.11", "3.13"))
    assert host_python(recipe) == ["python 3.11"]
    assert recipe.libtorch_python == "3.11"
    assert json.loads(recipe.settings)["libtorch_python"] == "3.11"
    # where the feedstock's pin was, and nothing else moved
    feedstock = conda_forge.plan("2.13.0", "linux-64", "13.0")
    assert [s for s in feedstock.output("libtorch").requirements["host"]] == [
        "python 3.12" if s == "python 3.11" else s for s in recipe.output("libtorch").requirements["host"]]
    warning = next(w for w in recipe.warnings if "Python 3.12" in w)
    assert "recipe/meta.yaml:" in warning and "--py 3.11,3.13" in warning and "Python 3.11" in warning
    # its run requirements name no Python: neither the host's python nor what python and numpy export (python_abi
    # 3.11.* *_cp311, numpy's own) reaches them, as the feedstock says (74dd3d46:recipe/meta.yaml:103-106)
    assert "python *" in recipe.output("libtorch").requirements["ignore_run_exports"]
    assert recipe.output("libtorch").requirements["ignore_run_exports_from"] == ("python *", "numpy *")
    assert not [s for s in recipe.output("libtorch").requirements["run"] if s.split()[0] == "python"]

    assert main(["render", "--flavour", "conda-forge", "--pytorch", "2.13.0", "--cuda", "cpu", "--py", "3.11",
                 "--out", str(tmp_path)]) == 0
    assert "libtorch builds with Python 3.11" in capsys.readouterr().err.replace("\n", " ")
    (folder,) = tmp_path.iterdir()
    meta = (folder / "meta.yaml").read_text()
    assert "    - python 3.11\n" in meta and "    - python 3.12\n" not in meta
    assert '\\"libtorch_python\\": \\"3.11\\"' in meta


# ---- step 2: the rattler-build recipe -------------------------------------------------------------------------


def built_string_pattern(recipe: conda_forge.CondaForgeRecipe, name: str, python: str | None) -> str:
    """The build string an engine must give output `name` for Python X.Y: exactly the planned one."""
    return re.escape(recipe.build_string(name, python if recipe.output(name).per_python else None))


def rattler_files(recipe: conda_forge.CondaForgeRecipe, source: Source = SOURCE) -> dict[str, str]:
    return conda_forge.recipe_files(recipe, source, recipe_format=RecipeFormat.RATTLER_BUILD)


def rattler_render(files: dict[str, str], folder: Path) -> list:
    """The real rattler-build's render of the recipe folder (py-rattler-build, with its variants.yaml)."""
    from rattler_build import Stage0Recipe, VariantConfig

    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return Stage0Recipe.from_file(folder / "recipe.yaml").render(VariantConfig.from_file(folder / "variants.yaml"))


def rendered_spec(spec: object) -> str:
    """A rendered requirement back in the data's notation (`pin_subpackage libtorch exact`)."""
    if isinstance(spec, dict):
        ((function, args),) = spec.items()
        return f"{function} {args['name']}" + (" exact" if args.get("exact") else "")
    return str(spec)


def planned_spec(spec: str) -> str:
    """A planned requirement as rattler-build renders it: conda-build's implicit `X.Y` -> `X.Y.*` made explicit,
    pins without their bound (rendered lazily)."""
    parts = spec.split()
    if parts[0] in ("pin_subpackage", "pin_compatible"):
        return " ".join(parts[:2] + (["exact"] if parts[2:] == ["exact"] else []))
    return conda_forge._explicit_version(spec)


CASES = [("2.6.0", "12.6", None, ("3.12",)), ("2.13.0", "13.0", None, ("3.11", "3.12")),
         ("2.13.0", "cpu", None, ("3.11",)), ("2.9.1", "12.4", "7.0;8.6", ("3.11",))]


def python_variants(version: str, cuda: str | None) -> dict[str, str]:
    """{X.Y: the feedstock job's python variant value} of the job a linux-64 recipe follows."""
    jobs = conda_forge.platform_jobs(conda_forge.load(), version, "linux-64")
    python = jobs.ci_support[conda_forge.reference_cuda(jobs, cuda) or "cpu"].python
    return dict(zip(python.value, python.variant))


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-{c[2] or 'feedstock'}")
def test_rattler_build_renders_the_planned_outputs_with_the_planned_build_strings_and_requirements(
        case, tmp_path: Path) -> None:
    version, accel, arch, pythons = case
    recipe = conda_forge.plan(version, "linux-64", accel, arch, pythons)
    variants = rattler_render(rattler_files(recipe), tmp_path)
    rendered: dict[tuple[str, str | None], object] = {}
    for variant in variants:
        python = variant.variant.get("python")
        if python is not None:  # the job's variant value, whole (3.12.* *_cpython): its X.Y names the package
            assert python == python_variants(version, recipe.cuda)[python.split(".*")[0]]
            python = python.split(".*")[0]
        rendered[(variant.recipe.package.name, python if variant.recipe.package.name == "pytorch" else None)] = variant
    expected = {(o.name, p if o.name == "pytorch" else None) for o in recipe.outputs for p in pythons}
    assert set(rendered) == expected
    for (name, python), variant in rendered.items():
        output = recipe.output(name)
        assert re.fullmatch(built_string_pattern(recipe, name, python), variant.recipe.build.string)
        assert variant.recipe.build.number == recipe.build_number
        requirements = variant.recipe.to_dict()["requirements"]
        if name == "libtorch":  # its build and host are the staging output's, built once
            (staging,) = variant.recipe.staging_caches
            assert staging.name == "libtorch-build"
            requirements = {**requirements, **staging.requirements.to_dict()}
        for key, rattler_key in (("build", "build"), ("host", "host"), ("run", "run"),
                                 ("run_constrained", "run_constraints")):
            got = [rendered_spec(s) for s in requirements.get(rattler_key, [])]
            # compilers and the sysroot come out resolved from the variant keys (gcc_linux-64 14.*)
            want = [planned_spec(s) for s in output.requirements[key] if s.split()[0] not in ("compiler", "stdlib")]
            assert [s for s in got if not s.split()[0].endswith("_linux-64")] == want, (name, key)
        exports = [rendered_spec(s) for s in requirements.get("run_exports", {}).get("weak", [])]
        assert exports == [planned_spec(s) for s in output.requirements["run_exports"]]
    libtorch = rendered[("libtorch", None)]
    assert libtorch.variant.get("torch_cuda_arch_list") == (recipe.arch_list or "None")  # part of libtorch's hash
    build = libtorch.recipe.staging_caches[0].requirements.to_dict()["build"]
    compilers = [s for s in build if str(s).endswith(".*") and "_linux-64" in str(s)]
    assert [c.split()[0] for c in compilers] == ["sysroot_linux-64", "gcc_linux-64", "gxx_linux-64",
                                                  *(["cuda-nvcc_linux-64"] if recipe.cuda else [])]


def test_the_rattler_build_recipe_builds_libtorch_once_and_each_python_from_it() -> None:
    recipe = conda_forge.plan("2.13.0", "linux-64", "13.0", "9.0", ("3.11", "3.12"))
    files = rattler_files(recipe)
    assert sorted(files) == ["activate.sh", "build.sh", "cmake_test/CMakeLists.txt", "deactivate.sh", "recipe.yaml",
                             "variants.yaml"]
    assert files["variants.yaml"] == conda_forge.recipe_files(recipe, SOURCE)["conda_build_config.yaml"]
    doc = YAML(typ="safe").load(files["recipe.yaml"])
    staging, *packages = doc["outputs"]
    assert staging["staging"]["name"] == "libtorch-build"
    # both scripts get the job count and the compile cache's variables from the environment torchforge builds in
    # (empty without them)
    forwarded = {name: f'${{{{ env.get("{name}", default="") }}}}' for name in ("MAX_JOBS", *BUILD_VARIABLES)}
    assert staging["build"]["script"] == {"file": "build.sh", "env": {
        "TORCHFORGE_OUTPUT": "libtorch", "PKG_VERSION": "${{ version }}", "PKG_BUILDNUM": str(recipe.build_number),
        **forwarded}}
    assert "python 3.12.*" in staging["requirements"]["host"]  # the feedstock's, chosen too: libtorch keeps it
    assert [p["package"]["name"] for p in packages] == ["libtorch", "pytorch", "pytorch-gpu"]
    assert packages[0]["inherit"] == "libtorch-build"  # libtorch: the staging files and its host's run_exports
    assert packages[1]["inherit"] == {"from": "libtorch-build", "run_exports": False}
    assert packages[1]["build"]["script"]["env"] == {"TORCHFORGE_OUTPUT": "pytorch", **forwarded}
    assert "inherit" not in packages[2]
    assert doc["extra"]["torchforge_settings"] == recipe.settings
    # the sources are the C++ build's alone: the metapackage fetches nothing
    assert "source" not in doc and "source" not in packages[2]
    assert staging["source"] == [{"git": "https://github.com/pytorch/pytorch", "tag": "v0"}]


@pytest.mark.parametrize("recipe_format", list(RecipeFormat))
def test_a_source_archive_keeps_its_sha256_in_both_formats(recipe_format: RecipeFormat) -> None:
    recipe = conda_forge.plan("2.13.0", "linux-64", "cpu", None, ("3.11",))
    archive = Source("url", "https://example.org/pytorch-v2.13.0.tar.gz", "", sha256="ab" * 32)
    files = conda_forge.recipe_files(recipe, archive, recipe_format=recipe_format)
    text = files.get("recipe.yaml") or files["meta.yaml"]
    doc = YAML(typ="safe").load(text) if recipe_format == RecipeFormat.RATTLER_BUILD else None
    sources = doc["outputs"][0]["source"] if doc else None
    if sources is not None:
        assert sources == [{"url": archive.location, "sha256": archive.sha256}]
    else:
        assert f"  - url: {archive.location}\n    sha256: {archive.sha256}\n" in text


# ---- step 4: stand-ins of conda-forge's cuDNN, NCCL and MAGMA ---------------------------------------------------


def test_conda_forge_stand_ins_carry_the_real_sonames_links_dependencies_and_run_exports(tmp_path: Path) -> None:
    from conda_package_streaming import package_streaming

    from torchforge import standin

    written = standin.make_stub_channel(tmp_path / "channel", ["libcudnn-dev 9.*", "nccl 2.*", "libmagma-devel 2.10.0",
                                                               "cuda-version 13.0"], conda_forge=True)
    names = sorted(p.name for p in written)
    # what the -dev packages depend on comes along, at the same version
    assert names == ["cuda-version-13.0-stub_0.conda", "libcudnn-9-stub_0.conda", "libcudnn-dev-9-stub_0.conda",
                     "libmagma-2.10.0-stub_0.conda", "libmagma-devel-2.10.0-stub_0.conda",
                     "libmagma_sparse-2.10.0-stub_0.conda", "nccl-2-stub_0.conda"]
    contents: dict[str, dict[str, bytes]] = {}
    for package in written:
        contents[package.name] = {}
        for component in ("info", "pkg"):
            for tar, member in package_streaming.stream_conda_component(str(package), component=component):
                data = member.linkname.encode() if member.issym() else tar.extractfile(member).read()
                contents[package.name][member.name] = data
    exports = {name: json.loads(files["info/run_exports.json"])["weak"]
               for name, files in contents.items() if "info/run_exports.json" in files}
    assert exports == {"libcudnn-dev-9-stub_0.conda": ["libcudnn >=9,<10.0a0"],
                       "libmagma-devel-2.10.0-stub_0.conda": ["libmagma >=2.10.0,<2.10.1.0a0",
                                                              "libmagma_sparse >=2.10.0,<2.10.1.0a0"],
                       "nccl-2-stub_0.conda": ["nccl >=2,<3.0a0"]}
    assert contents["libcudnn-dev-9-stub_0.conda"]["lib/libcudnn.so"] == b"libcudnn.so.9"
    for package, path, soname in (("libcudnn-9-stub_0.conda", "lib/libcudnn.so.9", "libcudnn.so.9"),
                                  ("nccl-2-stub_0.conda", "lib/libnccl.so.2", "libnccl.so.2"),
                                  ("libmagma-2.10.0-stub_0.conda", "lib/libmagma.so", "libmagma.so")):
        library = tmp_path / soname
        library.write_bytes(contents[package][path])
        assert dynamic(library)["soname"] == [soname]
    # a real solver installs libcudnn with libcudnn-dev
    assert sorted(r.name for r in solve([tmp_path / "channel"], ["libcudnn-dev"])) == ["libcudnn", "libcudnn-dev"]


def test_every_stand_in_fact_cites_a_line_of_a_repository_at_a_commit() -> None:
    from torchforge import standin

    packages = standin.conda_forge_packages()
    assert set(packages) == {"libcudnn", "libcudnn-dev", "cudnn", "nccl", "libmagma", "libmagma_sparse",
                             "libmagma-devel", "python", "python_abi", "numpy"}
    for package in packages.values():
        for fact in (*package.libraries, *package.links, *package.depends, *package.run_exports, *package.constrains):
            assert re.match(r"^([\w-]+/[\w.-]+@[0-9a-f]{8}:|magma-)[\w./-]+:\d", fact.source), fact.source


# ---- step 3: the fixture -------------------------------------------------------------------------------------

FIXTURE = Path(__file__).parent / "fixtures" / "torch_split"
CPU_LIBS = ["libc10.so", "libshm.so", "libtorch.so", "libtorch_cpu.so", "libtorch_global_deps.so", "libtorch_python.so"]
CUDA_LIBS = ["libc10_cuda.so", "libcaffe2_nvrtc.so", "libtorch_cuda.so", "libtorch_cuda_linalg.so"]


def copy_fixture(where: Path) -> Path:
    import shutil

    return Path(shutil.copytree(FIXTURE, where, ignore=shutil.ignore_patterns("build", "*.egg-info", "dist")))


def dynamic(library: Path) -> dict[str, list[str]]:
    """NEEDED, SONAME and RUNPATH/RPATH entries of an ELF file (torchforge.elf reads them)."""
    from torchforge import elf

    info = elf.read_elf(library)
    assert info is not None, library
    return {"needed": list(info.needed), "soname": [info.soname or ""], "runpath": list(info.search_path)}


def run_checked(argv: list[str], **kwargs) -> str:
    import subprocess

    done = subprocess.run(argv, capture_output=True, text=True, **kwargs)
    assert done.returncode == 0, f"{argv}: {done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def conda_forge_prefix(prefix: Path) -> Path:
    """A prefix holding the stand-ins of conda-forge's libcudnn(-dev), nccl and libmagma, unpacked by hand."""
    from torchforge import standin

    for name, version in (("libcudnn", "9"), ("libcudnn-dev", "9"), ("nccl", "2"), ("libmagma", "2.10.0")):
        stub = standin.conda_forge_stub(name, version, "stub_0")
        for rel, data in stub.files.items():
            (prefix / rel).parent.mkdir(parents=True, exist_ok=True)
            (prefix / rel).write_bytes(data)
        for rel, target in stub.links.items():
            (prefix / rel).symlink_to(target)
    return prefix


def consume_from_cmake(prefix: Path, build: Path, env: dict[str, str]) -> str:
    """Configure, build and run the fixture's CMake consumer against the Torch config found under `prefix`."""
    run_checked(["cmake", "-S", str(FIXTURE / "consumer"), "-B", str(build), f"-DCMAKE_PREFIX_PATH={prefix}"], env=env)
    run_checked(["cmake", "--build", str(build)], env=env)
    return run_checked([str(build / "consumer")], env=env)


def test_the_fixture_builds_pytorchs_layout_and_installs_with_pip(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    source = copy_fixture(tmp_path / "src")
    env = {**os.environ, "PYTORCH_BUILD_VERSION": "2.13.0", "PYTORCH_BUILD_NUMBER": "0", "USE_CUDA": "0"}
    run_checked([sys.executable, "setup.py", "-q", "build"], cwd=source, env=env)
    (built,) = (source / "build").glob("lib.*/torch")
    assert sorted(p.name for p in (built / "lib").iterdir()) == CPU_LIBS
    assert (built / "share" / "cmake" / "Torch" / "TorchConfig.cmake").is_file()
    assert (built / "share" / "cmake" / "Torch" / "TorchConfigVersion.cmake").is_file()
    assert (built / "include" / "torch" / "torch.h").is_file()
    cache = (source / "build" / "CMakeCache.txt").read_text()
    assert f"Python_VERSION:STRING={sys.version_info[0]}.{sys.version_info[1]}\n" in cache
    libtorch_python = dynamic(built / "lib" / "libtorch_python.so")
    assert libtorch_python["soname"] == ["libtorch_python.so"] and "$ORIGIN" in libtorch_python["runpath"]
    assert {"libtorch.so", "libtorch_cpu.so", "libshm.so", "libc10.so"} <= set(libtorch_python["needed"])

    target = tmp_path / "site"
    run_checked([sys.executable, "-m", "pip", "install", ".", "--no-deps", "--no-build-isolation", "--no-index",
                 "--target", str(target), "-q"], cwd=source, env=env)
    probe = "import torch; print(torch.__version__, torch.ones_sum(3), torch.cuda_built(), torch.c10_version())"
    clean = {k: v for k, v in env.items() if k != "LD_LIBRARY_PATH"}
    assert run_checked([sys.executable, "-c", probe], cwd=tmp_path, env={**clean, "PYTHONPATH": str(target)}) \
        == "2.13.0 3.0 False 2.13.0\n"

    # the installed package's TorchConfig.cmake serves a C++ consumer too (torch/ is its prefix)
    assert consume_from_cmake(target / "torch", tmp_path / "consumer", clean) == "2.13.0 3.0 0\n"

    # a cache of another Python is refused, as PyTorch would build the bindings for that one
    (source / "build" / "CMakeCache.txt").write_text(cache.replace("Python_SOABI:STRING=", "Python_SOABI:STRING=x"))
    refused = subprocess.run([sys.executable, "setup.py", "-q", "build"], cwd=source, env=env, capture_output=True,
                             text=True)
    assert refused.returncode != 0 and "configured for another Python" in refused.stderr


def test_the_fixtures_cuda_libraries_link_the_prefixs_cudnn_nccl_and_magma_by_soname(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    source = copy_fixture(tmp_path / "src")
    prefix = conda_forge_prefix(tmp_path / "prefix")
    env = {**os.environ, "PYTORCH_BUILD_VERSION": "2.13.0", "USE_CUDA": "1", "CMAKE_PREFIX_PATH": str(prefix),
           "NCCL_ROOT_DIR": str(prefix), "MAGMA_HOME": str(prefix)}
    run_checked([sys.executable, "setup.py", "-q", "build"], cwd=source, env=env)
    (built,) = (source / "build").glob("lib.*/torch")
    assert sorted(p.name for p in (built / "lib").iterdir()) == sorted(CPU_LIBS + CUDA_LIBS)
    cuda = dynamic(built / "lib" / "libtorch_cuda.so")
    assert {"libcudnn.so.9", "libnccl.so.2", "libc10_cuda.so", "libtorch_cpu.so"} <= set(cuda["needed"])
    assert "libmagma.so" in dynamic(built / "lib" / "libtorch_cuda_linalg.so")["needed"]
    assert "libtorch_cuda.so" in dynamic(built / "lib" / "libtorch.so")["needed"]
    for library in (built / "lib").iterdir():  # nothing points at the prefix: it provides them once installed
        assert not [p for p in dynamic(library)["runpath"] if str(prefix) in p], library.name

    missing = {**env, "MAGMA_HOME": str(tmp_path / "nowhere")}
    refused = subprocess.run([sys.executable, "setup.py", "-q", "build"], cwd=copy_fixture(tmp_path / "again"),
                             env=missing, capture_output=True, text=True)
    assert refused.returncode != 0 and "links libmagma.so from $MAGMA_HOME/lib" in refused.stderr


# ---- step 5: built with the embedded engine, installed, imported, audited, consumed from CMake ----------------

E2E_CASES = {"cpu": ("cpu", None), "cuda130": ("13.0", "9.0")}
PY = "3.11"  # this machine's Python; the feedstock's libtorch Python (3.12) is not chosen, so libtorch builds with it
CUDA_LIBRARY_PREFIXES = ("libcudnn", "libnccl", "libmagma", "libcublas", "libcudart", "libcusparse", "libnvrtc")


def install_solved(channels: list[Path], specs: list[str], cuda_driver: str | None, prefix: Path) -> list[Record]:
    """Solve `specs` for a machine with glibc 2.36 (and a driver for CUDA `cuda_driver`) and install into `prefix`."""
    virtual = {"__glibc": "2.36", **({"__cuda": cuda_driver} if cuda_driver else {})}
    return solve_and_install(channels, specs, prefix, virtual=virtual, cache=prefix.parent / "cache")


def build_arguments(accel: str, arch: str | None, source: Path) -> list[str]:
    return ["--pytorch", "2.13.0", "--cuda", accel, *(["--arch-list", arch] if arch else []), "--py", PY,
            "--source", str(source)]


@pytest.fixture(scope="module")
def flavour_builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple]:
    """The fixture's cpu and CUDA 13.0 (arch 9.0) packages built as a user builds them: `torchforge build` (the
    conda-forge flavour by default for 2.13.0, the embedded engine) against a stand-in channel named in the site
    config's `[channels] replace`, into one output channel: {case: (recipe, stand-in channel, packages)}."""
    import shutil

    from torchforge import standin
    from torchforge.flavours.base import Request
    from torchforge.flavours.conda_forge import planning

    root = tmp_path_factory.mktemp("cf-split")
    source = copy_fixture(root / "torch_split")
    out = root / "channel"
    stubs = root / "stubs"
    specs: set[str] = set()
    recipes = {}
    for case, (accel, arch) in E2E_CASES.items():
        planned = conda_forge.plan("2.13.0", "linux-64", accel, arch, (PY,))
        # the build strings hold the source's identity, as `torchforge build --source` plans them
        (recipes[case],) = planning.with_inputs((planned,), Request(source=str(source)))
        recipe_dir = root / "recipes" / case
        assert main(["render", *build_arguments(accel, arch, source), "--format", "rattler-build",
                     "--out", str(recipe_dir)]) == 0
        specs |= set(standin.rendered_recipe_requirements(recipe_dir / recipes[case].id,
                                                            {o.name for o in planned.outputs}))
    standin.make_stub_channel(stubs, sorted(specs), conda_forge=True)
    config = root / "torchforge.toml"
    config.write_text(f'[channels]\nreplace = ["{stubs.as_uri()}"]\n')
    built: dict[str, tuple] = {}
    for case, (accel, arch) in E2E_CASES.items():
        # CONDA_OVERRIDE_CUDA is torchforge's to set for a CUDA recipe (this machine has no driver): not set here
        code = main(["build", *build_arguments(accel, arch, source), "--engine", "rattler-build",
                     "--config", str(config), "--out", str(out)])
        assert code == 0, (out / "logs").glob("*.log") and [log.read_text()[-4000:] for log in (out / "logs").glob("*.log")]
        recipe = recipes[case]
        built[case] = (recipe, stubs, [out / "linux-64" / f"{p.stem}.conda" for p in recipe.planned_outputs()])
        shutil.rmtree(source / "build", ignore_errors=True)  # each case starts from a clean tree, as a user's would
    built["channel"] = (out,)
    return built


def assert_planned_and_audited(recipe: conda_forge.CondaForgeRecipe, packages: list[Path]) -> None:
    """Exactly the planned packages (one per output, the planned build strings), each passing the RPATH audit."""
    from torchforge.rpath import Layout, audit

    names = {p.name.split("-" + recipe.version + "-")[0]: p.name for p in packages}
    assert sorted(names) == sorted(o.name for o in recipe.outputs)
    for output in recipe.outputs:
        pattern = built_string_pattern(recipe, output.name, PY)
        assert re.fullmatch(rf"{re.escape(output.name)}-2\.13\.0-{pattern}\.conda", names[output.name])
    for package in packages:
        assert audit(package, Layout.CONDA).ok, audit(package, Layout.CONDA).to_json()


@pytest.mark.slow
def test_a_rebuild_of_the_same_settings_reuses_every_output_and_an_edited_source_is_another_package(
        flavour_builds, capsys: pytest.CaptureFixture[str]) -> None:
    from torchforge.flavours.base import Request
    from torchforge.flavours.conda_forge import planning

    (out,) = flavour_builds["channel"]
    recipe, _, _ = flavour_builds["cpu"]
    source = out.parent / "torch_split"
    again = ["build", *build_arguments("cpu", None, source), "--engine", "rattler-build", "--config",
             str(out.parent / "torchforge.toml"), "--out", str(out), "--dry-run"]
    capsys.readouterr()
    assert main(again) == 0
    err = " ".join(capsys.readouterr().err.split())
    stems = [p.stem for p in recipe.planned_outputs()]
    assert f"reuse {', '.join(stems)}" in err and "built with the same settings" in err
    edited = next((source / "csrc").rglob("*.cpp"))
    edited.write_text(edited.read_text() + "\n// edited after the build\n")
    (changed,) = planning.with_inputs((recipe,), Request(source=str(source)))
    assert main(again) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "reuse" not in err and changed.planned_outputs()[0].stem in err and "[dry-run]" in err


@pytest.mark.slow
@pytest.mark.parametrize("case", list(E2E_CASES))
def test_the_embedded_engine_builds_the_planned_packages_which_pass_the_audit_and_bundle_nothing(
        case: str, flavour_builds) -> None:
    recipe, _, packages = flavour_builds[case]
    assert_planned_and_audited(recipe, packages)
    libtorch = next(p for p in packages if p.name.startswith("libtorch-"))
    pytorch = next(p for p in packages if p.name.startswith("pytorch-2"))
    contents = {p: package_files(p) for p in (libtorch, pytorch)}
    wanted = [f"lib/{lib}" for lib in CPU_LIBS + (CUDA_LIBS if recipe.cuda else []) if lib != "libtorch_python.so"]
    assert set(wanted) <= contents[libtorch] and "lib/libtorch_python.so" not in contents[libtorch]
    assert "share/cmake/Torch/TorchConfig.cmake" in contents[libtorch]
    assert {f"lib/python{PY}/site-packages/torch/__init__.py", "lib/libtorch_python.so"} <= contents[pytorch]
    assert not [f for f in contents[pytorch] if f.startswith("lib/lib") and f != "lib/libtorch_python.so"]
    for files in contents.values():  # nothing of CUDA's is bundled: the environment provides it
        assert not [f for f in files if Path(f).name.startswith(CUDA_LIBRARY_PREFIXES)]


def package_files(package: Path) -> set[str]:
    from conda_package_streaming import package_streaming

    return {m.name for _, m in package_streaming.stream_conda_component(str(package), component="pkg")}


def package_index(package: Path) -> dict:
    from conda_package_streaming import package_streaming

    for tar, member in package_streaming.stream_conda_component(str(package), component="info"):
        if member.name == "info/index.json":
            return json.loads(tar.extractfile(member).read())
    raise AssertionError(f"{package} has no info/index.json")


@pytest.mark.slow
def test_libtorch_takes_cudnn_nccl_and_magma_from_conda_forge_through_their_run_exports(flavour_builds) -> None:
    recipe, _, packages = flavour_builds["cuda130"]
    libtorch = package_index(next(p for p in packages if p.name.startswith("libtorch-")))
    depends = {d.split()[0]: d for d in libtorch["depends"]}
    assert {"libcudnn", "nccl", "libmagma"} <= set(depends)  # from libcudnn-dev, nccl and libmagma-devel
    assert "libmagma_sparse" not in depends and "python" not in depends  # ignore_run_exports, as the feedstock
    cpu = package_index(next(p for p in flavour_builds["cpu"][2] if p.name.startswith("libtorch-")))
    assert not {"libcudnn", "nccl", "libmagma"} & {d.split()[0] for d in cpu["depends"]}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(E2E_CASES))
def test_installed_next_to_the_stand_ins_it_imports_runs_and_a_cmake_consumer_links_libtorch(
        case: str, flavour_builds, tmp_path: Path) -> None:
    import os

    recipe, stubs, _ = flavour_builds[case]
    (channel,) = flavour_builds["channel"]
    metapackage = recipe.outputs[-1].name
    prefix = tmp_path / "env"
    records = install_solved([channel, stubs], ["libtorch", "pytorch", metapackage], "13.0" if recipe.cuda else None,
                             prefix)
    chosen = {r.name: r.build for r in records}
    assert chosen["pytorch"].startswith(recipe.tag) and chosen["libtorch"].startswith(recipe.tag)

    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "PYTHONPATH", "CONDA_PREFIX")}
    probe = ("import torch; print(torch.__version__, torch.ones_sum(3), torch.cuda_built(), torch.load_linalg()); "
             "print('\\n'.join(sorted({l.split()[-1] for l in open('/proc/self/maps') if '.so' in l})))")
    lines = run_checked([str(prefix / "bin" / "python"), "-c", probe], cwd=tmp_path, env=env).splitlines()
    assert lines[0] == f"2.13.0 3.0 {bool(recipe.cuda)} {bool(recipe.cuda)}"
    loaded = {Path(p).name: Path(p) for p in lines[1:]}
    expected = ["libtorch_python.so", "libtorch.so", "libtorch_cpu.so", "libc10.so"]
    if recipe.cuda:
        expected += ["libtorch_cuda.so", "libcudnn.so.9", "libnccl.so.2", "libtorch_cuda_linalg.so", "libmagma.so"]
    for name in expected:  # every library from the environment's lib/, nothing from LD_LIBRARY_PATH
        assert loaded[name].resolve().parent == (prefix / "lib").resolve(), (name, loaded.get(name))

    assert consume_from_cmake(prefix, tmp_path / "consumer", env) == f"2.13.0 3.0 {1 if recipe.cuda else 0}\n"


@pytest.mark.slow
def test_the_solver_picks_the_cpu_build_without_a_driver_and_the_cuda_build_with_one(flavour_builds) -> None:
    (channel,) = flavour_builds["channel"]
    stubs = [flavour_builds[case][1] for case in E2E_CASES]
    glibc = {"__glibc": "2.36"}
    without = {r.name: r.build for r in solve([channel, *stubs], ["pytorch"], virtual=glibc)}
    with_driver = {r.name: r.build for r in solve([channel, *stubs], ["pytorch"], virtual={**glibc, "__cuda": "13.0"})}
    assert without["pytorch"].startswith("cpu_") and without["libtorch"].startswith("cpu_")
    assert with_driver["pytorch"].startswith("cuda130_") and with_driver["libtorch"].startswith("cuda130_")
    assert "libcudnn" in with_driver and "libcudnn" not in without


@pytest.mark.slow
@pytest.mark.parametrize("case", list(E2E_CASES))
def test_conda_build_builds_the_same_shape_from_meta_yaml_installed_imported_and_audited(
        case: str, tmp_path: Path) -> None:
    """The vendored conda-build (tests/tool_venvs.py) builds the fixture from the flavour's meta.yaml through the
    conda-build engine: the planned packages, the audit, the install with py-rattler, the import and the consumer.

    conda-build's own test step is left out (--no-test): conda-forge's compilers export LDFLAGS with
    --disable-new-dtags and -rpath $PREFIX/lib, the empty stand-in compilers export nothing, so the libraries
    carry DT_RUNPATH, which does not reach libtorch_cuda's cuDNN through pytorch's torch/lib symlinks. The
    pipeline's RPATH fix (DT_RPATH) runs after the build, and this test imports after it."""
    import os

    from tests.condabuild import HOW_TO_GET_ONE, find_conda_tool
    from tests.test_conda_forge_flavour import stand_in_specs
    from torchforge import standin
    from torchforge.engines import BuildJob
    from torchforge.engines.conda_build import CondaBuildEngine
    from torchforge.pipeline import source_copy_skipped
    from torchforge.postbuild import fix_and_audit_package
    from torchforge.proc import Runner

    tool = find_conda_tool()
    if tool is None:
        pytest.skip(HOW_TO_GET_ONE)
    accel, arch = E2E_CASES[case]
    recipe = conda_forge.plan("2.13.0", "linux-64", accel, arch, (PY,))
    source = copy_fixture(tmp_path / "torch_split")
    recipe_dir = tmp_path / "recipes" / recipe.id
    recipe_dir.mkdir(parents=True)
    files = conda_forge.recipe_files(recipe, Source("path", str(source), ""))
    for name, text in files.items():
        (recipe_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (recipe_dir / name).write_text(text)
    stubs = tmp_path / "stubs"
    standin.make_stub_channel(stubs, sorted(stand_in_specs(files, {o.name for o in recipe.outputs})), conda_forge=True)
    job = BuildJob(recipe_dir=recipe_dir, staging_dir=tmp_path / "out", channels=(stubs.as_uri(),), python=PY,
                   env=tool.env(tmp_path / "conda"), test=False)
    runner = Runner()
    result = runner.run(CondaBuildEngine().command(job), check=False, log_file=tmp_path / "build.log", timeout=1800)
    if result.returncode and source_copy_skipped(result.output, source):  # docs/troubleshooting-build.md,
        # "An empty work folder with conda-build": once more, as `torchforge build` does
        result = runner.run(CondaBuildEngine().command(job), check=False, log_file=tmp_path / "build.log",
                            timeout=1800)
    assert result.returncode == 0, result.output[-6000:]
    packages = [fix_and_audit_package(p, runner) for p in sorted((tmp_path / "out" / "linux-64").glob("*.conda"))
                + sorted((tmp_path / "out" / "linux-64").glob("*.tar.bz2"))]
    assert_planned_and_audited(recipe, packages)

    from torchforge.localchannel import index

    index(tmp_path / "out")
    prefix = tmp_path / "env"
    install_solved([tmp_path / "out", stubs], ["libtorch", "pytorch", recipe.outputs[-1].name],
                   "13.0" if recipe.cuda else None, prefix)
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "PYTHONPATH", "CONDA_PREFIX")}
    probe = "import torch; print(torch.__version__, torch.ones_sum(3), torch.cuda_built(), torch.load_linalg())"
    assert run_checked([str(prefix / "bin" / "python"), "-c", probe], cwd=tmp_path, env=env) \
        == f"2.13.0 3.0 {bool(recipe.cuda)} {bool(recipe.cuda)}\n"
    assert consume_from_cmake(prefix, tmp_path / "consumer", env) == f"2.13.0 3.0 {1 if recipe.cuda else 0}\n"


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["rattler-build", "conda-build"])
def test_a_forced_rebuild_of_the_recipe_takes_every_object_from_the_compile_cache(
        engine: str, flavour_builds, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """`torchforge build` of the flavour twice with one --cache, --force on the second: one recipe step (libtorch,
    pytorch, the metapackage) whose setuptools compiles went through ccache; the rebuild compiles nothing. With
    conda-build the variables reach build.sh through meta.yaml's script_env, with rattler-build through the
    scripts' env (conda-build's own test step is left out, as in the conda-build test above)."""
    import re
    import shutil

    from tests.condabuild import HOW_TO_GET_ONE, find_conda_tool
    from torchforge.flavours.base import Request
    from torchforge.flavours.conda_forge import planning
    from torchforge.compilecache import group_key, settings_material

    extra_args = []
    if engine == "conda-build":
        tool = find_conda_tool()
        if tool is None:
            pytest.skip(HOW_TO_GET_ONE)
        for name, value in tool.env(tmp_path / "conda").items():
            monkeypatch.setenv(name, value)
        extra_args = ["--no-test"]
    (channel,) = flavour_builds["channel"]
    source = copy_fixture(tmp_path / "torch_split")
    out, cache = tmp_path / "channel", tmp_path / "cache"
    planned = conda_forge.plan("2.13.0", "linux-64", "cpu", None, (PY,))
    (recipe,) = planning.with_inputs((planned,), Request(source=str(source)))
    key = group_key(*settings_material(recipe.id, recipe.settings))
    args = ["build", *build_arguments("cpu", None, source), "--engine", engine, "--config",
            str(channel.parent / "torchforge.toml"), "--out", str(out), "--cache", str(cache), *extra_args]
    counts = []
    for extra in ([], ["--force"]):
        capsys.readouterr()
        assert main([*args, *extra]) == 0
        log = (out / "logs" / f"{recipe.id}.log").read_text()
        found = re.search(rf"torchforge: compile cache {re.escape(str(cache / key))}: host (\d+)/(\d+) reused; "
                          r".*compiled: (.*)", log)
        assert found, log[-3000:]
        counts.append((int(found[1]), int(found[2]), found[3]))
        assert "/ccache-compilers/CC/" in log  # setuptools' compiles through route.sh's wrapper
        assert all((out / "linux-64" / f"{p.stem}.conda").is_file() for p in recipe.planned_outputs())
        shutil.rmtree(source / "build", ignore_errors=True)
    (cold_hits, cold_calls, cold_compiled), (warm_hits, warm_calls, warm_compiled) = counts
    # libtorch's libraries, then pytorch's pip install (which compiles them again, and its bindings): every
    # compile went through the cache, none around it; the cold build's misses are the fixture's sources
    assert cold_hits < cold_calls and "csrc/torch_cpu.cpp" in cold_compiled and "csrc/module.cpp" in cold_compiled
    assert warm_hits == warm_calls == cold_calls and warm_compiled == "nothing"
    assert (cache / key).is_dir() and [p.name for p in cache.iterdir()] == [key]


def python_folder(series: str) -> Path:
    """The folder of a runnable pythonX.Y: PATH's, else pyenv's installed one (its shim runs only when selected)."""
    import shutil
    import subprocess

    found = shutil.which(f"python{series}")
    if found and subprocess.run([found, "-c", ""], capture_output=True).returncode == 0:
        return Path(found).parent
    installed = sorted((Path.home() / ".pyenv" / "versions").glob(f"{series}.*/bin/python{series}"))
    assert installed, f"python{series} is needed for this test (on PATH or installed by pyenv)"
    return installed[-1].parent


@pytest.mark.slow
def test_one_plan_for_two_pythons_installs_each_pytorch_next_to_its_own_python(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The megabuild's promise with stand-ins that behave like conda-forge's: python exports python_abi and numpy
    its own pin (conda_forge_standins.toml), libtorch is built once with one of the Pythons and ignores what
    python and numpy export (the feedstock's ignore_run_exports_from), so each Python's pytorch installs next to
    that Python, and its torch imports."""
    import os

    from torchforge import standin

    pythons = ("3.10", "3.11")  # the feedstock builds libtorch with 3.12: it builds with 3.10 here
    monkeypatch.setenv("PATH", os.pathsep.join([*(str(python_folder(p)) for p in pythons), os.environ["PATH"]]))
    source = copy_fixture(tmp_path / "torch_split")
    arguments = ["--pytorch", "2.13.0", "--cuda", "cpu", "--py", ",".join(pythons), "--source", str(source)]
    (recipe,) = flavour_commands_with_inputs(conda_forge.plan("2.13.0", "linux-64", "cpu", None, pythons), source)
    assert main(["render", *arguments, "--format", "rattler-build", "--out", str(tmp_path / "recipes")]) == 0
    specs = standin.rendered_recipe_requirements(tmp_path / "recipes" / recipe.id, {o.name for o in recipe.outputs})
    assert any(s.startswith("python 3.11.* ") and s.endswith("_cpython") for s in specs)  # the job's value, whole
    stubs = tmp_path / "stubs"
    standin.make_stub_channel(stubs, specs, conda_forge=True)
    config = tmp_path / "torchforge.toml"
    config.write_text(f'[channels]\nreplace = ["{stubs.as_uri()}"]\n')
    out = tmp_path / "channel"
    assert main(["build", *arguments, "--engine", "rattler-build", "--config", str(config), "--out", str(out)]) == 0

    libtorch = package_index(out / "linux-64" / f"{recipe.planned_outputs()[0].stem}.conda")
    assert not [d for d in libtorch["depends"] if d.split()[0] in ("python", "python_abi", "numpy")], libtorch["depends"]
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "PYTHONPATH", "CONDA_PREFIX")}
    for python in pythons:
        prefix = tmp_path / f"env{python}"
        records = solve_and_install([out, stubs], ["pytorch", f"python {python}.*"], prefix,
                                    virtual={"__glibc": "2.36"}, cache=tmp_path / "cache")
        chosen = {r.name: r for r in records}
        assert chosen["pytorch"].build.startswith(f"cpu_mkl_torchforge_py{python.replace('.', '')}_")
        assert f"python_abi {python}.* *_cp{python.replace('.', '')}" in chosen["pytorch"].depends
        version = run_checked([str(prefix / "bin" / "python"), "-c", "import sys, torch; print(sys.version[:4], "
                               "torch.__version__)"], cwd=tmp_path, env=env)
        assert version.split() == [python, "2.13.0"]


def flavour_commands_with_inputs(planned: conda_forge.CondaForgeRecipe, source: Path | None) -> tuple:
    """The recipe as `torchforge build --source` plans it (the build strings hold the source's identity)."""
    from torchforge.flavours.base import Request
    from torchforge.flavours.conda_forge import planning

    return planning.with_inputs((planned,), Request(source=str(source) if source else None))


@pytest.mark.slow
def test_the_embedded_engines_pytorch_cpu_carries_the_feedstocks_track_features(tmp_path: Path) -> None:
    """2.6.0's pytorch-cpu has `track_features: [pytorch-cpu]` on conda-forge (71a445e6:recipe/meta.yaml:541-543),
    which keeps the solver off it unless asked. recipe.yaml cannot say it (py-rattler-build refuses the key):
    the pipeline writes it into the built package's index.json, and the channel's index carries it."""
    from torchforge import localchannel

    source = copy_fixture(tmp_path / "torch_split")
    request = ["--pytorch", "2.6.0", "--cuda", "cpu", "--py", "3.11"]
    assert main(["standin-channel", *request, "--out", str(tmp_path / "standin")]) == 0
    out = tmp_path / "channel"
    assert main(["build", *request, "--source", str(source), "--config", str(tmp_path / "standin" / "torchforge.toml"),
                 "--engine", "rattler-build", "--out", str(out)]) == 0
    recipe = conda_forge.plan("2.6.0", "linux-64", "cpu", None, ("3.11",))
    stems = {p.name: p.stem for p in flavour_commands_with_inputs(recipe, source)[0].planned_outputs()}
    features = {name: localchannel.info_json(out / "linux-64" / f"{stem}.conda", "index.json").get("track_features")
                for name, stem in stems.items()}
    assert features == {"libtorch": None, "pytorch": None, "pytorch-cpu": "pytorch-cpu"}, features
    listed = json.loads((out / "linux-64" / "repodata.json").read_text())["packages.conda"]
    assert listed[f"{stems['pytorch-cpu']}.conda"].get("track_features") == "pytorch-cpu"
