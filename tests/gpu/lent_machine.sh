#!/usr/bin/env bash
# The GPU checks as run on the lent H100 (device tool: 10 minutes a call, 64 MiB carried, the machine given back
# 30 s after a call), in two calls that share /tmp while the machine stays warm:
#
#   call 1 (carry .whl .gpu):  tests/gpu/lent_machine.sh start   # install, probe, magma build in the background,
#                                                                 # real cuDNN bundle check meanwhile
#   call 2 (carry .gpu2):      tests/gpu/lent_machine.sh finish  # wait for magma, install it, GPU check program
#
# The compile cache on real MAGMA (docs/compile-cache.md), in one call (the cp312 wheels, 58 MiB, the MAGMA
# source as .tar.xz, 2 MiB, and torchforge fit in the 64 MiB carried):
#
#   tests/gpu/lent_machine.sh cache     # MAGMA_SOURCE cold, then warm from the same cache (--force), 14 jobs
#   tests/gpu/lent_machine.sh collect   # (no carry) if that call ran out of time before the warm build ended
#
# WHEELS names the wheels' folder (default .whl).
set -uo pipefail
step="${1:?usage: $0 start|finish|cache|collect}"
out="${OUT:-/tmp/gpu-out}"
work=/tmp/gpu
mkdir -p "$out" "$work"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/bin:/tmp/site/bin:$PATH
repo=$PWD
pytorch="${PYTORCH:-2.9.0}"  # 2.13.0 plans MAGMA 2.10.0
magma_source="${MAGMA_SOURCE:-$repo/.gpu/magma-2.6.1.tar.xz}"
site_packages="$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"

# A CUDA_HOME that holds the toolkit and NVIDIA's pip-installed libraries (cuBLAS, cuSPARSE come as wheels there):
# every entry linked, the toolkit's first, and the unversioned .so names CMake's find_library looks for.
merged_cuda_home() {
  local toolkit dest=/tmp/cuda entry name
  toolkit="$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")"
  rm -rf "$dest" && mkdir -p "$dest/include" "$dest/lib64"
  # bin is copied, not linked: nvcc finds TOP (include, lib64 of nvcc.profile) from where its binary really is
  cp -a "$toolkit/bin" "$dest/bin"
  for entry in nvvm targets share extras; do [ -e "$toolkit/$entry" ] && ln -s "$toolkit/$entry" "$dest/$entry"; done
  for entry in "$toolkit"/include/* "$site_packages"/nvidia/*/include/*; do
    [ -e "$dest/include/$(basename "$entry")" ] || ln -s "$entry" "$dest/include/"
  done
  for entry in "$toolkit"/lib64/* "$site_packages"/nvidia/*/lib/*; do
    [ -e "$dest/lib64/$(basename "$entry")" ] || ln -s "$entry" "$dest/lib64/"
  done
  for entry in "$dest"/lib64/lib*.so.[0-9]*; do
    name="${entry##*/}"; name="${name%%.so.*}.so"
    [ -e "$dest/lib64/$name" ] || ln -s "$entry" "$dest/lib64/$name"
  done
  ln -s lib64 "$dest/lib"
  echo "$dest"
}

install_wheels() {
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "${WHEELS:-.whl}"/*.whl || exit 3
  mkdir -p /tmp/bin
  printf '#!/bin/sh\nexec python3 -c "import sys; from torchforge.cli import main; sys.exit(main(sys.argv[1:]))" "$@"\n' \
    > /tmp/bin/torchforge && chmod +x /tmp/bin/torchforge
}

# MAGMA built twice into one channel and compile cache (the second with --force), each timed, in the background
# (setsid: it outlives the call while the machine stays warm); ccache's own counters are zeroed between the two.
cache_builds() {
  local channel="$work/cache-channel" label start
  rm -rf "$channel" "$work/cache-done" && mkdir -p "$work/cache"
  for label in cold warm; do
    start=$(date +%s)
    torchforge build --magma-only --pytorch "$pytorch" --py 3.12 --cuda 13.0 --arch-list 9.0 \
      --magma-source "$magma_source" --engine rattler-build --jobs "${JOBS:-14}" --skip-preflight --force \
      --out "$channel" > "$work/cache/$label-build.txt" 2>&1
    echo "$label rc $? seconds $(( $(date +%s) - start ))" >> "$work/cache/times.txt"
    cp "$channel"/logs/magma-*.log "$work/cache/$label-log.txt"
    ccache --dir "$(ls -d "$channel"/.cache/compile/magma-*)" --show-stats --verbose > "$work/cache/$label-ccache.txt" 2>&1
    ccache --dir "$(ls -d "$channel"/.cache/compile/magma-*)" --zero-stats > /dev/null 2>&1
    mkdir -p "$work/cache/$label-pkg" && cp "$channel"/linux-64/magma-*.conda "$work/cache/$label-pkg/"
  done
  touch "$work/cache-done"
}

# The two packages' payloads compared file by file (info/ holds what every build changes: timestamps, paths).
compare_payloads() {
  python3 - "$work/cache" <<'PY' > "$out/payloads.txt" 2>&1
import hashlib, sys
from pathlib import Path
from rattler.package_streaming import extract
root = Path(sys.argv[1])
trees = {}
for label in ("cold", "warm"):
    (package,) = (root / f"{label}-pkg").glob("*.conda")
    extract(str(package), str(root / f"{label}-tree"))
    tree = root / f"{label}-tree"
    trees[label] = {p.relative_to(tree).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
                    for p in tree.rglob("*") if p.is_file()}
    print(label, package.name, len(trees[label]), "files")
payload = {label: {k: v for k, v in files.items() if not k.startswith("info/")} for label, files in trees.items()}
print("payload files equal:", payload["cold"] == payload["warm"], sorted(payload["cold"]))
print("info/ files that differ:", sorted(k for k in trees["cold"] if trees["cold"][k] != trees["warm"].get(k)))
PY
}

collect() {
  cp "$work/cache/"*.txt "$out/" 2>/dev/null
  [ -e "$work/cache-done" ] && compare_payloads
  cat "$work/cache/times.txt" 2>/dev/null
  grep -h "torchforge: compile cache" "$work/cache/"*-log.txt 2>/dev/null
  grep -h -A3 "build results" -A6 "$work/cache/"*-build.txt 2>/dev/null | cut -c1-400
}

case "$step" in
cache)
  install_wheels
  { nproc; nvcc --version | tail -2; cmake --version | head -1; command -v ccache make ninja; } > "$out/probe.txt" 2>&1
  export CUDA_HOME
  CUDA_HOME="$(merged_cuda_home)"
  export -f cache_builds
  export work pytorch magma_source CUDA_HOME
  setsid bash -c cache_builds < /dev/null > "$work/cache-driver.txt" 2>&1 &
  # wait inside the call's 600 s (the wheels' install came first), then report what is there
  while [ ! -e "$work/cache-done" ] && [ "$SECONDS" -lt 540 ]; do sleep 5; done
  collect
  ;;
collect)
  for _ in $(seq 1 78); do [ -e "$work/cache-done" ] && break; sleep 7; done
  collect
  ;;
start)
  install_wheels
  {
    nvidia-smi -L; nvcc --version | tail -2; gcc --version | head -1; cmake --version | head -1
    command -v make ninja patchelf ccache
    python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda, torch.backends.cudnn.version())'
    ls "$site_packages/nvidia" "$site_packages"/nvidia/*/lib | head -80
    find / -xdev -name cublas_v2.h 2>/dev/null | head
    ldconfig -p | grep -E 'lapack|blas|libz\.so' | head
  } > "$out/probe.txt" 2>&1
  export CUDA_HOME
  CUDA_HOME="$(merged_cuda_home)"
  echo "CUDA_HOME=$CUDA_HOME" >> "$out/probe.txt"
  rm -f "$work/magma-rc" "$work/magma-seconds"
  # magma in the background (setsid: it outlives this call while the machine stays warm), timed
  setsid bash -c "start=\$(date +%s); torchforge build --magma-only --pytorch $pytorch --py 3.12 --cuda 13.0 \
    --arch-list 9.0 --magma-source $magma_source --engine rattler-build --jobs $(nproc) \
    --skip-preflight --out $work/channel > $work/magma-build.txt 2>&1; echo \$? > $work/magma-rc; \
    echo \$(( \$(date +%s) - start )) > $work/magma-seconds" < /dev/null > /dev/null 2>&1 &
  torchforge doctor --magma-only --pytorch "$pytorch" --cuda 13.0 --arch-list 9.0 --out "$work/doctor-channel" \
    > "$out/doctor.txt" 2>&1
  echo "doctor exit $?" >> "$out/doctor.txt"
  # meanwhile: the real cuDNN through the pytorch recipe's bundling step (CPU-light)
  python3 tests/gpu/real_cudnn_bundle.py --cudnn-dir "$site_packages/nvidia/cudnn/lib" \
    --cusparselt-dir "$(dirname "$(ls "$site_packages"/nvidia/*/lib/libcusparseLt.so.0 | head -1)")" \
    --out "$out" > "$out/cudnn.txt" 2>&1
  echo "real_cudnn_bundle exit $?" >> "$out/cudnn.txt"
  # stay inside the call limit, then hand over to `finish`
  for _ in $(seq 1 60); do [ -e "$work/magma-rc" ] && break; sleep 7; done
  cp "$work/magma-build.txt" "$out/" 2>/dev/null
  tail -c 3000 "$work/channel/logs/"magma-*.log > "$out/magma-log-tail.txt" 2>/dev/null
  echo "magma rc: $(cat "$work/magma-rc" 2>/dev/null || echo running) after $(cat "$work/magma-seconds" 2>/dev/null) s"
  ;;
finish)
  for _ in $(seq 1 55); do [ -e "$work/magma-rc" ] && break; sleep 7; done
  echo "magma rc: $(cat "$work/magma-rc" 2>/dev/null || echo running) after $(cat "$work/magma-seconds" 2>/dev/null) s"
  cp "$work/magma-build.txt" "$out/" 2>/dev/null
  tail -c 6000 "$work/channel/logs/"magma-*.log > "$out/magma-log-tail.txt" 2>/dev/null
  [ "$(cat "$work/magma-rc" 2>/dev/null)" = 0 ] || exit 6
  mkdir -p /tmp/lapack && for deb in .gpu2/*.deb; do dpkg -x "$deb" /tmp/lapack; done
  lapack="$(ls /tmp/lapack/usr/lib/x86_64-linux-gnu/lapack/liblapack.so.3* | head -1)"
  blas="$(ls /tmp/lapack/usr/lib/x86_64-linux-gnu/blas/libblas.so.3* | head -1)"
  export LD_LIBRARY_PATH=/tmp/lapack/usr/lib/x86_64-linux-gnu  # libgfortran for the CHECK program only
  MAGMA_CHECK_CMAKE_ARGS="-DCHECK_LAPACK_LIBRARIES=$lapack;$blas" CUDA_HOME=/tmp/cuda \
    MAGMA_CHECK_ONLY=1 PYTORCH="$pytorch" tests/gpu/run_gpu_check.sh "$magma_source" 9.0 13.0 "$work" \
    2>&1 | tee "$out/magma-check.txt"
  exit "${PIPESTATUS[0]}"
  ;;
*) echo "usage: $0 start|finish|cache|collect" >&2; exit 2 ;;
esac
