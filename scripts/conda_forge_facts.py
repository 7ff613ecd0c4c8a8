"""Maintainer tool: read conda-forge/pytorch-cpu-feedstock's facts into torchforge/data/conda_forge.toml again.

    python scripts/conda_forge_facts.py FEEDSTOCK_GIT_DIR            # exit 1 and say so if the table is stale
    python scripts/conda_forge_facts.py FEEDSTOCK_GIT_DIR --write    # rewrite the [releases] part of the table

FEEDSTOCK_GIT_DIR is a clone of github.com/conda-forge/pytorch-cpu-feedstock (a bare one will do), or
tests/data/feedstock (the snapshots scripts/feedstock_snapshots.py keeps; tests/test_feedstock_oracle.py checks the
table against them); the script
needs jinja2 and ruamel.yaml (torchforge's own dependencies). The releases
and the commit each is read at come from the table itself ([releases."X.Y.Z"] commit and commit_note): to add a
release, add those two keys for it and run with --write. `earlier_builds` (optional, kept): earlier commits of
the release whose CUDA jobs its commit no longer has; their arch lists are read into earlier_arch_list.
Everything above the first [releases.] is kept.

How the facts are read, per release, per subdir (linux-64: blas mkl and generic; linux-aarch64: generic, the
sbsa job, as a native build; win-64: mkl) and per job (each CUDA of the subdir's .ci_support files, and cpu):
- recipe/meta.yaml: the selectors are evaluated as conda-build does (they are Python expressions), then Jinja is
  rendered with conda-build's functions replaced by markers (`pin_subpackage NAME exact` ...), keeping each
  line's number; the build and requirements keys of every output are collected.
- recipe/build.sh: the if/elif/else/case conditions on the path are run by bash with the job's variables, and
  the `export NAME=VALUE` lines that run are kept (the last value of each name).
- recipe/bld.bat (win-64): its `if (...) else (...)` blocks are evaluated in Python with the job's variables (cmd.exe
  cannot run here), and the `set NAME=VALUE` lines that run are kept the same way.
A subdir without .ci_support files at a release's commit is written as `not_built` with the reason.
The feedstock's selector and condition text is executed: read the revision before running this on it.
Values that differ between jobs become rows with accel / blas / cuda; specs get placeholders ({version},
{build}, {blas}, {cuda}, {cuda_nodot}, {py}) so one row serves every job.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import jinja2
from ruamel.yaml import YAML

TABLE = Path(__file__).resolve().parent.parent / "torchforge" / "data" / "conda_forge.toml"
PLATFORMS = {"linux-64": ("mkl", "generic"), "linux-aarch64": ("generic",), "win-64": ("mkl",)}
# The variant keys read from each job's .ci_support file (besides its pins): GCC versions on linux, the Visual
# Studio compiler packages on Windows (which have no version key).
CI_KEYS = {"linux-64": ("c_compiler_version", "cxx_compiler_version", "c_stdlib_version", "python"),
           "linux-aarch64": ("c_compiler_version", "cxx_compiler_version", "c_stdlib_version", "python"),
           "win-64": ("c_compiler", "cxx_compiler", "c_stdlib", "python")}
# Rows per output: its requirements, and the build keys that change what a solver or conda-build's checks do
# with the package (detect_binary_files_with_prefix is one value, written as a row like the others).
REQUIREMENT_KEYS = ("requirements/build", "requirements/host", "requirements/run", "requirements/run_constrained",
                    "build/run_exports", "build/ignore_run_exports", "build/ignore_run_exports_from",
                    "build/track_features", "build/missing_dso_whitelist", "build/detect_binary_files_with_prefix")
# Exports that only adjust compiler flags or parallelism on the feedstock's CI: not a fact of the package.
ENV_LEFT_OUT = {"CFLAGS", "CXXFLAGS", "LDFLAGS", "LDFLAGS_LD", "MAX_JOBS", "CMAKE_ARGS", "CMAKE_LIBRARY_PATH"}
# bld.bat's: the compiler flags it extends with CUDA_CFLAGS (kept), the job count, and how it calls pip.
BAT_ENV_LEFT_OUT = {"CFLAGS", "CPPFLAGS", "CXXFLAGS", "MAX_JOBS", "PIP_ACTION", "PIP_VERBOSITY"}
SELECTOR = re.compile(r"#\s*\[(.*)\]\s*$")
Job = tuple[str | None, str]  # (CUDA X.Y or None, blas_impl)


class Feedstock:
    """The feedstock read from git: a clone of it (a bare one will do)."""

    def __init__(self, git_dir: Path) -> None:
        self.git_dir = git_dir

    def show(self, commit: str, path: str) -> str | None:
        done = subprocess.run(["git", "-C", str(self.git_dir), "show", f"{commit}:{path}"], capture_output=True, text=True)
        return done.stdout if done.returncode == 0 else None

    def sha256(self, commit: str, path: str) -> str:
        """The checksum of one file at `commit` (what a recipe that downloads it must check)."""
        blob = subprocess.run(["git", "-C", str(self.git_dir), "show", f"{commit}:{path}"], capture_output=True,
                              check=True).stdout
        return hashlib.sha256(blob).hexdigest()

    def listing(self, commit: str, folder: str) -> list[str]:
        return subprocess.run(["git", "-C", str(self.git_dir), "ls-tree", "--name-only", commit, folder + "/"],
                              capture_output=True, text=True, check=True).stdout.split()


class SnapshotFeedstock(Feedstock):
    """The feedstock read from tests/data/feedstock (scripts/feedstock_snapshots.py writes it): one folder per
    commit; the files it leaves out have their checksums in recipe/SHA256SUMS."""

    def show(self, commit: str, path: str) -> str | None:
        file = self.git_dir / commit / path
        return file.read_text(encoding="utf-8") if file.is_file() else None

    def sha256(self, commit: str, path: str) -> str:
        sums = (self.git_dir / commit / "recipe" / "SHA256SUMS").read_text(encoding="utf-8").splitlines()
        return next(line.split("  ", 1)[0] for line in sums if line.split("  ", 1)[1] == path)

    def listing(self, commit: str, folder: str) -> list[str]:
        base = self.git_dir / commit
        return sorted(str(p.relative_to(base)) for p in (base / folder).iterdir())


def open_feedstock(path: Path) -> Feedstock:
    """A git clone, or the folder of snapshots (it holds one folder per commit and no git objects)."""
    snapshots = not (path / "objects").is_dir() and not (path / ".git").exists()
    return SnapshotFeedstock(path) if snapshots else Feedstock(path)


def selector_names(platform: str, cuda: str | None, blas: str) -> dict[str, object]:
    aarch64, win = platform == "linux-aarch64", platform == "win-64"
    return dict(linux=not win, unix=not win, win=win, win64=win, win32=False, osx=False, aarch64=aarch64,
                x86_64=not aarch64, ppc64le=False, linux64=platform == "linux-64", x86=not aarch64, arm64=False,
                megabuild=True, is_rc=False, py=312,
                cuda_compiler_version=cuda or "None", cuda_compiler="cuda-nvcc" if cuda else "None",
                blas_impl=blas, target_platform=platform, build_platform=platform,
                arm_variant_type="sbsa" if aarch64 and cuda else "None")


def meta_lines(text: str, platform: str, cuda: str | None, blas: str) -> list[tuple[int, str]]:
    """(line number, text) of meta.yaml as conda-build sees it for one job: selectors applied, Jinja rendered."""
    names = selector_names(platform, cuda, blas)
    marked, in_tag = [], False
    for number, line in enumerate(text.splitlines(), 1):
        selector = SELECTOR.search(line)
        if selector and not in_tag:
            line = line[:selector.start()].rstrip() if eval(selector.group(1), {}, dict(names)) else ""
        if not in_tag:
            line = f"@@{number}@@{line}"  # survives Jinja, so every kept line keeps its number
        opened = "{%" in line and "%}" not in line.split("{%", 1)[1]
        in_tag = opened or (in_tag and "%}" not in line)
        marked.append(line)
    functions = dict(
        compiler=lambda lang: f"compiler {lang}", stdlib=lambda lang: f"stdlib {lang}",
        pin_subpackage=lambda name, exact=False, max_pin=None, **_: f"pin_subpackage {name} " + ("exact" if exact else str(max_pin)),
        pin_compatible=lambda name, max_pin=None, **_: f"pin_compatible {name}" + (f" {max_pin}" if max_pin else ""))
    rendered = jinja2.Environment(undefined=jinja2.DebugUndefined).from_string("\n".join(marked)).render(
        **names, PKG_HASH="HASH", CONDA_PY="312", channel_targets="conda-forge main", c_stdlib="sysroot",
        environ={}, **functions)
    kept = []
    for line in rendered.splitlines():
        found = re.match(r"@@(\d+)@@(.*)$", line)
        if not found:
            continue
        body = re.sub(r"@@\d+@@", "", found.group(2))
        body = "" if body.strip().startswith("#") else re.sub(r"\s+#.*$", "", body)
        if body.strip():
            kept.append((int(found.group(1)), body.rstrip()))
    return kept


def outputs_of(lines: list[tuple[int, str]]) -> dict[str, dict[str, list[tuple[str, int]]]]:
    """{output: {"requirements/run": [(spec, line)], "build/number": [...], ...}}; the top-level package is the
    first output (conda-build's implicit one)."""
    outputs: dict[str, dict[str, list[tuple[str, int]]]] = {}
    current: str | None = None
    stack: list[tuple[int, str]] = []
    for number, body in lines:
        indent, text = len(body) - len(body.lstrip()), body.strip()
        if indent == 0:
            stack = [(0, text.split(":")[0])]
            continue
        if not text.startswith("- "):
            while stack and stack[-1][0] >= indent:
                stack.pop()
        top = stack[0][1] if stack else None
        if top == "package" and text.startswith("name:"):
            current = text.split(":", 1)[1].strip()
            outputs.setdefault(current, {})
            continue
        if top == "outputs" and indent == 2:
            if text.startswith("- name:"):
                current = text.split(":", 1)[1].strip()
                outputs.setdefault(current, {})
                stack = [(0, "outputs")]
            continue
        path = [key for _, key in (stack[1:] if top == "outputs" else stack)]
        if text.startswith("- "):
            outputs.setdefault(current or "", {}).setdefault("/".join(path), []).append((text[2:].strip(), number))
        elif text.endswith(":"):
            stack.append((indent, text[:-1]))
        else:
            key, _, value = text.partition(":")
            outputs.setdefault(current or "", {}).setdefault("/".join([*path, key]), []).append((value.strip(), number))
    return outputs


def exported_env(text: str, platform: str, cuda: str | None, blas: str) -> dict[str, tuple[str, int]]:
    """{NAME: (value, line)} of the exports build.sh runs for libtorch in one job."""
    variables = {"PATH": "/usr/bin:/bin", "target_platform": platform, "build_platform": platform,
                 "cuda_compiler_version": cuda or "None", "blas_impl": blas, "PKG_NAME": "libtorch",
                 "OSTYPE": "linux-gnu", "arm_variant_type": "sbsa" if platform == "linux-aarch64" and cuda else "None",
                 "c_compiler": "gcc", "CPU_COUNT": "4", "PREFIX": "/p", "SRC_DIR": "/s",
                 "CONDA_BUILD_CROSS_COMPILATION": ""}

    def holds(condition: str) -> bool:
        return subprocess.run(["bash", "-c", condition], env=variables).returncode == 0

    frames: list[dict[str, object]] = []  # one per open if or case: active (this branch runs), taken, word
    exports: dict[str, tuple[str, int]] = {}
    for number, line in enumerate(text.splitlines(), 1):
        text_ = line.strip()
        running = all(frame["active"] for frame in frames)
        branch = re.match(r"(if|elif) (.*?)(; then)?$", text_)
        case = re.match(r"case (.*) in$", text_)
        if not text_ or text_.startswith("#") or text_ in ("then", "do", "done") or re.match(r"(for|while) ", text_):
            continue
        if branch and branch.group(1) == "if":
            taken = running and holds(branch.group(2))
            frames.append({"active": taken, "taken": taken})
        elif branch:
            frame = frames[-1]
            outer = all(f["active"] for f in frames[:-1])
            taken = outer and not frame["taken"] and holds(branch.group(2))
            frame.update(active=taken, taken=bool(frame["taken"]) or taken)
        elif text_ == "else":
            frames[-1].update(active=not frames[-1]["taken"], taken=True)
        elif text_ in ("fi", "esac"):
            frames.pop()
        elif case:
            word = subprocess.run(["bash", "-c", f"echo {case.group(1)}"], env=variables, capture_output=True,
                                  text=True).stdout.strip()
            frames.append({"active": False, "taken": False, "word": word})
        elif frames and "word" in frames[-1] and re.match(r"^[^=\s(]+\)$", text_):
            frame = frames[-1]
            taken = not frame["taken"] and holds(f'case "{frame["word"]}" in {text_[:-1]}) exit 0;; esac; exit 1')
            frame.update(active=taken, taken=bool(frame["taken"]) or taken)
        elif text_ == ";;":
            frames[-1]["active"] = False
        elif (export := re.match(r"export ([A-Za-z_]\w*)=(.*)$", text_)) and running:
            name, value = export.group(1), export.group(2)
            if len(value) >= 2 and value[0] == value[-1] == '"':
                value = value[1:-1]
            if f"${name}" in value and name in exports and name not in ENV_LEFT_OUT:
                value = value.replace(f"${name}", exports[name][0])  # an appended value: keep the whole of it
            exports[name] = (value, number)
    return exports


_BAT_SET = re.compile(r'^set\s+(?:"([A-Za-z_]\w*)=(.*)"|([A-Za-z_]\w*)=(.*))$', re.IGNORECASE)
_BAT_IF = re.compile(r"^(\) else )?if (.*) \($", re.IGNORECASE)


def bat_holds(condition: str, variables: dict[str, str]) -> bool:
    """One of bld.bat's `if` conditions, expanded with the job's variables: `[not] "A" == "B"` compares, `exist
    PATH` is false (a fresh source tree holds none of the files bld.bat tests for)."""
    def expand(found: re.Match[str]) -> str:
        value = variables.get(found.group(1), "")
        if found.group(2):  # %name:~start,length%
            start, length = (int(n) for n in found.group(2).split(","))
            value = value[start:start + length]
        return value

    text = re.sub(r"%(\w+)(?::~(-?\d+,-?\d+))?%", expand, condition.strip())
    negated = text.lower().startswith("not ")
    text = text[4:].strip() if negated else text
    if text.lower().startswith("exist "):
        return negated
    found = re.fullmatch(r'"([^"]*)"\s*==\s*"([^"]*)"', text)
    if found is None:
        raise ValueError(f"bld.bat condition not understood: {condition!r}")
    return (found.group(1) == found.group(2)) != negated


def bat_env(text: str, cuda: str | None, blas: str) -> dict[str, tuple[str, int]]:
    """{NAME: (value, line)} of the `set` lines bld.bat runs for libtorch in one job (the last value of each
    name; one that extends an earlier value gets it written out, as in exported_env)."""
    variables = {"cuda_compiler_version": cuda or "None", "blas_impl": blas, "PKG_NAME": "libtorch"}
    frames: list[dict[str, bool]] = []  # one per open block: active (this branch runs), taken (a branch ran)
    exports: dict[str, tuple[str, int]] = {}
    for number, line in enumerate(text.splitlines(), 1):
        text_ = line.strip()
        running = all(frame["active"] for frame in frames)
        branch = _BAT_IF.match(text_)
        if not text_ or text_.lower().startswith(("@rem", "rem ", "::")):
            continue
        if branch and not branch.group(1):
            taken = running and bat_holds(branch.group(2), variables)
            frames.append({"active": taken, "taken": taken})
        elif branch:
            outer = all(f["active"] for f in frames[:-1])
            taken = outer and not frames[-1]["taken"] and bat_holds(branch.group(2), variables)
            frames[-1].update(active=taken, taken=frames[-1]["taken"] or taken)
        elif text_.lower() == ") else (":
            frames[-1].update(active=not frames[-1]["taken"], taken=True)
        elif text_ == ")":
            frames.pop()
        elif text_.endswith("(") and text_.lower().startswith("for "):
            frames.append({"active": True, "taken": True})  # a loop's body runs (it sets nothing bld.bat keeps)
        elif (found := _BAT_SET.match(text_)) and running:
            name, value = (found.group(1), found.group(2)) if found.group(1) else (found.group(3), found.group(4))
            for reference in (f"%{name}%", f"!{name}!"):
                if reference in value and name in exports and name not in BAT_ENV_LEFT_OUT:
                    value = value.replace(reference, exports[name][0])  # an appended value: keep the whole of it
            exports[name] = (value, number)
    if frames:
        raise ValueError("bld.bat: unbalanced blocks")
    return exports


def with_placeholders(spec: str, version: str, build: int, cuda: str | None, blas: str) -> str:
    spec = spec.replace(version, "{version}").replace("_py312", "_py{py}")
    if cuda:
        spec = spec.replace("cuda" + cuda.replace(".", ""), "cuda{cuda_nodot}")
        spec = re.sub(rf"^cuda-version {re.escape(cuda)}$", "cuda-version {cuda}", spec)
    spec = re.sub(rf"(?<=[_*]){build}(?=$|\s)", "{build}", spec)
    spec = re.sub(rf"_{blas}(?=[_*])", "_{blas}", spec)
    return spec.replace("*mkl", "*{blas}") if blas == "mkl" else spec


def ci_files(feedstock: Feedstock, commit: str, platform: str) -> tuple[dict[str, str], str]:
    """({CUDA: .ci_support file}, the cpu job's file) of one subdir (blas mkl on linux-64; sbsa on aarch64)."""
    prefix = {"linux-64": ".ci_support/linux_64_blas_implmkl", "linux-aarch64": ".ci_support/linux_aarch64_",
              "win-64": ".ci_support/win_64_"}[platform]
    names = [n for n in feedstock.listing(commit, ".ci_support") if n.startswith(prefix)
             and "tegra" not in n and "c_stdlib_version2.34" not in n]  # tegra: Jetson's own job
    cudas: dict[str, str] = {}
    for name in names:
        found = re.search(r"cuda_compiler_version([0-9.]+)", name)
        if found:
            cudas.setdefault(found.group(1), name)
    return cudas, next((n for n in names if "cuda_compiler_versionNone" in n), "")


def where(jobs: set[tuple[str, str, str | None]], blases: tuple[str, ...], several_cudas: bool) -> dict[str, str]:
    """accel / blas / cuda of a row seen in `jobs` (left out where it holds for every job)."""
    accels, blas_seen = {a for a, _, _ in jobs}, {b for _, b, _ in jobs}
    cudas = {c for _, _, c in jobs if c}
    found: dict[str, str] = {}
    if accels != {"cuda", "cpu"}:
        found["accel"] = next(iter(accels))
    if blas_seen != set(blases):
        found["blas"] = next(iter(blas_seen))
    if accels == {"cuda"} and len(cudas) == 1 and several_cudas:
        found["cuda"] = next(iter(cudas))
    return found


def platform_facts(feedstock: Feedstock, version: str, commit: str, platform: str) -> dict[str, object] | None:
    """The facts of one subdir's jobs; None where the feedstock has no job for it at this commit."""
    blases = PLATFORMS[platform]
    cudas, cpu_file = ci_files(feedstock, commit, platform)
    if not cpu_file:
        return None
    win = platform == "win-64"
    meta = feedstock.show(commit, "recipe/meta.yaml") or ""
    build_sh = feedstock.show(commit, "recipe/bld.bat" if win else "recipe/build.sh") or ""
    requirements: dict[tuple[str, str, str, int], set[tuple[str, str, str | None]]] = {}
    env: dict[tuple[str, str, int], set[tuple[str, str, str | None]]] = {}
    arch: dict[str, tuple[str, int]] = {}
    outputs: dict[str, list[str]] = {}
    patches: dict[tuple[str, int], set[tuple[str, str, str | None]]] = {}
    for cuda in [*cudas, None]:
        for blas in blases:
            accel = "cuda" if cuda else "cpu"
            found = outputs_of(meta_lines(meta, platform, cuda, blas))
            outputs.setdefault(accel, list(found))
            build = int(next(v for o in found.values() for v, _ in o.get("build/number", []))) if any(
                "build/number" in o for o in found.values()) else 0
            for path, line in found.get("libtorch", {}).get("source/patches", []):
                patches.setdefault((path, line), set()).add((accel, blas, cuda))
            for output, keys in found.items():
                for key in REQUIREMENT_KEYS:
                    for spec, line in keys.get(key, []):
                        spec = spec[1:-1] if len(spec) > 1 and spec[0] == spec[-1] and spec[0] in "'\"" else spec
                        row = (output, key.split("/")[1], with_placeholders(spec, version, build, cuda, blas), line)
                        requirements.setdefault(row, set()).add((accel, blas, cuda))
            script_env = bat_env(build_sh, cuda, blas) if win else exported_env(build_sh, platform, cuda, blas)
            for name, (value, line) in script_env.items():
                if name in (BAT_ENV_LEFT_OUT if win else ENV_LEFT_OUT) or "$(" in value:
                    continue
                if name == "TORCH_CUDA_ARCH_LIST" and cuda:
                    arch[cuda] = (value, line)
                    continue
                value = "{cuda}" if name == "CUDA_VERSION" and value in ("$cuda_compiler_version", "%cuda_compiler_version%") else value
                env.setdefault((name, value, line), set()).add((accel, blas, cuda))
    several = len(cudas) > 1
    ci = {}
    host_names = {spec.split()[0].replace("-", "_") for (_, key, spec, _) in requirements if key == "host"}
    for job, name in [*cudas.items(), ("cpu", cpu_file)]:
        text = feedstock.show(commit, name) or ""
        lines, values = text.splitlines(), YAML(typ="safe").load(text)
        line_of = {key: lines.index(f"{key}:") + 1 for key in values}
        ci[job] = {"file": name, "line_of": line_of, "values": values, "host_names": host_names}
    return {"cuda": list(cudas), "arch": arch, "ci": ci, "outputs": outputs, "activation": windows_activation(feedstock, commit) if win else None,
            "requirements": [dict(output=o, key=k, spec=s, line=n, **where(jobs, blases, several))
                             for (o, k, s, n), jobs in requirements.items()],
            "env": [dict(name=n, value=v, line=line, **where(jobs, blases, several))
                    for (n, v, line), jobs in env.items()],
            "patches": [dict(path=p, sha256=feedstock.sha256(commit, f"recipe/{p}"), line=line,
                             **where(jobs, blases, several)) for (p, line), jobs in patches.items()]}


def windows_activation(feedstock: Feedstock, commit: str) -> tuple[str, str] | None:
    """(mechanism, FILE:LINE) of the activation script bld.bat installs, if the feedstock has one then."""
    script = feedstock.show(commit, "recipe/activate.bat")
    if script is None:
        return None
    bld = (feedstock.show(commit, "recipe/bld.bat") or "").splitlines()
    installs = next(i for i, line in enumerate(bld, 1) if re.search(r"activate\.d\\", line))
    sets = next(i for i, line in enumerate(script.splitlines(), 1) if 'set "CF_TORCH_CUDA_ARCH_LIST=' in line)
    return "activate.d", f"recipe/bld.bat:{installs}; recipe/activate.bat:{sets}"


def earlier_arch_lists(feedstock: Feedstock, commits: list[str], platform: str, tip: list[str]) -> dict[str, tuple[str, str]]:
    """{CUDA: (arch list, COMMIT:recipe/build.sh:LINE)} of earlier builds of a release, for the CUDA versions its
    commit no longer builds (the first of `commits` that has one wins)."""
    found: dict[str, tuple[str, str]] = {}
    for commit in commits:
        cudas, _ = ci_files(feedstock, commit, platform)
        script = feedstock.show(commit, "recipe/build.sh") or ""
        for cuda in (c for c in cudas if c not in tip and c not in found):
            value, line = exported_env(script, platform, cuda, PLATFORMS[platform][0])["TORCH_CUDA_ARCH_LIST"]
            found[cuda] = (value, f"{commit[:8]}:recipe/build.sh:{line}")
    return found


def release_facts(feedstock: Feedstock, version: str, commit: str) -> tuple[dict[str, object], dict[str, dict]]:
    meta = (feedstock.show(commit, "recipe/meta.yaml") or "").splitlines()
    build_sh = (feedstock.show(commit, "recipe/build.sh") or "").splitlines()
    files = feedstock.listing(commit, "recipe")

    def line_where(pattern: str, lines: list[str] = meta) -> int:
        return next(i for i, line in enumerate(lines, 1) if re.search(pattern, line))

    base_line = line_where(r"^\{% set build = \d+ %\}")
    triton_line = line_where(r"^\{% set triton = ")
    patches_line = line_where(r"^\s*patches:\s*$")
    indent = len(meta[patches_line - 1]) - len(meta[patches_line - 1].lstrip())
    entries, last = 0, patches_line
    for number in range(patches_line + 1, len(meta) + 1):
        line = meta[number - 1]
        if not line.strip() or (len(line) - len(line.lstrip()) <= indent and not line.lstrip().startswith("-")):
            break
        if line.lstrip().startswith("- "):
            entries, last = entries + 1, number
    activation = None
    if "recipe/write_activation_json.py" in files:
        activation = ("env_vars.d", f"recipe/build.sh:{line_where('write_activation_json.py', build_sh)}; "
                                    "recipe/write_activation_json.py")
    elif "recipe/activate.sh" in files:
        script = (feedstock.show(commit, "recipe/activate.sh") or "").splitlines()
        activation = ("activate.d", f"recipe/build.sh:{line_where('activate.*deactivate', build_sh)}; "
                                    f"recipe/activate.sh:{line_where('export CF_TORCH_CUDA_ARCH_LIST=', script)}")
    platforms = {p: platform_facts(feedstock, version, commit, p) for p in PLATFORMS}
    if platforms["linux-64"] is None:
        raise ValueError(f"{version}: the feedstock has no linux-64 job at {commit}")
    common = {"build_number": (int(re.search(r"\d+", meta[base_line - 1]).group()), base_line),
              "cuda_offset": line_where(r"set build = build \+ 200"), "mkl_offset": line_where(r"set build = build \+ 100"),
              "triton": (re.search(r'"(.*)"', meta[triton_line - 1]).group(1), triton_line),
              "patches": (entries, patches_line + 1, last), "activation": activation,
              "outputs": platforms["linux-64"]["outputs"]}
    for platform, facts in platforms.items():
        if facts and facts["outputs"] != common["outputs"]:
            raise ValueError(f"{version}: the outputs of {platform} differ from linux-64's: the table has one list")
    return common, platforms


def q(value: object) -> str:
    return json.dumps(value)


def release_toml(version: str, release: dict, common: dict, platforms: dict[str, dict],
                 earlier: dict[str, dict[str, tuple[str, str]]]) -> str:
    commit, note = release["commit"], release["commit_note"]
    out = [f'[releases."{version}"]', f"commit = {q(commit)}", f"commit_note = {q(note)}",
           *([f"earlier_builds = {q(release['earlier_builds'])}"] if release.get("earlier_builds") else []),
           f"build_number = {common['build_number'][0]}",
           f'build_number_source = "recipe/meta.yaml:{common["build_number"][1]}"',
           f'cuda_offset_source = "recipe/meta.yaml:{common["cuda_offset"]}"',
           f'mkl_offset_source = "recipe/meta.yaml:{common["mkl_offset"]}"',
           f"triton = {q(common['triton'][0])}", f'triton_source = "recipe/meta.yaml:{common["triton"][1]}"',
           f'patches = {{ count = {common["patches"][0]}, source = "recipe/meta.yaml:{common["patches"][1]}-{common["patches"][2]}" }}',
           f"outputs_cuda = {q(common['outputs']['cuda'])}", f"outputs_cpu = {q(common['outputs']['cpu'])}"]
    if common["activation"]:
        mechanism, source = common["activation"]
        out.append(f'activation = {{ variable = "CF_TORCH_CUDA_ARCH_LIST", mechanism = {q(mechanism)}, source = {q(source)} }}')
    missing = {p: f"no .ci_support/{p.replace('-', '_')}_*.yaml at this commit" for p, f in platforms.items() if f is None}
    if missing:
        out.append("not_built = { " + ", ".join(f"{q(p)} = {q(why)}" for p, why in missing.items()) + " }")
    for platform, facts in platforms.items():
        if facts is None:
            continue
        table = f'releases."{version}".platforms."{platform}"'
        out += [f"[{table}]", f"cuda = {q(facts['cuda'])}"]
        if facts["activation"]:
            mechanism, source = facts["activation"]
            out.append(f'activation = {{ variable = "CF_TORCH_CUDA_ARCH_LIST", mechanism = {q(mechanism)}, source = {q(source)} }}')
        script = "recipe/bld.bat" if platform == "win-64" else "recipe/build.sh"
        out += [f'arch_list."{c}" = {{ value = {q(v)}, source = "{script}:{n}" }}' for c, (v, n) in sorted(facts["arch"].items())]
        out += [f'earlier_arch_list."{c}" = {{ value = {q(v)}, source = {q(s)} }}'
                for c, (v, s) in sorted(earlier.get(platform, {}).items())]
        for job, ci in facts["ci"].items():
            name = ci["file"].split("/")[-1]
            out += [f'[{table}.ci_support."{job}"]', f'file = {q(".ci_support/" + name)}']
            for key in CI_KEYS[platform]:
                if key in ci["values"]:
                    raw = ci["values"][key]
                    value = [str(v).split(".*")[0] for v in raw] if key == "python" else str(raw[0])
                    # python: X.Y, and the job's variant value whole (3.12.* *_cpython), which conda-build pins
                    whole = f", variant = {q([str(v) for v in raw])}" if key == "python" else ""
                    out.append(f'{key} = {{ value = {q(value)}{whole}, source = "{name}:{ci["line_of"][key]}" }}')
            out.append("pins = [")
            out += [f'  {{ name = {q(k)}, value = {q(str(ci["values"][k][0]))}, source = "{name}:{ci["line_of"][k] + 1}" }},'
                    for k in sorted(ci["values"]) if k in ci["host_names"] and k != "python"]
            out.append("]")
        out += [f"[{table}.recipe]", "requirements = ["]
        for row in sorted(facts["requirements"], key=lambda r: (r["output"], r["key"], r["line"])):
            out.append(_row(row, ("output", "key", "spec", "accel", "blas", "cuda"), "recipe/meta.yaml"))
        out += ["]", "patches = ["]
        out += [_row(row, ("path", "sha256", "accel", "blas", "cuda"), "recipe/meta.yaml")
                for row in sorted(facts["patches"], key=lambda r: r["line"])]
        out += ["]", "env = ["]
        out += [_row(row, ("name", "value", "accel", "blas", "cuda"), script)
                for row in sorted(facts["env"], key=lambda r: r["line"])]
        out.append("]")
    return "\n".join(out)


def _row(row: dict, keys: tuple[str, ...], file: str) -> str:
    return "  { " + ", ".join(f"{k} = {q(row[k])}" for k in keys if row.get(k) is not None) + f', source = "{file}:{row["line"]}" }},'


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        print(__doc__)
        return 2
    feedstock, write = open_feedstock(Path(argv[0])), "--write" in argv[1:]
    text = TABLE.read_text(encoding="utf-8")
    head = text[:re.search(r'^\[releases\."', text, re.MULTILINE).start()]
    releases = tomllib.loads(text)["releases"]
    body = "\n\n".join(release_toml(v, r, *release_facts(feedstock, v, r["commit"]), {
        p: earlier_arch_lists(feedstock, r.get("earlier_builds", []), p, list(r["platforms"][p]["arch_list"]))
        for p in ("linux-64", "linux-aarch64") if r.get("earlier_builds")}) for v, r in releases.items())
    new = head + body + "\n\n"
    if write:
        TABLE.write_text(new, encoding="utf-8")
        print(f"wrote {TABLE}")
        return 0
    if new != text:
        print(f"{TABLE} differs from the feedstock's facts: run with --write and review the diff")
        return 1
    print(f"{TABLE} matches the feedstock")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
