# Rendered by torchforge 0.1.0 for libtorch-2.9.1-cuda124-sm70_86-linux_64 (flavour conda-forge, feedstock e42c757bb713). Re-render instead of editing.
# Extensions built in this environment compile for the archs libtorch was built for.
if [ -z "${CF_TORCH_CUDA_ARCH_LIST+x}" ]; then
    export CF_TORCH_CUDA_ARCH_LIST='7.0;8.6'
    export TORCHFORGE_CF_TORCH_CUDA_ARCH_LIST_SET=1
fi
