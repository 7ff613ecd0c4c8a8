"""causal-conv1d on the GPU against a plain-torch depthwise conv1d, forward and backward (issue 33). Run by
tests/kernel_stack.py in the installed prefix (`--check`), LD_LIBRARY_PATH empty. Not yet run: see tests/gpu/README.md."""

import sys

import torch
import torch.nn.functional as F
from causal_conv1d import causal_conv1d_fn

assert "--cuda" in sys.argv, "causal-conv1d has CUDA kernels only"
torch.manual_seed(0)
batch, dim, length, width = 2, 64, 512, 4
x = torch.randn(batch, dim, length, device="cuda", requires_grad=True)
weight = torch.randn(dim, width, device="cuda", requires_grad=True)
bias = torch.randn(dim, device="cuda", requires_grad=True)
out = causal_conv1d_fn(x, weight, bias, activation="silu")
# the reference: a depthwise conv1d padded on the left only, then SiLU
ref_x, ref_w, ref_b = (t.detach().clone().requires_grad_() for t in (x, weight, bias))
ref = F.silu(F.conv1d(F.pad(ref_x, (width - 1, 0)), ref_w.unsqueeze(1), ref_b, groups=dim))
forward = (out - ref).abs().max().item()
grad = torch.randn_like(out)
out.backward(grad)
ref.backward(grad)
backward = max((a.grad - b.grad).abs().max().item() for a, b in ((x, ref_x), (weight, ref_w), (bias, ref_b)))
print(f"causal_conv1d_fn on {torch.cuda.get_device_name()}: forward max error {forward:.2e}, backward {backward:.2e}")
assert forward < 1e-4 and backward < 1e-3, (forward, backward)
