@echo on
:: Rendered by torchforge 0.1.0 for libtorch-2.13.0-cuda130-sm75_80_86_90_100_110_120PTX-win_64 (flavour conda-forge, feedstock 74dd3d46ff0c). Re-render instead of editing.
:: One script for both outputs: conda-build runs it for libtorch (the C++ libraries, once) and then for pytorch
:: (the Python bindings, once per Python), like conda-forge's megabuild.
setlocal

:: The build environment of conda-forge/pytorch-cpu-feedstock@74dd3d46ff0c (torchforge/data/conda_forge.toml).
set "IN_PYTORCH_BUILD=1"
set "PYTORCH_BUILD_VERSION=%PKG_VERSION%"
set "PYTORCH_BUILD_NUMBER=0"
set "BLAS=MKL"
set "BUILD_CUSTOM_PROTOBUF=OFF"
set "USE_LITE_PROTO=ON"
set "USE_ITT=0"
set "USE_NUMA=0"
set "USE_OPENMP=ON"
set "USE_SYSTEM_EIGEN_INSTALL=1"
set "USE_SYSTEM_PYBIND11=1"
set "USE_SYSTEM_SLEEF=1"
set "USE_SYSTEM_FMT=1"
set "USE_CUDA=1"
set "USE_STATIC_CUDNN=0"
set "USE_NCCL=0"
set "USE_STATIC_NCCL=0"
set "CUDAToolkit_BIN_DIR=%BUILD_PREFIX%/Library/bin"
set "CUDAToolkit_ROOT_DIR=%LIBRARY_PREFIX%"
set "CUDA_TOOLKIT_ROOT_DIR=%LIBRARY_PREFIX%"
set "CUDAToolkit_ROOT=%LIBRARY_PREFIX%"
set "TORCH_NVCC_FLAGS=-Xfatbin -compress-all -compress-mode=size"
set "MAGMA_HOME=%LIBRARY_PREFIX%"
set "PATH=%CUDA_BIN_PATH%;%PATH%"
set "CUDNN_INCLUDE_DIR=%LIBRARY_PREFIX%\include"
set "CUDA_VERSION=13.0"
set "DISTUTILS_USE_SDK=1"
set "LIB=%LIBRARY_PREFIX%\lib;%LIB%"
set "CMAKE_GENERATOR=Ninja"
set "CMAKE_GENERATOR_TOOLSET="
set "CMAKE_GENERATOR_PLATFORM="
set "CMAKE_PREFIX_PATH=%LIBRARY_PREFIX%"
set "CMAKE_INCLUDE_PATH=%LIBRARY_INC%"
set "CMAKE_LIBRARY_PATH=%LIBRARY_LIB%"
set "CMAKE_BUILD_TYPE=Release"
set "Python_EXECUTABLE=%PYTHON%"
set "Python3_EXECUTABLE=%PYTHON%"
set "INSTALL_TEST=0"
set "BUILD_TEST=0"
set "libuv_ROOT=%LIBRARY_PREFIX%"
set "CUDA_CFLAGS=-I%PREFIX%/Library/include -I%BUILD_PREFIX%/Library/include"
set "CMAKE_C_COMPILER_LAUNCHER=sccache"
set "CMAKE_CXX_COMPILER_LAUNCHER=sccache"
set "CMAKE_CUDA_COMPILER_LAUNCHER=sccache"
set "TORCH_CUDA_ARCH_LIST=7.5;8.0;8.6;9.0;10.0;11.0;12.0+PTX"
if not defined MAX_JOBS set "MAX_JOBS=%CPU_COUNT%"
:: nvcc's package adds no include folders to the compiler flags on Windows: the feedstock passes them itself
set "CFLAGS=%CFLAGS% %CUDA_CFLAGS%"
set "CPPFLAGS=%CPPFLAGS% %CUDA_CFLAGS%"
set "CXXFLAGS=%CXXFLAGS% %CUDA_CFLAGS%"

if "%PKG_NAME%" == "pytorch" goto pytorch

:: ---- libtorch: the C++ libraries into %LIBRARY_PREFIX% (bin: DLLs, lib: import libraries, include, share)
"%PYTHON%" setup.py -q build
if errorlevel 1 exit 1
for /d %%d in (build\lib.*) do set "BUILT=%%d\torch"
if not exist "%LIBRARY_BIN%" mkdir "%LIBRARY_BIN%"
if not exist "%LIBRARY_LIB%" mkdir "%LIBRARY_LIB%"
for %%f in ("%BUILT%\bin\*.dll" "%BUILT%\lib\*.dll") do copy /y "%%~f" "%LIBRARY_BIN%\" >nul
for %%f in ("%BUILT%\lib\*.lib") do copy /y "%%~f" "%LIBRARY_LIB%\" >nul
xcopy /e /i /q /y "%BUILT%\share" "%LIBRARY_PREFIX%\share"
if errorlevel 1 exit 1
for %%d in (ATen c10 caffe2 torch) do (
    if exist "%BUILT%\include\%%d" xcopy /e /i /q /y "%BUILT%\include\%%d" "%LIBRARY_INC%\%%d"
)
:: the bindings belong to each Python's pytorch
del /q "%LIBRARY_BIN%\torch_python.*" "%LIBRARY_LIB%\torch_python.*" 2>nul
:: the per-Python builds reuse this tree; only the bindings compile again
copy /y build\CMakeCache.txt build\CMakeCache.txt.libtorch
if errorlevel 1 exit 1
for %%s in (activate deactivate) do (
    if not exist "%PREFIX%\etc\conda\%%s.d" mkdir "%PREFIX%\etc\conda\%%s.d"
    copy /y "%RECIPE_DIR%\%%s.bat" "%PREFIX%\etc\conda\%%s.d\libtorch-torchforge_%%s.bat"
    if errorlevel 1 exit 1
)
exit /b 0

:pytorch
:: libtorch's tree is reused: its CMake cache names Python 3.12; point it at this Python so only the
:: bindings compile again
"%PYTHON%" "%RECIPE_DIR%\retarget_cmake_cache.py" build\CMakeCache.txt.libtorch build\CMakeCache.txt
if errorlevel 1 exit 1
"%PYTHON%" -m pip install . --no-deps --no-build-isolation --no-index -v
if errorlevel 1 exit 1
:: torch_python sits next to libtorch's DLLs so TorchConfig.cmake finds it; the DLLs the libtorch output ships are
:: shared, not copied (torch adds %LIBRARY_BIN% to the DLL search path)
copy /y "%SP_DIR%\torch\lib\torch_python.dll" "%LIBRARY_BIN%\"
if errorlevel 1 exit 1
for %%f in ("%SP_DIR%\torch\lib\*.dll") do (
    if exist "%LIBRARY_BIN%\%%~nxf" del /q "%%~f"
)
exit /b 0
