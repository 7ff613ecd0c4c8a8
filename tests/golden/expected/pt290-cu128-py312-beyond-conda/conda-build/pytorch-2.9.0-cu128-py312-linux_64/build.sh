#!/usr/bin/env bash
# Rendered by torchforge 0.1.0 for pytorch-2.9.0-cu128-py312-linux_64 (buildable). Re-render instead of editing.
# Shared by meta.yaml (conda-build) and recipe.yaml (rattler-build); both set PREFIX, SP_DIR, PYTHON,
# PKG_VERSION, PKG_BUILDNUM, RECIPE_DIR, SRC_DIR and CPU_COUNT.
set -euxo pipefail

export CMAKE_PREFIX_PATH="$PREFIX"
export CMAKE_LIBRARY_PATH="$PREFIX/lib:$PREFIX/include"
export PYTORCH_BUILD_VERSION="$PKG_VERSION"
export PYTORCH_BUILD_NUMBER="$PKG_BUILDNUM"
export TH_BINARY_BUILD=1
export USE_NINJA=OFF
export INSTALL_TEST=0
export PACKAGE_TYPE=conda
export MAX_JOBS="${MAX_JOBS:-$CPU_COUNT}"
export USE_GLOO_WITH_OPENSSL=0
export CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
export USE_CUDA=1
export TORCH_NVCC_FLAGS='-Xfatbin -compress-all'
export USE_STATIC_NCCL=1
export NCCL_ROOT_DIR="$CUDA_HOME"
export USE_NVSHMEM=0
export _GLIBCXX_USE_CXX11_ABI=1
export TORCH_CUDA_ARCH_LIST='7.0;7.5;8.0;8.6;9.0;10.0;12.0'
export USE_STATIC_CUDNN=0
export USE_CUSPARSELT=1

# torchforge's compile cache: setuptools' and ninja's compiles go through ccache too (torchforge/compilecache.py)
if [ -n "${TORCHFORGE_COMPILERS:-}" ]; then . "$TORCHFORGE_COMPILERS/route.sh"; fi

"$PYTHON" -m pip install . --no-deps --no-build-isolation -vv

# Bundled libraries, as the official recipe did: each is copied into torch/lib, renamed
# <stem>-<first 8 hex of sha256>.<rest> unless it is looked up by name, and every DT_NEEDED entry naming the
# original is rewritten to the copy. The RPATH step below gives the copies $ORIGIN.
# Source: torchforge: the 2.5 rule (release/2.5:conda/pytorch-nightly/build.sh:59-67) without CUPTI
bundle_library() {
  local var=$1 src=$2 name new so
  if [ ! -e "$src" ]; then
    echo "torchforge: $src not found; point $var at the directory that holds it" >&2
    exit 1
  fi
  name=$(basename "$src")
  case "$name" in
    libcudnn*|libnvrtc-builtins.so) new=$name ;;
    *) new="${name%%.*}-$(sha256sum "$src" | cut -c1-8).${name#*.}" ;;
  esac
  cp -L "$src" "$SP_DIR/torch/lib/$new"
  echo "torchforge: bundled $src as torch/lib/$new"
  if [ "$new" != "$name" ]; then
    find "$SP_DIR/torch" -name '*.so*' -type f -print0 | while IFS= read -r -d '' so; do
      if grep -qxF "$name" <<<"$(patchelf --print-needed "$so")"; then
        patchelf --replace-needed "$name" "$new" "$so"
      fi
    done
  fi
}
for src in "${CUDNN_LIB_DIR:-$CUDA_HOME/lib64}"/libcudnn*.so.9; do
  bundle_library CUDNN_LIB_DIR "$src"
done
for src in "${CUSPARSELT_LIB_DIR:-$CUDA_HOME/lib64}"/libcusparseLt.so.0; do
  bundle_library CUSPARSELT_LIB_DIR "$src"
done

# RPATH, official rules (pytorch/builder conda build.sh): DT_RPATH (--force-rpath) so the environment's
# lib/ is found before LD_LIBRARY_PATH; torchforge audits the result after the build.
find "$SP_DIR/torch" -maxdepth 1 -name '*.so*' -type f -print0 | while IFS= read -r -d '' so; do
  patchelf --set-rpath '$ORIGIN:$ORIGIN/lib:$ORIGIN/../../..' --force-rpath "$so"
done
find "$SP_DIR/torch/lib" -maxdepth 1 -name '*.so*' -type f -print0 | while IFS= read -r -d '' so; do
  patchelf --set-rpath '$ORIGIN:$ORIGIN/../../../..' --force-rpath "$so"
done

# The build string names cuDNN 91002 (cudnnGetVersion): the bundled copy must be that one
# (read after the RPATH step, so its own sub-libraries resolve).
"$PYTHON" - "$SP_DIR/torch/lib/libcudnn.so.9" 91002 <<'TORCHFORGE_CUDNN_CHECK'
import ctypes, sys
try:
    library = ctypes.CDLL(sys.argv[1])
except OSError as exc:  # nothing to compare on a machine where it cannot load; the audit still runs
    print(f"torchforge: cannot load {sys.argv[1]} to read its version: {exc}", file=sys.stderr)
    sys.exit(0)
library.cudnnGetVersion.restype = ctypes.c_size_t
found = library.cudnnGetVersion()
if found != int(sys.argv[2]):
    sys.exit(f"torchforge: the bundled cuDNN reports version {found}, the build string names {sys.argv[2]}; "
             "point CUDNN_LIB_DIR at that cuDNN")
TORCHFORGE_CUDNN_CHECK
