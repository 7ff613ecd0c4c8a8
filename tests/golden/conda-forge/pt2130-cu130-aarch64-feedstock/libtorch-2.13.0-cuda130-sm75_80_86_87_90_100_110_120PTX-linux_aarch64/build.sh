#!/bin/bash
# Rendered by torchforge 0.1.0 for libtorch-2.13.0-cuda130-sm75_80_86_87_90_100_110_120PTX-linux_aarch64 (flavour conda-forge, feedstock 74dd3d46ff0c). Re-render instead of editing.
# One script for both outputs: conda-build runs it for libtorch (the C++ libraries, once) and then for pytorch
# (the Python bindings, once per Python), like conda-forge's megabuild.
set -euo pipefail

# The build environment of conda-forge/pytorch-cpu-feedstock@74dd3d46ff0c (torchforge/data/conda_forge.toml).
export CUDA_TARGET=sbsa-linux
export IN_PYTORCH_BUILD=1
export PACKAGE_TYPE=conda
export USE_NUMA=0
export USE_ITT=0
export _GLIBCXX_USE_CXX11_ABI=1
export CMAKE_GENERATOR=Ninja
export CMAKE_PREFIX_PATH="$PREFIX"
export CMAKE_BUILD_TYPE=Release
export PYTORCH_BUILD_VERSION="$PKG_VERSION"
export PYTORCH_BUILD_NUMBER=0
export INSTALL_TEST=0
export BUILD_TEST=0
export USE_SYSTEM_SLEEF=1
export BUILD_CUSTOM_PROTOBUF=OFF
export USE_SYSTEM_PYBIND11=1
export USE_SYSTEM_EIGEN_INSTALL=1
export USE_SYSTEM_FMT=1
export Python_ROOT_DIR="$PREFIX"
export PYTORCH_BLAS_USE_CBLAS_DOT=ON
export BLAS=OpenBLAS
export OpenBLAS_HOME="${PREFIX}"
export USE_PRIORITIZED_TEXT_FOR_LD=1
export USE_MKLDNN=1
export USE_CUDA=1
export USE_CUFILE=1
export CUDAToolkit_BIN_DIR="${BUILD_PREFIX}/bin"
export CUDAToolkit_ROOT_DIR="${PREFIX}"
export CUDA_TOOLKIT_ROOT_DIR="${PREFIX}"
export CUDAToolkit_ROOT="${PREFIX}"
export CUDAToolkit_TARGET_DIR="${PREFIX}/targets/${CUDA_TARGET}"
export TORCH_NVCC_FLAGS='-Xfatbin -compress-all -compress-mode=size'
export NCCL_ROOT_DIR="$PREFIX"
export NCCL_INCLUDE_DIR="$PREFIX/include"
export USE_SYSTEM_NCCL=1
export USE_SYSTEM_NVTX=1
export USE_STATIC_NCCL=0
export USE_STATIC_CUDNN=0
export MAGMA_HOME="${PREFIX}"
export USE_MAGMA=1
export CUDA_VERSION=13.0
export CMAKE_CUDA_FLAGS='-w -Xptxas -w'
export TORCH_CUDA_ARCH_LIST='7.5;8.0;8.6;8.7;9.0;10.0;11.0;12.0+PTX'
export MAX_JOBS="${MAX_JOBS:-$CPU_COUNT}"
# conda's -DCMAKE_* arguments (its compilers' activation) on to PyTorch's CMake, as the feedstock hands them over
# (conda_forge.toml [cmake])
export CMAKE_LIBRARY_PATH="$PREFIX/lib:$PREFIX/include:${CMAKE_LIBRARY_PATH:-}"
# setup.py forwards the CMAKE_* variables to CMake: one for each argument; the install prefix is setup.py's own
for arg in ${CMAKE_ARGS:-}; do
    if [[ "$arg" == -DCMAKE_*=* ]]; then name="${arg%%=*}"; export "${name#-D}=${arg#*=}"; fi
done
CMAKE_FIND_ROOT_PATH="${CMAKE_FIND_ROOT_PATH:-};$SRC_DIR"
unset CMAKE_INSTALL_PREFIX
# conda-forge's edits of conda's compiler flags for PyTorch (conda_forge.toml [compiler_flags]: the standard from
# PyTorch's CMake, inline functions kept visible, no warnings, no executable stack)
export CFLAGS="$(printf '%s' "${CFLAGS:-}" | sed -e 's/-fvisibility-inlines-hidden//g') -Wno-deprecated-declarations -Wno-error=maybe-uninitialized"
export CXXFLAGS="$(printf '%s' "${CXXFLAGS:-}" | sed -e 's/-std=c++[0-9][0-9]//g' -e 's/-fvisibility-inlines-hidden//g') -w -Wno-deprecated-declarations -Wno-error=maybe-uninitialized"
# conda-forge's compiler packages link with --as-needed, which drops MKL's sub-libraries, and with -z now, which
# binds libcuda when a library loads, so `import torch` would need a driver: PyTorch wants neither
# (conda-forge-peer.md §1.4 and §1.6)
export LDFLAGS="${LDFLAGS:-} -Wl,-z,noexecstack"
LDFLAGS="${LDFLAGS//-Wl,--as-needed/}"
export LDFLAGS="${LDFLAGS//-Wl,-z,now/-Wl,-z,lazy}"

# conda-build names the output in PKG_NAME; rattler-build's staging output (libtorch's build) has no package
# name, so its recipe names the step in TORCHFORGE_OUTPUT
case "${TORCHFORGE_OUTPUT:-$PKG_NAME}" in
  libtorch)
    # what the feedstock empties in the source tree (conda_forge.toml [source_edits]: no download while configuring)
    if [ -f third_party/NNPACK/cmake/DownloadSix.cmake ]; then : > third_party/NNPACK/cmake/DownloadSix.cmake; fi
    # (and deletes the lines naming setuptools<82 from setup.py: conda-forge's requirements replace them)
    if [ -f setup.py ]; then sed -i -e '/setuptools<82/d' setup.py; fi
    # torchforge's compile cache (set only with it): CC and CXX through ccache for setuptools' and ninja's compiles
    if [ -n "${TORCHFORGE_COMPILERS:-}" ]; then . "$TORCHFORGE_COMPILERS/route.sh"; fi
    "$PYTHON" setup.py -q build
    built=$(echo build/lib.*/torch)
    mkdir -p "$PREFIX/bin" "$PREFIX/lib" "$PREFIX/include" "$PREFIX/share"
    cp -a "$built"/bin/. "$PREFIX/bin/" 2>/dev/null || true
    cp -a "$built"/lib/. "$PREFIX/lib/"
    cp -a "$built"/share/. "$PREFIX/share/"
    for dir in ATen c10 caffe2 torch tensorpipe; do
        if [ -d "$built/include/$dir" ]; then cp -a "$built/include/$dir" "$PREFIX/include/"; fi
    done
    rm -f "$PREFIX"/lib/libtorch_python.*
    # the per-Python builds reuse this tree; only the bindings compile again
    cp build/CMakeCache.txt build/CMakeCache.txt.libtorch
    for stage in activate deactivate; do
        mkdir -p "$PREFIX/etc/conda/$stage.d"
        cp "$RECIPE_DIR/$stage.sh" "$PREFIX/etc/conda/$stage.d/libtorch-torchforge_$stage.sh"
    done
    ;;
  pytorch)
    # libtorch's tree is reused: its CMake cache names Python 3.12; point it at this Python so
    # only the bindings compile again
    py=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    # (only on the cache's Python lines: a CUDA or library version that happens to contain the same digits stays)
    sed -e "/python/I s/3\.12/$py/g" \
        -e "/python/I s/3;12/${py/./;}/g" \
        -e "s/cpython-312/cpython-${py/./}/g" \
        build/CMakeCache.txt.libtorch > build/CMakeCache.txt
    if [ -n "${TORCHFORGE_COMPILERS:-}" ]; then . "$TORCHFORGE_COMPILERS/route.sh"; fi
    # --no-index: the build asks no index, not even for pip's check for a newer pip
    "$PYTHON" -m pip install . --no-deps --no-build-isolation --no-index -v
    # libtorch_python stays next to the other libraries so TorchConfig.cmake finds it
    cp "$SP_DIR"/torch/lib/libtorch_python.so "$PREFIX/lib/"
    # the libraries of the libtorch output are shared, not copied: torch/lib points at them
    for lib in "$SP_DIR"/torch/lib/*.so*; do
        name=$(basename "$lib")
        if [ -e "$PREFIX/lib/$name" ]; then ln -sf "../../../../$name" "$lib"; fi
    done
    ;;
esac
