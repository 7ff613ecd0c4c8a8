"""The scripts the compile cache writes into each build (torchforge/compilecache.py says why each exists): the nvcc
wrapper with its arch filter and FindCUDA's scan cache, the CC / CXX wrapper, and route.sh, which points a
setuptools or ninja build's compilers at the wrappers. Bash text only: nothing here runs.
"""

from __future__ import annotations

import shlex
from pathlib import Path

# First words of CC / CXX that are a compiler launcher of the user's own: such a CC stays as it is.
OWN_LAUNCHERS = ("ccache", "sccache", "distcc", "icecc", "buildcache")


# Bash, run by the nvcc wrapper on its arguments. Extensions' setup.py files hard-code their own -gencode list
# (causal-conv1d and mamba-ssm: every arch from sm_75 up), whatever TORCH_CUDA_ARCH_LIST says: each pair whose
# `code=` is an SASS arch that was not asked for, or a PTX (compute_) of an arch not marked +PTX, is dropped; an
# arch marked +PTX gets its PTX. A call with pairs of which none was asked for fails: nvcc would otherwise build
# for its own default arch.
GENCODE_FILTER = r"""# The arch list asked for: other archs' -gencode pairs are dropped (TORCHFORGE_KEEP_GENCODE=1 keeps them).
if [ -n "${TORCHFORGE_ARCH_LIST:-}" ] && [ "${TORCHFORGE_KEEP_GENCODE:-0}" = 0 ]; then
    wanted=" " ptx=" "
    for arch in ${TORCHFORGE_ARCH_LIST//[;,]/ }; do
        number=${arch%+PTX} && number=${number//./}
        case "$number" in
            ""|*[!0-9a-z]*|[!0-9]*)
                echo "torchforge: TORCHFORGE_ARCH_LIST=$TORCHFORGE_ARCH_LIST: '$arch' is not an arch like 8.0, 9.0a or 9.0+PTX: the -gencode list is kept" >&2
                wanted="" && break ;;
        esac
        wanted+="$number " && [ "$arch" != "${arch%+PTX}" ] && ptx+="$number "
    done
fi
if [ -n "${wanted:-}" ]; then
    args=() kept=() dropped=() given=0 source=""
    while [ $# -gt 0 ]; do
        case "$1" in
            -gencode|--generate-code) spec=${2:-} && shift && { [ $# -eq 0 ] || shift; } ;;
            -gencode=*|--generate-code=*) spec=${1#*=} && shift ;;
            *) case "$1" in *.cu) source=$1 ;; esac; args+=("$1") && shift && continue ;;
        esac
        given=1 spec=${spec//[\"\' \[\]]/} && arch=${spec#*arch=} && arch=${arch%%,*} codes=${spec#*code=} keep=""
        for code in ${codes//,/ }; do
            case "$code" in
                sm_*) [[ "$wanted" == *" ${code#sm_} "* ]] && keep+=",$code" ;;
                compute_*) [[ "$ptx" == *" ${code#compute_} "* ]] && keep+=",$code" ;;
            esac
            [[ ",$keep," == *",$code,"* ]] || dropped+=("$code")
        done
        [ -n "$keep" ] && args+=(-gencode "arch=$arch,code=[${keep#,}]") && kept+=(${keep//,/ })
    done
    if [ "$given" = 1 ]; then
        for number in $ptx; do
            [[ " ${kept[*]} " == *" compute_$number "* ]] && continue
            args+=(-gencode "arch=compute_$number,code=compute_$number") && kept+=("compute_$number")
        done
        if [ ${#kept[@]} -eq 0 ]; then
            echo "torchforge: nvcc ${source:-call}: none of its -gencode archs (${dropped[*]}) is in TORCHFORGE_ARCH_LIST=$TORCHFORGE_ARCH_LIST; build for an arch list it has, or set TORCHFORGE_KEEP_GENCODE=1 to keep its own list" >&2
            exit 1
        fi
        [ ${#dropped[@]} -eq 0 ] || echo "torchforge: nvcc ${source:-call}: kept ${kept[*]}; dropped ${dropped[*]} (not in TORCHFORGE_ARCH_LIST=$TORCHFORGE_ARCH_LIST; TORCHFORGE_KEEP_GENCODE=1 keeps them)" >&2
    fi
    set -- "${args[@]}"
fi"""


# Bash, run by the wrappers on their arguments before ccache sees them. An extension's compiles name the host
# prefix's torch headers by a path with the Python in it (lib/python3.11/site-packages/torch/include), and the
# preprocessed source names every header by that path: the second Python's objects would all miss. Such paths go
# through a link beside the wrappers (SITE_LINK, the same path for every Python of a group, under base_dir) to
# that site-packages; a build whose calls name two site-packages folders keeps the second as it is. The engines
# name their prefixes differently (conda-build's _h_env_placehold..., rattler-build's host_env_placehold...): any
# other path under $PREFIX or $BUILD_PREFIX goes through a link beside it too (host-prefix, build-prefix), so one
# engine's objects are the other's hits. The locale variables ccache hashes (rattler-build sets LC_ALL, conda-build
# does not) are unset: they change only the language of the compiler's messages.
SITE_MAP = r"""links=${SITE_LINK%/*}
args=()
for arg in "$@"; do
    case "$arg" in
        */lib/python3*/site-packages*)
            rest=${arg#*/site-packages} && head=${arg%"$rest"} && path=/${head#*/}
            if [ -d "$path" ] && [ "${head%"$path"}$path" = "$head" ]; then
                [ -L "$SITE_LINK" ] || { ln -s "$path" "$SITE_LINK.$$" 2>/dev/null && mv -Tf "$SITE_LINK.$$" "$SITE_LINK"; }
                [ "$(readlink "$SITE_LINK")" != "$path" ] || arg=${head%"$path"}$SITE_LINK$rest
            fi ;;
    esac
    for pair in "host-prefix ${PREFIX:-}" "build-prefix ${BUILD_PREFIX:-}"; do
        link=$links/${pair%% *} path=${pair#* }
        case "$path" in /?*) ;; *) continue ;; esac
        case "$arg" in
            *"$path"/*|*"$path")
                [ -L "$link" ] || { ln -s "$path" "$link.$$" 2>/dev/null && mv -Tf "$link.$$" "$link"; }
                [ "$(readlink "$link")" != "$path" ] || arg=${arg//"$path"/"$link"} ;;
        esac
    done
    args+=("$arg")
done
[ ${#args[@]} -eq 0 ] || set -- "${args[@]}"
unset LANG LC_ALL LC_CTYPE LC_MESSAGES
"""


def nvcc_wrapper(ccache: str, scans: Path, base_dir: Path, stats_log: Path, site_link: Path | None = None) -> str:
    """The script CUDA_NVCC_EXECUTABLE names: the build's nvcc ($CUDA_HOME/bin/nvcc, else the one on PATH)
    through ccache, which hashes that real nvcc and its arguments.

    FindCUDA also runs `nvcc -M` once per .cu file before compiling it, a dependency scan ccache cannot cache
    ("unsupported compiler option"): on a warm build these scans are most of the time left. The script keeps
    each scan's output under `scans`, keyed by the digest of nvcc (and of the host compiler on PATH), the
    arguments and the variables nvcc reads (paths under base_dir made relative to the working directory, as
    ccache does); an entry is used only while every file the scan listed still has the content it had, so a
    changed header runs the scan again. Each scan logs a hit or a run in the stats log.

    Before either, the call's `-gencode` pairs are cut to the arch list that was asked for (GENCODE_FILTER)."""
    return rf"""#!/usr/bin/env bash
# Written by torchforge's compile cache. FindCUDA (find_package(CUDA), cuda_add_library) runs nvcc from custom
# commands that CMAKE_CUDA_COMPILER_LAUNCHER does not reach; CUDA_NVCC_EXECUTABLE names this file instead.
nvcc="${{CUDA_HOME:+$CUDA_HOME/bin/nvcc}}"
if [ -z "$nvcc" ] || [ ! -x "$nvcc" ]; then nvcc="$(command -v nvcc)"; fi
if [ -z "$nvcc" ]; then echo "torchforge: no nvcc at \$CUDA_HOME/bin or on PATH" >&2; exit 127; fi
{GENCODE_FILTER}
SITE_LINK={shlex.quote(str(site_link or base_dir / "site-packages"))}
{SITE_MAP}
case " $* " in
    *" -M "*) ;;
    *) exec {shlex.quote(ccache)} "$nvcc" "$@" ;;
esac
# FindCUDA's dependency scan: from the scan cache while every file it listed is unchanged.
scans={shlex.quote(str(scans))} base={shlex.quote(str(base_dir))} stats={shlex.quote(str(stats_log))}
out="" source="" previous=""
for arg in "$@"; do
    [ "$previous" = "-o" ] && out=$arg
    case "$arg" in *.cu) source=$arg ;; esac
    previous=$arg
done
[ -n "$out" ] || exec "$nvcc" "$@"
# Paths under base_dir are keyed relative to the working directory, as ccache's base_dir does: each build has
# its own work folder (the engine's, with a time stamp) at the same place relative to its objects.
up=() dir=$PWD
while [ "${{dir#"$base"}}" != "$dir" ]; do up+=("$dir"); [ "$dir" = "$base" ] && break; dir=${{dir%/*}}; done
relative() {{ local text=$1 i; for i in "${{!up[@]}}"; do text=${{text//"${{up[$i]}}"/@UP$i@}}; done; printf '%s\n' "$text"; }}
absolute() {{ local text=$1 i; for i in "${{!up[@]}}"; do text=${{text//@UP$i@/${{up[$i]}}}}; done; printf '%s\n' "$text"; }}
# nvcc's and the host compiler's content digest, computed once per path, size, mtime and inode of each
programs=$(stat -L -c '%n %s %Y %i' "$nvcc" "$(type -P g++)" "$(type -P gcc)" 2>/dev/null)
known="$scans/programs/$(printf '%s' "$programs" | sha256sum | cut -c1-64)"
if [ ! -s "$known" ]; then
    mkdir -p "$scans/programs"
    while read -r path _; do sha256sum < "$path"; done <<< "$programs" > "$known.$$" && mv -f "$known.$$" "$known"
fi
key=$({{
    echo "torchforge nvcc -M 1"; printf '%s\n' "$programs" "$(<"$known")"
    relative "$PWD"; printf '%s\n' "NVCC_PREPEND_FLAGS=${{NVCC_PREPEND_FLAGS:-}}" \
        "NVCC_APPEND_FLAGS=${{NVCC_APPEND_FLAGS:-}}" "NVCC_CCBIN=${{NVCC_CCBIN:-}}" "CPATH=${{CPATH:-}}" \
        "C_INCLUDE_PATH=${{C_INCLUDE_PATH:-}}" "CPLUS_INCLUDE_PATH=${{CPLUS_INCLUDE_PATH:-}}"
    for arg in "$@"; do relative "$arg"; done
}} | sha256sum) && key=${{key%% *}}
entry="$scans/${{key:0:2}}/$key"
if [ -s "$entry.sums" ] && [ -f "$entry.d" ]; then
    if absolute "$(<"$entry.sums")" | sha256sum --check --status --strict - 2>/dev/null; then
        absolute "$(<"$entry.d")" > "$out"
        printf '# %s\ntorchforge_scan_hit\n' "$source" >> "$stats"
        exit 0
    fi
fi
"$nvcc" "$@" || exit
printf '# %s\ntorchforge_scan_run\n' "$source" >> "$stats"
listed=$(<"$out")
case "$listed" in *'\ '*) exit 0 ;; esac  # a path with a space: not stored
set -f
files=$(printf '%s\n' "$listed" | sed -e '1s/^[^:]*:[[:space:]]*//' -e 's/\\$//')
sums=$(sha256sum -- $files 2>/dev/null) || exit 0
mkdir -p "${{entry%/*}}"
relative "$listed" > "$entry.d.$$" && mv -f "$entry.d.$$" "$entry.d"
relative "$sums" > "$entry.sums.$$" && mv -f "$entry.sums.$$" "$entry.sums"
exit 0
"""


def compiler_wrapper(ccache: str) -> str:
    """The body of each CC / CXX wrapper (route.sh puts the `real=` line naming the compiler, and its digest, above
    it). Called by ccache (CMake's launcher is also set) or by nvcc (its host compiler), it runs the compiler
    itself: one cache lookup per object, and nvcc's temporary host files stay out of the cache."""
    return f"""# Written by torchforge's compile cache: the compiler through ccache, which hashes that real compiler.
case "$(readlink /proc/$PPID/exe 2>/dev/null)" in
    {shlex.quote(ccache)}|*/nvcc|*/cicc|*/cudafe++) exec "$real" "$@" ;;
esac
# the link beside the wrappers, found from this file's path: CMake's launcher (ccache) hashes this file, whose
# content must then be the same in every build folder
SITE_LINK="$(dirname "$(dirname "$0")")/site-packages"
{SITE_MAP}
exec {shlex.quote(ccache)} "$real" "$@"
"""


def compilers_route() -> str:
    """The script the pytorch build script sources before its install command (bash, with `set -u`): CC and CXX
    become wrappers named like the compilers they run, so setuptools' and ninja's compiles go through ccache.

    The compiler is the one the build would have used: $CC / $CXX where the recipe's environment set them
    (conda's compiler packages, the user's --env), else the one this Python was built with (sysconfig, what
    setuptools uses), else cc / c++. A CC that starts with a launcher of the user's own stays as it is."""
    launchers = "|".join(f"{name}*" for name in OWN_LAUNCHERS)
    return f"""# Written by torchforge's compile cache (torchforge/compilecache.py); sourced by the build script.
[ -e /proc/self/exe ] || return 0  # the wrappers tell their caller from /proc (Linux)
torchforge_route() {{
    local variable=$1 value real wrapper here
    here=$(dirname "${{BASH_SOURCE[0]}}")
    value=${{!variable:-}}
    if [ -z "$value" ]; then
        value=$("${{PYTHON:-python}}" -c "import sysconfig; print(sysconfig.get_config_var('$variable') or '')" 2>/dev/null || true)
        command -v "${{value%% *}}" >/dev/null 2>&1 || value=$2
    fi
    set -- $value
    case "${{1##*/}}" in
        {launchers})
            echo "torchforge: $variable=$value runs your own compiler launcher: its compiles do not go through torchforge's compile cache"
            return 0 ;;
    esac
    if ! real=$(command -v "$1"); then
        echo "torchforge: $variable=$value: no compiler $1 found, so its compiles do not go through the compile cache"
        return 0
    fi
    shift
    mkdir -p "$here/$variable"
    wrapper="$here/$variable/${{real##*/}}"
    # The compiler's own digest in the wrapper: where CMake's launcher (ccache) runs the wrapper, ccache hashes
    # the wrapper's content, which then changes with the compiler's.
    {{ printf '#!/bin/bash\\n# compiler sha256 %s\\nreal=%q\\n' "$(sha256sum < "$real")" "$real"
       cat "$here/wrapper.sh"; }} > "$wrapper.tmp"
    chmod 755 "$wrapper.tmp" && mv -f "$wrapper.tmp" "$wrapper"
    case "$wrapper" in
        *[[:space:]\\'\\"\\\\]*)
            # setuptools splits CC at blanks and quotes, CMake takes it as a path: neither reads a quoted path,
            # so the wrapper is reached by name, its folder first on PATH.
            export PATH="${{wrapper%/*}}:$PATH"
            wrapper=${{wrapper##*/}} ;;
    esac
    export "$variable=$wrapper${{*:+ $*}}"
}}
torchforge_route CC cc
torchforge_route CXX c++
unset -f torchforge_route
# torch's cpp_extension (2.13: torch/utils/cpp_extension.py _wrap_compiler) puts a ccache found on PATH before
# the compiler, so ccache would run the wrappers and hash the paths they map (the host prefix's, whose padded
# name differs with the output folder's length): every object a miss in another folder. The wrappers run ccache.
export TORCH_NO_COMPILER_WRAPPER=1
# torch's cpp_extension runs nvcc from $PYTORCH_NVCC under ninja: the cache's nvcc wrapper (and its arch filter)
# then sees those calls too. A value of the user's own, or a path with blanks (ninja would split it), is kept out.
torchforge_nvcc=$(cd "$(dirname "${{BASH_SOURCE[0]}}")/../ccache-nvcc" 2>/dev/null && pwd)/nvcc
case "$torchforge_nvcc" in
    *[[:space:]]*) ;;
    *) [ -n "${{PYTORCH_NVCC:-}}" ] || [ ! -x "$torchforge_nvcc" ] || export PYTORCH_NVCC="$torchforge_nvcc" ;;
esac
unset torchforge_nvcc
"""
