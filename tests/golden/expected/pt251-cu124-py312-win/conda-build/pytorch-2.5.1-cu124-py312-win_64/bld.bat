@echo on
:: Rendered by torchforge 0.1.0 for pytorch-2.5.1-cu124-py312-win_64 (official). Re-render instead of editing.

set "CMAKE_PREFIX_PATH=%LIBRARY_PREFIX%"
set "PYTORCH_BUILD_VERSION=%PKG_VERSION%"
set "PYTORCH_BUILD_NUMBER=%PKG_BUILDNUM%"
set "TH_BINARY_BUILD=1"
set "INSTALL_TEST=0"
set "MAX_JOBS=%CPU_COUNT%"
set "USE_CUDA=1"
set "TORCH_NVCC_FLAGS=-Xfatbin -compress-all --threads 2"
set "TORCH_CUDA_ARCH_LIST=5.0;6.0;6.1;7.0;7.5;8.0;8.6;9.0"
set "USE_STATIC_CUDNN=0"
:: MAGMA 2.5.4, the prebuilt archive upstream's bld.bat linked; MAGMA_HOME may point at a copy.
if not defined MAGMA_HOME (
    curl -fsSL -o "%SRC_DIR%\magma.7z" "https://s3.amazonaws.com/ossci-windows/magma_2.5.4_cuda124_release.7z"
    if errorlevel 1 exit 1
    7z x -aoa "%SRC_DIR%\magma.7z" -o"%SRC_DIR%\magma"
    if errorlevel 1 exit 1
    set "MAGMA_HOME=%SRC_DIR%\magma"
)

"%PYTHON%" setup.py install
if errorlevel 1 exit 1

:: Bundled DLLs, as the official recipe did.
:: Source: release/1.13:conda/pytorch-nightly/bld.bat:109-118; release/2.5:conda/pytorch-nightly/bld.bat:101-112 (2.6+: the 2.5 shape)
if not defined CUDNN_BIN_DIR set "CUDNN_BIN_DIR=%CUDA_PATH%\bin"
if not defined NVTX_BIN_DIR set "NVTX_BIN_DIR=%NVTOOLSEXT_PATH%\bin\x64"
if not defined CUPTI_BIN_DIR set "CUPTI_BIN_DIR=%CUDA_PATH%\extras\CUPTI\lib64"
if not defined ZLIB_BIN_DIR set "ZLIB_BIN_DIR=C:\Windows\System32"
copy /y "%CUDNN_BIN_DIR%\cudnn*64_*.dll*" "%SP_DIR%\torch\lib"
if errorlevel 1 exit 1
copy /y "%NVTX_BIN_DIR%\nvToolsExt64_*.dll*" "%SP_DIR%\torch\lib"
if errorlevel 1 exit 1
copy /y "%CUPTI_BIN_DIR%\cupti64_*.dll*" "%SP_DIR%\torch\lib"
if errorlevel 1 exit 1
if exist "%ZLIB_BIN_DIR%\zlibwapi.dll" copy /y "%ZLIB_BIN_DIR%\zlibwapi.dll" "%SP_DIR%\torch\lib"
