#!/usr/bin/env bash
# Build magma-cudaXYZ with torchforge from a real MAGMA source on a GPU machine, install it into a fresh prefix
# with a real solver, build the GPU check against it (tests/gpu/CMakeLists.txt) and run it.
#
#   tests/gpu/run_gpu_check.sh MAGMA_SOURCE [ARCH_LIST] [CUDA] [OUT]
#
# MAGMA_SOURCE: a MAGMA tree or tarball (e.g. ../shared/sources/magma-2.6.1-generated.tar.gz; for MAGMA 2.10.0 set
# PYTORCH=2.13.0: the magma package is planned for a PyTorch release whose source accepts it); ARCH_LIST: the
# GPU's arch ("9.0" for an H100); CUDA: the toolkit's X.Y (13.0), which must have cuBLAS and cuSPARSE
# (`torchforge doctor --magma-only` checks). Needs torchforge installed (pip install -e . with py-rattler and
# py-rattler-build), cmake, gcc and a LAPACK (OpenBLAS) for the check program. Prints the build time, the
# checks' residuals and GFLOP/s; exits non-zero if the build or any check fails. MAGMA_CHECK_ONLY=1 skips doctor
# and the build (the package is already in OUT/channel); MAGMA_CHECK_CMAKE_ARGS is added to the check's cmake.
set -euo pipefail
source="${1:?usage: $0 MAGMA_SOURCE [ARCH_LIST] [CUDA] [OUT]}"
arch="${2:-9.0}"
cuda="${3:-13.0}"
out="${4:-${TMPDIR:-/tmp}/torchforge-gpu-check}"
here="$(cd "$(dirname "$0")" && pwd)"
export CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
jobs="$(nproc)"
pytorch="${PYTORCH:-2.9.0}"

if [ -z "${MAGMA_CHECK_ONLY:-}" ]; then  # MAGMA_CHECK_ONLY=1: the package is already in OUT/channel
torchforge doctor --magma-only --pytorch "$pytorch" --cuda "$cuda" --arch-list "$arch" --out "$out/channel"
start=$(date +%s)
torchforge build --magma-only --pytorch "$pytorch" --py 3.12 --cuda "$cuda" --arch-list "$arch" --magma-source "$source" \
  --engine rattler-build --jobs "$jobs" --out "$out/channel"
echo "torchforge build: $(( $(date +%s) - start )) s with --jobs $jobs"
fi

# A fresh prefix, solved and installed by py-rattler from the channel (nothing on LD_LIBRARY_PATH).
python3 - "$out/channel" "$out/prefix" "$cuda" <<'PY'
import asyncio, sys
import rattler
channel, prefix, cuda = sys.argv[1:]
name = "magma-cuda" + cuda.replace(".", "")
records = asyncio.run(rattler.solve([channel], [name], platforms=["linux-64", "noarch"]))
asyncio.run(rattler.install(records, target_prefix=prefix, show_progress=False))
print("installed", ", ".join(f"{r.name.normalized}-{r.version}-{r.build}" for r in records), "into", prefix)
PY
ls -l "$out/prefix/lib/libmagma.a"
cuobjdump="$CUDA_HOME/bin/cuobjdump"
if [ -x "$cuobjdump" ]; then
  echo "SASS in libmagma.a: $("$cuobjdump" --list-elf "$out/prefix/lib/libmagma.a" | sed -n 's/.*\.\(sm_[0-9a-z]*\)\.cubin$/\1/p' | sort | uniq -c | tr '\n' ' ')"
  echo "PTX entries: $("$cuobjdump" --list-ptx "$out/prefix/lib/libmagma.a" 2>/dev/null | grep -c 'PTX file' || true)"
fi

MAGMA_HOME="$out/prefix" cmake -S "$here" -B "$out/check" -DCUDAToolkit_ROOT="$CUDA_HOME" -DCMAKE_BUILD_TYPE=Release ${MAGMA_CHECK_CMAKE_ARGS:-}
cmake --build "$out/check" -j "$jobs"
"$out/check/magma_gpu_check"
