@echo on
:: Rendered by torchforge 0.1.0 for pytorch-1.5.1-cu102-py38-win_64 (official). Re-render instead of editing.

set "CMAKE_PREFIX_PATH=%LIBRARY_PREFIX%"
set "PYTORCH_BUILD_VERSION=%PKG_VERSION%"
set "PYTORCH_BUILD_NUMBER=%PKG_BUILDNUM%"
set "TH_BINARY_BUILD=1"
set "INSTALL_TEST=0"
set "MAX_JOBS=%CPU_COUNT%"
set "USE_CUDA=1"
set "TORCH_NVCC_FLAGS=-Xfatbin -compress-all"
set "TORCH_CUDA_ARCH_LIST=3.7+PTX;5.0;6.0;6.1;7.0;7.5"
set "USE_STATIC_CUDNN=1"
set "USE_MAGMA=0"

"%PYTHON%" setup.py install
if errorlevel 1 exit 1
