# Rendered by torchforge 0.1.0 for libtorch-2.6.0-cuda126-sm50_60_61_70_75_80_86_89_90PTX-linux_64 (flavour conda-forge, feedstock 71a445e6b5a7). Re-render instead of editing.
# Extensions built in this environment compile for the archs libtorch was built for.
if [ -z "${CF_TORCH_CUDA_ARCH_LIST+x}" ]; then
    export CF_TORCH_CUDA_ARCH_LIST='5.0;6.0;6.1;7.0;7.5;8.0;8.6;8.9;9.0+PTX'
    export TORCHFORGE_CF_TORCH_CUDA_ARCH_LIST_SET=1
fi
