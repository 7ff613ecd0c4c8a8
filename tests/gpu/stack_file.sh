#!/usr/bin/env bash
# The stack file's GPU run (issue 39): tests/gpu/stack.toml (the machine's torch 2.11.0+cu130 stack as wheel files,
# causal-conv1d 1.7.0 and mamba-ssm 2.3.2.post1 from their sdists, arch list 9.0 once) built with
# `torchforge build --stack`, installed with `install --stack` into a fresh prefix, checked with `verify --stack`
# and on the GPU, with LD_LIBRARY_PATH empty. Four chained device calls on one warm machine (each within 30 s of
# the last: /tmp and the compile cache stay); what each carries (the checkout itself is ~7 MB):
#
#   call 1  carry [".cache/wheels312"] (32 MiB)      bash tests/gpu/stack_file.sh tools     (~150 s)
#           torchforge's cp312 dependencies but py-rattler-build into /tmp/stack-gpu/tools; the machine's stack
#           rebuilt as wheels (rebuild_wheels.py); tests/gpu/stack_file.py prepare: the repack, the stand-in
#           channel, the metadata venv; `doctor --stack` (printed, not fatal)
#   call 2  carry [".cache/wheels312-rb"] (27 MiB)   bash tests/gpu/stack_file.sh build     (returns by ~570 s)
#           py-rattler-build; `torchforge build --stack` started in its own session (setsid: it outlives the
#           call while the machine stays warm), then followed until it ends or the call's time is nearly spent
#   call 3  carry []                                 bash tests/gpu/stack_file.sh wait      (only if call 2 ran out)
#   call 4  carry []                                 bash tests/gpu/stack_file.sh check     (~120 s)
#           `install --stack` into a fresh prefix, `verify --stack`, the GPU checks (torchvision's roi_align, nms,
#           deform_conv2d; causal_conv1d_fn; selective_scan_fn and a Mamba block), cuobjdump of every library
#           the stack built (sm_90 only)
#
# Each call writes $OUT/stack_file-STEP.txt. BUILD_FLAGS adds flags to `build --stack` (e.g. --skip-preflight if
# call 1's doctor shows a check that cannot pass there). Stand-ins, and why: the machine has no conda-forge, so
# [channels] next_to is WORK/standin: python links to the machine's interpreter, the pure-Python requirements
# (transformers, einops, packaging, ninja ...) are carried with their real files from the image's site-packages,
# and tilelang, apache-tvm-ffi and quack-kernels (mamba-ssm's install_requires; 44 MB of wheels for tilelang
# alone, and imported only inside `try:`) are empty stand-ins.
set -uo pipefail
step="${1:?usage: $0 tools|build|wait|check}"
src="$(cd "$(dirname "$0")/../.." && pwd)"
out="${OUT:-/tmp/stack-gpu-out}"
work=/tmp/stack-gpu
mkdir -p "$out" "$work"
PY=/opt/torch/.venv/bin/python3
[ -x "$PY" ] || PY="$(command -v python3)"
site="$($PY -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
export PYTHONUNBUFFERED=1 XDG_CACHE_HOME="$work/cache" PYTHONPATH="$src:$work/tools" PATH="$work/tools/bin:$PATH"
nvcc_path="$(readlink -f "$(command -v nvcc)")"
CUDA_HOME="$(dirname "$(dirname "$nvcc_path")")"; export CUDA_HOME
export PATH="$CUDA_HOME/bin:$PATH"
tf() { $PY -c 'import sys; from torchforge.cli import main; sys.exit(main(sys.argv[1:]))' "$@"; }
stamp() { echo "[$(date +%T)] $*"; }
cd "$src" || exit 2

follow() {  # the background build's log until it ends or $1 seconds have passed; its exit code if it ended
  local deadline=$(( $(date +%s) + $1 ))
  while [ ! -f "$work/build-rc" ] && [ "$(date +%s)" -lt "$deadline" ]; do sleep 10; done
  tail -c 6000 "$work/build.txt"
  echo "disk: peak $(( $(cat "$work/disk-kib" 2>/dev/null || echo 0) / 1024 )) MiB used over the build's start at $work"
  if [ -f "$work/build-rc" ]; then echo "build --stack exit $(cat "$work/build-rc") after $(cat "$work/build-seconds") s"
  else echo "build --stack still running: call 'wait' next"; fi
}

{
case "$step" in
tools)
  stamp "tools"; $PY -m pip install -q --no-index --no-deps --no-compile --target "$work/tools" .cache/wheels312/*.whl || exit 3
  nvidia-smi -L; $PY -c 'import torch; print("pip env:", torch.__version__, torch.version.cuda)'
  echo "nvcc $nvcc_path ($("$nvcc_path" --version | tail -2 | head -1)); CUDA_HOME=$CUDA_HOME; cuobjdump $(command -v cuobjdump); $(nproc) cores"
  stamp "rebuild wheels"; $PY tests/gpu/rebuild_wheels.py "$work/wheels" torch torchvision torchaudio | tail -4
  stamp "prepare"; $PY tests/gpu/stack_file.py prepare "$work" --torch-python "$PY" --site "$site" || exit 4
  stamp "doctor --stack"; tf doctor --stack "$work/stack.toml"; echo "doctor exit $?"
  ;;
build)
  stamp "py-rattler-build"; $PY -m pip install -q --no-index --no-deps --no-compile --target "$work/tools" .cache/wheels312-rb/*.whl || exit 3
  rm -f "$work/build-rc" "$work/disk-kib"
  # the build's disk use: the file system's used KiB sampled every 5 s, its peak over the start (preflight.toml [disk])
  setsid bash -c "base=\$(df -k --output=used $work | tail -1); peak=\$base; while [ ! -f $work/build-rc ]; do \
    used=\$(df -k --output=used $work | tail -1); [ \$used -gt \$peak ] && peak=\$used; \
    echo \$(( peak - base )) > $work/disk-kib; sleep 5; done" < /dev/null > /dev/null 2>&1 &
  stamp "build --stack (in its own session)"
  setsid bash -c "start=\$(date +%s); cd $src; $PY -c 'import sys; from torchforge.cli import main; sys.exit(main(sys.argv[1:]))' \
    build --stack $work/stack.toml --engine rattler-build ${BUILD_FLAGS:-} > $work/build.txt 2>&1; rc=\$?; \
    echo \$(( \$(date +%s) - start )) > $work/build-seconds; echo \$rc > $work/build-rc" < /dev/null > /dev/null 2>&1 &
  follow 540
  ;;
wait)
  follow 570
  ;;
check)
  [ "$(cat "$work/build-rc" 2>/dev/null)" = 0 ] || { echo "build --stack did not finish well"; tail -c 3000 "$work/build.txt"; exit 5; }
  cat "$work/stack.lock" | grep -E '^(name|file|arch) ' | paste - - - | sed 's/  */ /g'
  rm -rf "$work/prefix"
  stamp "install --stack"; tf install --stack "$work/stack.toml" --prefix "$work/prefix" | tail -3; echo "install exit ${PIPESTATUS[0]}"
  stamp "verify --stack"; env LD_LIBRARY_PATH= "$PY" -c 'import sys; from torchforge.cli import main; sys.exit(main(sys.argv[1:]))' \
    verify "$work/prefix" --stack "$work/stack.toml" --want cuda; echo "verify exit $?"
  for check in torchvision_ops_check causal_conv1d_check mamba_ssm_check; do
    stamp "$check"
    env -i PATH=/usr/bin:/bin HOME="$work" LD_LIBRARY_PATH= "$work/prefix/bin/python" \
      "$src/tests/gpu/extension_checks/$check.py" --cuda; echo "$check exit $?"
  done
  stamp "cuobjdump of the libraries the stack built"
  for package in "$work"/channel/linux-64/causal-conv1d-*.conda "$work"/channel/linux-64/mamba-ssm-*.conda; do
    rm -rf "$work/unpacked" && mkdir -p "$work/unpacked"
    $PY -c 'import sys; from pathlib import Path; from torchforge.safeextract import extract_conda; extract_conda(Path(sys.argv[1]), Path(sys.argv[2]))' "$package" "$work/unpacked"
    find "$work/unpacked" -name '*.so' | while read -r library; do
      echo "$(basename "$package") $(basename "$library"): SASS $(cuobjdump --list-elf "$library" 2>/dev/null | grep -o 'sm_[0-9]*[af]*' | sort -u | tr '\n' ' ')PTX $(cuobjdump --list-ptx "$library" 2>/dev/null | grep -o 'sm_[0-9]*[af]*' | sort -u | tr '\n' ' ')"
    done
  done
  ;;
esac
stamp "done"
} 2>&1 | tee "$out/stack_file-$step.txt" | tail -c 11000
