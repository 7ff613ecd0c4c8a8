# Rendered by torchforge 0.1.0 for libtorch-2.9.1-cuda124-sm70_86-linux_64 (flavour conda-forge, feedstock e42c757bb713). Re-render instead of editing.
if [ -n "${TORCHFORGE_CF_TORCH_CUDA_ARCH_LIST_SET:-}" ]; then
    unset CF_TORCH_CUDA_ARCH_LIST TORCHFORGE_CF_TORCH_CUDA_ARCH_LIST_SET
fi
