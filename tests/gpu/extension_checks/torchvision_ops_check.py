"""torchvision's compiled ops on the GPU against the same ops on the CPU (issue 39): roi_align, nms and
deform_conv2d, forward (and deform_conv2d's backward). Run in the installed prefix, LD_LIBRARY_PATH empty."""

import sys

import torch
from torchvision.ops import deform_conv2d, nms, roi_align

assert "--cuda" in sys.argv, "the CUDA ops against the CPU ones"
torch.manual_seed(0)
features = torch.randn(2, 8, 32, 32)
boxes = torch.tensor([[0, 1.0, 1.0, 20.0, 20.0], [1, 4.0, 2.0, 30.0, 28.5], [0, 0.0, 0.0, 31.0, 31.0]])
cpu = roi_align(features, boxes, output_size=(7, 7), spatial_scale=1.0, sampling_ratio=2, aligned=True)
gpu = roi_align(features.cuda(), boxes.cuda(), output_size=(7, 7), spatial_scale=1.0, sampling_ratio=2, aligned=True)
roi_error = (gpu.cpu() - cpu).abs().max().item()
corners = torch.rand(500, 2) * 100
candidates = torch.cat([corners, corners + torch.rand(500, 2) * 50 + 1], dim=1)
scores = torch.rand(500)
kept_cpu, kept_gpu = nms(candidates, scores, 0.5), nms(candidates.cuda(), scores.cuda(), 0.5).cpu()
x = torch.randn(1, 4, 12, 12, requires_grad=True)
weight = torch.randn(6, 4, 3, 3, requires_grad=True)
offset = torch.randn(1, 2 * 9, 10, 10, requires_grad=True)
on_cpu = deform_conv2d(x, offset, weight)
x_g, w_g, o_g = (t.detach().cuda().requires_grad_() for t in (x, weight, offset))
on_gpu = deform_conv2d(x_g, o_g, w_g)
deform_error = (on_gpu.cpu() - on_cpu).abs().max().item()
grad = torch.randn_like(on_cpu)
on_cpu.backward(grad)
on_gpu.backward(grad.cuda())
deform_grad = max((a.grad - b.grad.cpu()).abs().max().item() for a, b in ((x, x_g), (weight, w_g), (offset, o_g)))
print(f"torchvision ops on {torch.cuda.get_device_name()}: roi_align max error {roi_error:.2e}, nms kept "
      f"{kept_gpu.numel()} = {kept_cpu.numel()} boxes, deform_conv2d {deform_error:.2e} (backward {deform_grad:.2e})")
assert roi_error < 1e-5, roi_error
assert torch.equal(kept_cpu, kept_gpu), (kept_cpu, kept_gpu)
assert deform_error < 1e-4 and deform_grad < 1e-3, (deform_error, deform_grad)
