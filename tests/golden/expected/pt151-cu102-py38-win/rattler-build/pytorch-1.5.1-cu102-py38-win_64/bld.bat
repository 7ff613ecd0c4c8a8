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
:: MKL 2020.0.166, the static MKL upstream's bld.bat put first on the include and library paths, so
:: FindMKL links it whatever MKL the build machine has; MKL_STATIC_DIR may point at an unpacked copy.
if not defined MKL_STATIC_DIR (
    curl -fsSL -o "%SRC_DIR%\mkl.7z" "https://s3.amazonaws.com/ossci-windows/mkl_2020.0.166.7z"
    if errorlevel 1 exit 1
    7z x -aoa "%SRC_DIR%\mkl.7z" -o"%SRC_DIR%\mkl"
    if errorlevel 1 exit 1
    set "MKL_STATIC_DIR=%SRC_DIR%\mkl"
)
set "CMAKE_INCLUDE_PATH=%MKL_STATIC_DIR%\include"
set "LIB=%MKL_STATIC_DIR%\lib;%LIB%"

"%PYTHON%" setup.py install
if errorlevel 1 exit 1
