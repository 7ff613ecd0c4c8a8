# Rendered by torchforge 0.1.0 for libtorch-2.13.0-cuda130-sm90-linux_64 (flavour conda-forge, feedstock 74dd3d46ff0c). Re-render instead of editing.
if [ -n "${TORCHFORGE_CF_TORCH_CUDA_ARCH_LIST_SET:-}" ]; then
    unset CF_TORCH_CUDA_ARCH_LIST TORCHFORGE_CF_TORCH_CUDA_ARCH_LIST_SET
fi
