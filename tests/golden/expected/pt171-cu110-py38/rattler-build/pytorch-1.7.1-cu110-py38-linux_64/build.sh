#!/usr/bin/env bash
# Rendered by torchforge 0.1.0 for pytorch-1.7.1-cu110-py38-linux_64 (official). Re-render instead of editing.
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
export MAX_JOBS="${MAX_JOBS:-$CPU_COUNT}"
export CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
export USE_CUDA=1
export TORCH_NVCC_FLAGS='-Xfatbin -compress-all'
export USE_STATIC_NCCL=1
export NCCL_ROOT_DIR="$CUDA_HOME"
export _GLIBCXX_USE_CXX11_ABI=0
export TORCH_CUDA_ARCH_LIST='3.7+PTX;5.0;6.0;6.1;7.0;7.5;8.0'
export USE_STATIC_CUDNN=1

# torchforge's compile cache: setuptools' and ninja's compiles go through ccache too (torchforge/compilecache.py)
if [ -n "${TORCHFORGE_COMPILERS:-}" ]; then . "$TORCHFORGE_COMPILERS/route.sh"; fi

"$PYTHON" setup.py install

# RPATH, official rules (pytorch/builder conda build.sh): DT_RPATH (--force-rpath) so the environment's
# lib/ is found before LD_LIBRARY_PATH; torchforge audits the result after the build.
find "$SP_DIR/torch" -maxdepth 1 -name '*.so*' -type f -print0 | while IFS= read -r -d '' so; do
  patchelf --set-rpath '$ORIGIN:$ORIGIN/lib:$ORIGIN/../../..' --force-rpath "$so"
done
find "$SP_DIR/torch/lib" -maxdepth 1 -name '*.so*' -type f -print0 | while IFS= read -r -d '' so; do
  patchelf --set-rpath '$ORIGIN:$ORIGIN/../../../..' --force-rpath "$so"
done
