#!/usr/bin/env bash
# Rendered by torchforge 0.1.0 for pytorch-2.2.2-cpu-py310-osx_64 (official). Re-render instead of editing.
# Shared by meta.yaml (conda-build) and recipe.yaml (rattler-build); both set PREFIX, SP_DIR, PYTHON,
# PKG_VERSION, PKG_BUILDNUM, RECIPE_DIR, SRC_DIR and CPU_COUNT.
set -euxo pipefail

export CMAKE_PREFIX_PATH="$PREFIX"
export CMAKE_LIBRARY_PATH="$PREFIX/lib:$PREFIX/include"
export PYTORCH_BUILD_VERSION="$PKG_VERSION"
export PYTORCH_BUILD_NUMBER="$PKG_BUILDNUM"
export TH_BINARY_BUILD=1
export INSTALL_TEST=0
export MAX_JOBS="${MAX_JOBS:-$CPU_COUNT}"
export USE_CUDA=0
export CC=clang
export CXX=clang++
export USE_DISTRIBUTED=1
export MACOSX_DEPLOYMENT_TARGET=11.0

# torchforge's compile cache: setuptools' and ninja's compiles go through ccache too (torchforge/compilecache.py)
if [ -n "${TORCHFORGE_COMPILERS:-}" ]; then . "$TORCHFORGE_COMPILERS/route.sh"; fi

"$PYTHON" setup.py install
