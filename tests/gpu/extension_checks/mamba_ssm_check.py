"""mamba-ssm on the GPU (issue 33, issue 40 item 25), forward and backward, each against pure torch:

- selective_scan_fn (the selective_scan_cuda kernels) against mamba's own selective_scan_ref (einsum and a loop
  over the sequence: no kernel of the package);
- a Mamba block's fast path (mamba_inner_fn: causal-conv1d's and the scan's kernels, fused) against the same
  block computed here from its weights with plain torch: the projections, a float64 depthwise causal conv1d
  (F.conv1d padded on the left) and selective_scan_ref. The block's own `use_fast_path=False` is no reference:
  it runs causal_conv1d_fn and selective_scan_fn, the same kernels (its error was exactly 0.0).

Run by tests/kernel_stack.py in the installed prefix (`--check`), LD_LIBRARY_PATH empty; see tests/gpu/README.md.
The errors are relative to the reference's largest value."""

from __future__ import annotations

import importlib.util
import sys

import torch
import torch.nn.functional as F

FORWARD_TOLERANCE = 1e-3
BACKWARD_TOLERANCE = 5e-3


def relative(ours: torch.Tensor, reference: torch.Tensor) -> float:
    scale = reference.abs().max().item() or 1.0
    return (ours.double() - reference.double()).abs().max().item() / scale


def causal_conv1d_float64(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Depthwise conv1d over the sequence, padded on the left only (each output sees itself and the past), then
    SiLU, in float64: what causal_conv1d_fn(x, weight, bias, activation="silu") computes. weight: (dim, width)."""
    width = weight.shape[-1]
    out = F.conv1d(F.pad(x.double(), (width - 1, 0)), weight.double().unsqueeze(1),
                   None if bias is None else bias.double(), groups=x.shape[1])
    return F.silu(out).to(x.dtype)


def reference_block(block: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """Mamba.forward (mamba_ssm/modules/mamba_simple.py:119-206 of 2.3.2.post1) with plain torch in place of
    every kernel, from the block's own parameters (so gradients reach them)."""
    from mamba_ssm.ops.selective_scan_interface import selective_scan_ref

    seqlen = hidden.shape[1]
    xz = (hidden @ block.in_proj.weight.t()).transpose(1, 2)  # (b, 2 * d_inner, l)
    if block.in_proj.bias is not None:
        xz = xz + block.in_proj.bias[:, None]
    x, z = xz.chunk(2, dim=1)
    x = causal_conv1d_float64(x, block.conv1d.weight.squeeze(1), block.conv1d.bias)
    x_dbl = block.x_proj(x.transpose(1, 2).reshape(-1, x.shape[1]))  # (b * l, dt_rank + 2 * d_state)
    dt, B, C = torch.split(x_dbl, [block.dt_rank, block.d_state, block.d_state], dim=-1)
    dt = (block.dt_proj.weight @ dt.t()).reshape(-1, hidden.shape[0], seqlen).transpose(0, 1)  # (b, d_inner, l)
    B = B.reshape(hidden.shape[0], seqlen, -1).transpose(1, 2).contiguous()
    C = C.reshape(hidden.shape[0], seqlen, -1).transpose(1, 2).contiguous()
    A = -torch.exp(block.A_log.float())
    y = selective_scan_ref(x, dt, A, B, C, block.D.float(), z=z, delta_bias=block.dt_proj.bias.float(),
                           delta_softplus=True)
    return block.out_proj(y.transpose(1, 2))


def check_scan() -> tuple[float, float]:
    from mamba_ssm.ops.selective_scan_interface import selective_scan_fn, selective_scan_ref

    batch, dim, state, length = 2, 32, 16, 256
    u, delta, z = (torch.randn(batch, dim, length, device="cuda") for _ in range(3))
    A = -torch.rand(dim, state, device="cuda")
    B, C = (torch.randn(batch, state, length, device="cuda") for _ in range(2))
    D, delta_bias = torch.randn(dim, device="cuda"), torch.rand(dim, device="cuda")
    ours_in = [t.clone().requires_grad_() for t in (u, delta, A, B, C, D, z, delta_bias)]
    ref_in = [t.clone().requires_grad_() for t in (u, delta, A, B, C, D, z, delta_bias)]
    ours = selective_scan_fn(*ours_in, True)
    ref = selective_scan_ref(*ref_in, True)
    grad = torch.randn_like(ref)
    ours.backward(grad)
    ref.backward(grad)
    backward = max(relative(a.grad, b.grad) for a, b in zip(ours_in, ref_in))
    return relative(ours, ref), backward


def check_block() -> tuple[float, float]:
    from mamba_ssm.modules import mamba_simple

    # the fast path runs only where causal-conv1d imported (mamba_simple.py:145)
    assert mamba_simple.causal_conv1d_fn is not None, "causal-conv1d is not importable beside mamba-ssm"
    block = mamba_simple.Mamba(d_model=64, d_state=16, d_conv=4, expand=2).cuda()
    assert block.use_fast_path, "the block's fast path (mamba_inner_fn) is what is checked"
    hidden = torch.randn(2, 128, 64, device="cuda")
    ours_x, ref_x = hidden.clone().requires_grad_(), hidden.clone().requires_grad_()
    ours = block(ours_x)
    grad = torch.randn_like(ours)
    ours.backward(grad)
    ours_grads = {name: p.grad.clone() for name, p in block.named_parameters()}
    block.zero_grad()
    ref = reference_block(block, ref_x)
    ref.backward(grad)
    assert ours.shape == hidden.shape and torch.isfinite(ours).all()
    backward = max([relative(ours_x.grad, ref_x.grad),
                    *(relative(ours_grads[name], p.grad) for name, p in block.named_parameters())])
    return relative(ours, ref), backward


def main() -> None:
    assert "--cuda" in sys.argv, "mamba-ssm has CUDA kernels only"
    torch.manual_seed(0)
    figures = {"selective_scan_fn against selective_scan_ref": check_scan()}
    if importlib.util.find_spec("causal_conv1d") is not None:
        figures["Mamba block fast path against plain torch (float64 conv, selective_scan_ref)"] = check_block()
    else:  # mamba-ssm built alone (tests/gpu/speed.sh builds): its block's fast path needs causal-conv1d
        print("Mamba block: not checked (causal-conv1d is not installed beside mamba-ssm)")
    for what, (forward, backward) in figures.items():
        print(f"{what} on {torch.cuda.get_device_name()}: forward {forward:.2e}, backward {backward:.2e} (relative)")
    for what, (forward, backward) in figures.items():
        assert forward < FORWARD_TOLERANCE and backward < BACKWARD_TOLERANCE, (what, forward, backward)


if __name__ == "__main__":
    main()
