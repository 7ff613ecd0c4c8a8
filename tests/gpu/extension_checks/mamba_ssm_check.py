"""mamba-ssm on the GPU (issue 33): selective_scan_fn against mamba's own selective_scan_ref, and a Mamba block's
forward (fast path, with causal-conv1d installed beside it) against its own reference path. Run by
tests/kernel_stack.py in the installed prefix (`--check`), LD_LIBRARY_PATH empty. Not yet run: see tests/gpu/README.md."""

import sys

import torch
from mamba_ssm.modules.mamba_simple import Mamba
from mamba_ssm.ops.selective_scan_interface import selective_scan_fn, selective_scan_ref

assert "--cuda" in sys.argv, "mamba-ssm has CUDA kernels only"
torch.manual_seed(0)
batch, dim, state, length = 2, 32, 16, 256
u, delta, z = (torch.randn(batch, dim, length, device="cuda") for _ in range(3))
A = -torch.rand(dim, state, device="cuda")
B, C = (torch.randn(batch, state, length, device="cuda") for _ in range(2))
D, delta_bias = torch.randn(dim, device="cuda"), torch.rand(dim, device="cuda")
args = (u, delta, A, B, C, D, z, delta_bias, True)
scan = (selective_scan_fn(*args) - selective_scan_ref(*args)).abs().max().item()
print(f"selective_scan_fn against selective_scan_ref: max error {scan:.2e}")
assert scan < 1e-3, scan
block = Mamba(d_model=64, d_state=16, d_conv=4, expand=2).cuda()
x = torch.randn(2, 128, 64, device="cuda")
fast = block(x)
block.use_fast_path = False
slow = block(x)
error = (fast - slow).abs().max().item()
print(f"Mamba block forward {tuple(fast.shape)}: fast path against reference path max error {error:.2e}")
assert fast.shape == x.shape and torch.isfinite(fast).all() and error < 1e-3, error
