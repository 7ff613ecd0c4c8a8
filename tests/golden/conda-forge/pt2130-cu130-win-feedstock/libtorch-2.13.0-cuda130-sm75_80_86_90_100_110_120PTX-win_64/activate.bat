@echo off
:: Rendered by torchforge 0.1.0 for libtorch-2.13.0-cuda130-sm75_80_86_90_100_110_120PTX-win_64 (flavour conda-forge, feedstock 74dd3d46ff0c). Re-render instead of editing.
:: Extensions built in this environment compile for the archs libtorch was built for; a value the user set wins.
if not defined CF_TORCH_CUDA_ARCH_LIST (
    set "CF_TORCH_CUDA_ARCH_LIST=7.5;8.0;8.6;9.0;10.0;11.0;12.0+PTX"
    set "TORCHFORGE_CF_TORCH_CUDA_ARCH_LIST_SET=1"
)
