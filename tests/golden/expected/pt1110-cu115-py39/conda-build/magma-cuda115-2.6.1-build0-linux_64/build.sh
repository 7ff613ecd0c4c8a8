#!/usr/bin/env bash
# Rendered by torchforge 0.1.0 for magma-cuda115-2.6.1-build0-linux_64. Re-render instead of editing.
set -euxo pipefail

export CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
export MAX_JOBS="${MAX_JOBS:-$CPU_COUNT}"
export DESIRED_CUDA=11.5
export CUDA_ARCH_LIST='-gencode arch=compute_37,code=sm_37 -gencode arch=compute_50,code=sm_50 -gencode arch=compute_60,code=sm_60 -gencode arch=compute_70,code=sm_70 -gencode arch=compute_80,code=sm_80 -gencode arch=compute_86,code=sm_86'

# Like upstream's magma build.sh: refuse to build with an nvcc of another CUDA version.
nvcc_release="$("$CUDA_HOME/bin/nvcc" --version | sed -n 's/.*release \([0-9]*\.[0-9]*\).*/\1/p')"
if [ "$nvcc_release" != "$DESIRED_CUDA" ]; then
  echo "nvcc at $CUDA_HOME is CUDA $nvcc_release, this recipe is for CUDA $DESIRED_CUDA: set CUDA_HOME to a CUDA $DESIRED_CUDA toolkit" >&2
  exit 1
fi

# Changes upstream's patches made, as exact, checked source edits (see the header).
python3 "$RECIPE_DIR/source_edits.py" "$RECIPE_DIR/source_edits.json" "$SRC_DIR"

# The official build: static libmagma.a, the gencode list above (SASS only, no PTX), no OpenMP, no LAPACK,
# no separable compilation (see the source edits and magma.toml's cmake styles).
mkdir -p build
cd build
cmake .. \
  -DUSE_FORTRAN=OFF \
  -DBUILD_SHARED_LIBS=OFF \
  -DCMAKE_POSITION_INDEPENDENT_CODE=ON \
  -DCMAKE_BUILD_TYPE=Release \
  -DGPU_TARGET=All \
  "-DCUDA_ARCH_LIST=$CUDA_ARCH_LIST" \
  "-DCUDA_TOOLKIT_ROOT_DIR=$CUDA_HOME" \
  -DCMAKE_POLICY_VERSION_MINIMUM=3.5 \
  "-DCUDA_NVCC_EXECUTABLE=${CUDA_NVCC_EXECUTABLE:-$CUDA_HOME/bin/nvcc}" \
  -DCMAKE_INSTALL_PREFIX="$PREFIX"
# Only the magma target: the testers, lapacktest and magma_sparse need a LAPACK and hours to build.
make -j"$MAX_JOBS" magma
# Only the library and its headers, as the official package (include/*.h and the generated build/include/*.h).
install -d "$PREFIX/lib" "$PREFIX/include"
install -m 644 lib/libmagma.a "$PREFIX/lib/"
for header in ../include/*.h include/*.h; do
  if [ -f "$header" ]; then install -m 644 "$header" "$PREFIX/include/"; fi
done
