# Rendered by torchforge 0.1.0 for libtorch-2.13.0-cuda130-sm90-linux_64 (flavour conda-forge, feedstock 74dd3d46ff0c). Re-render instead of editing.
# Extensions built in this environment compile for the archs libtorch was built for.
if [ -z "${CF_TORCH_CUDA_ARCH_LIST+x}" ]; then
    export CF_TORCH_CUDA_ARCH_LIST=9.0
    export TORCHFORGE_CF_TORCH_CUDA_ARCH_LIST_SET=1
fi
