# Rendered by torchforge 0.1.0 for libtorch-2.6.0-cuda126-sm50_60_61_70_75_80_86_89_90PTX-linux_64 (flavour conda-forge, feedstock 71a445e6b5a7). Re-render instead of editing.
if [ -n "${TORCHFORGE_CF_TORCH_CUDA_ARCH_LIST_SET:-}" ]; then
    unset CF_TORCH_CUDA_ARCH_LIST TORCHFORGE_CF_TORCH_CUDA_ARCH_LIST_SET
fi
