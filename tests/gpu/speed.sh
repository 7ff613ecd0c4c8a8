#!/usr/bin/env bash
# Issue 42 on the lent H200 (16 cores), in two warm device calls (the second within 30 s of the first):
#   0. bash tests/gpu/tools.sh                                       (carry [".cache/wheels312-rb"]: py-rattler-build)
#   1. TOOL_WHEELS=.cache/wheels312 bash tests/gpu/speed.sh builds     (carry [".cache/wheels312"]; ~8 min)
#      mamba-ssm 2.3.2.post1 from its sdist for sm_90 (tests/kernel_stack.py, the machine's torch 2.11.0+cu130
#      stack repacked as kernel_stack.sh does) into two clean work folders (each its own output folder and empty
#      local compile cache), both through one HTTP cache server on the loopback (tests/test_remote_cache.py's
#      store: GET/HEAD/PUT); MAX_JOBS chosen per build from memory and mamba-ssm's per-job peak. Reported: each
#      build's time, the second's hit rate from the server, the first's planned jobs and peak memory.
#      Then `torchforge verify` of runner 1's prefix (issue 41: the mamba-ssm probe on the GPU).
#   1b. TOOL_WHEELS=.cache/wheels312 bash tests/gpu/speed.sh probes    (carry [".cache/wheels312"]; ~8 min)
#      causal-conv1d 1.7.0 from its sdist for sm_90 against the channel phase 1 made (made here on a fresh machine,
#      after call 0), its check, then verify.
#   2. TOOL_WHEELS=.cache/wheels312 bash tests/gpu/speed.sh repack     (carry [".cache/wheels312"]; ~3 min)
#      `python -m bench repack` on the machine's stack (goal: at most 1.5x the floor), the load before and after;
#      the timelines of both repacks (chosen, plain) land in $OUT/repack-timeline*.txt.
#   3. TOOL_WHEELS=.cache/wheels312 bash tests/gpu/speed.sh compress   (carry [".cache/wheels312"]; ~2 min)
#      where the pytorch package's own time goes (the repack's tail): tests/gpu/compress_probe.py times its parts
#      alone with every core (unpack, RPATH, the bare zstd stream, the writer, the hashing), then one_package.py
#      builds it alone with its steps' timeline.
# Everything also lands in $OUT/speed-<phase>.txt and the builds' logs in $OUT.
set -uo pipefail
phase="${1:-builds}"
# shellcheck source=tests/gpu/lib.sh
. "$(dirname "$0")/lib.sh"  # $src, $tool_wheels, $PY, $site, stamp
out="${OUT:-/tmp/speed-out}"
work=/tmp/speed
mkdir -p "$out" "$work"
cd "$src" || exit 2
stamp() { echo "[$(date +%T)] $* (load $(cut -d' ' -f1-3 /proc/loadavg))"; }  # lib.sh's, with the load
verify_prefix() {  # `torchforge verify` of a kernel_stack prefix from a clean venv, LD_LIBRARY_PATH empty
  [ -x "$work/venv/bin/python" ] || clean_venv "$work"
  stamp "verify $1"
  env LD_LIBRARY_PATH= COLUMNS=250 $PY -c 'import sys; from torchforge.cli import main; sys.exit(main(sys.argv[1:]))' \
    verify "$1" --python "$work/venv/bin/python" --want cuda --timeout 300
  echo "verify exit $? ($1)"
}
{
  stamp "tools"
  [ -d "$gpu_tools/pydantic" ] || install_tools "$gpu_tools" || exit 3
  export PYTHONPATH="$src:$gpu_tools" PATH="$gpu_tools/bin:$PATH"
  nvcc_path="$(readlink -f "$(command -v nvcc)")"
  CUDA_HOME="$(dirname "$(dirname "$nvcc_path")")"; export CUDA_HOME
  echo "$(nproc) cores, $(free -g | awk '/Mem:/ {print $7}') GiB available; ccache $(ccache --version | head -1)"
  if [ "$phase" = builds ]; then
    stamp "rebuild wheels"; [ -d "$work/wheels" ] || $PY "$src/tests/gpu/rebuild_wheels.py" "$work/wheels" torch | tail -3
    stamp "repack"
    [ -d "$work/chan" ] || $PY -c 'import sys; from torchforge.cli import main; sys.exit(main(sys.argv[1:]))' \
      repack "$work"/wheels/*.whl --cuda-libs wheels --out "$work/chan" --zstd-level 1 | tail -4
    # The cache server: tests/test_remote_cache.py's store, on a free loopback port, for the two builds.
    url_file="$work/cache-url"; rm -f "$url_file"
    $PY -c "
import sys, time
from tests.test_remote_cache import serve
with serve() as (url, store):
    open('$url_file', 'w').write(url)
    while True:
        time.sleep(1)
" & server=$!
    for _ in $(seq 50); do [ -s "$url_file" ] && break; sleep 0.1; done
    export KERNEL_STACK_CACHE_URL; KERNEL_STACK_CACHE_URL="$(cat "$url_file")"
    echo "cache server $KERNEL_STACK_CACHE_URL (pid $server)"
    for runner in 1 2; do
      rm -rf "$work/k$runner"
      stamp "mamba-ssm build, runner $runner (clean output folder and local cache)"
      KERNEL_STACK_GPU=1 $PY -m tests.kernel_stack "$work/chan" "$work/k$runner" --site "$site" --torch-python "$PY" \
        --arch-list 9.0 --source "$src/tests/fixtures/sdists/mamba_ssm-2.3.2.post1.tar.gz" \
        --check "$src/tests/gpu/extension_checks/mamba_ssm_check.py"
      echo "kernel_stack exit $? (runner $runner)"
      for log in "$work/k$runner"/out/logs/*.log; do
        grep -h "^torchforge: \(MAX_JOBS\|peak memory\|compile cache\|warning\|out of memory\)" "$log" | cut -c1-600
        cp "$log" "$out/runner$runner-$(basename "$log")"
      done
      # issue 41: verify's extension probes on the GPU, mamba-ssm's selective_scan_fn among them
      [ "$runner" = 1 ] && verify_prefix "$work/k1/prefix"
    done
    kill "$server"
  elif [ "$phase" = probes ]; then
    # causal-conv1d 1.7.0 for sm_90 against the stack the builds phase repacked (same warm machine), then verify
    # the builds phase's channel where this warm machine has it, else made here (rebuild and repack: ~1 min)
    [ -d "$work/wheels" ] || $PY "$src/tests/gpu/rebuild_wheels.py" "$work/wheels" torch | tail -3
    [ -d "$work/chan" ] || $PY -c 'import sys; from torchforge.cli import main; sys.exit(main(sys.argv[1:]))' \
      repack "$work"/wheels/*.whl --cuda-libs wheels --out "$work/chan" --zstd-level 1 | tail -4
    rm -rf "$work/kc"
    stamp "causal-conv1d build"
    KERNEL_STACK_GPU=1 $PY -m tests.kernel_stack "$work/chan" "$work/kc" --site "$site" --torch-python "$PY" \
      --arch-list 9.0 --source "$src/tests/fixtures/sdists/causal_conv1d-1.7.0.tar.gz" \
      --check "$src/tests/gpu/extension_checks/causal_conv1d_check.py" | tail -30
    echo "kernel_stack exit ${PIPESTATUS[0]}"
    verify_prefix "$work/kc/prefix"
  elif [ "$phase" = compress ]; then
    stamp "rebuild the stack's wheels"
    [ -d "$work/stack-wheels" ] || $PY "$src/tests/gpu/rebuild_wheels.py" "$work/stack-wheels" torch torchvision torchaudio | tail -3
    stamp "compress probe (pytorch)"
    $PY "$src/tests/gpu/compress_probe.py" "$work/stack-wheels" torch
    stamp "one package alone (pytorch)"
    $PY "$src/tests/gpu/one_package.py" "$work/stack-wheels" torch
  else
    # the machine's whole stack (torch, torchvision, torchaudio and what they require) as wheels, for the bench
    stamp "rebuild the stack's wheels"
    [ -d "$work/stack-wheels" ] || $PY "$src/tests/gpu/rebuild_wheels.py" "$work/stack-wheels" torch torchvision torchaudio | tail -3
    stamp "bench repack (before)"
    BENCH_STACK_WHEELS="$work/stack-wheels" BENCH_TIMELINE="$out/repack-timeline.txt" $PY -m bench repack
    stamp "bench repack (after)"
  fi
  stamp "done"
} 2>&1 | tee "$out/speed-$phase.txt" | tail -c 11000
