@echo off
:: Rendered by torchforge 0.1.0 for libtorch-2.13.0-cuda130-sm75_80_86_90_100_110_120PTX-win_64 (flavour conda-forge, feedstock 74dd3d46ff0c). Re-render instead of editing.
if defined TORCHFORGE_CF_TORCH_CUDA_ARCH_LIST_SET (
    set "CF_TORCH_CUDA_ARCH_LIST="
    set "TORCHFORGE_CF_TORCH_CUDA_ARCH_LIST_SET="
)
