"""What a user of the repacked stack runs first, on the GPU (the lent H100): a matmul, a cuDNN convolution,
torchvision.ops.nms on CUDA tensors, a torchaudio transform on CUDA and torch.compile of a small function
(inductor → triton). Prints one JSON line; exits 0 only if every step ran and agreed with the CPU."""

from __future__ import annotations

import json
import os
import sys
import time


def main() -> int:
    import torch
    import torchaudio
    import torchvision

    report: dict[str, object] = {"python": sys.executable, "torch": [torch.__version__, torch.__file__],
                                 "torchvision": [torchvision.__version__, torchvision.__file__],
                                 "torchaudio": [torchaudio.__version__, torchaudio.__file__],
                                 "device": torch.cuda.get_device_name(0), "LD_LIBRARY_PATH": os.environ.get("LD_LIBRARY_PATH", "")}
    ok = True
    a, b = torch.randn(512, 512, device="cuda"), torch.randn(512, 512, device="cuda")
    err = (a @ b - (a.cpu().double() @ b.cpu().double()).float().cuda()).abs().max().item()
    report["matmul_max_abs_err"] = err
    ok &= err < 1e-1
    torch.backends.cudnn.enabled = True
    conv = torch.nn.Conv2d(3, 8, 3, padding=1).cuda()
    x = torch.randn(4, 3, 32, 32, device="cuda")
    with torch.no_grad():
        diff = (conv(x).cpu() - conv.cpu()(x.cpu())).abs().max().item()
    report["cudnn_conv"] = {"cudnn": torch.backends.cudnn.version(), "max_abs_err_vs_cpu": diff}
    ok &= diff < 1e-2 and bool(torch.backends.cudnn.version())
    boxes = torch.tensor([[0, 0, 10, 10], [1, 1, 11, 11], [50, 50, 60, 60]], dtype=torch.float, device="cuda")
    keep = torchvision.ops.nms(boxes, torch.tensor([0.9, 0.8, 0.7], device="cuda"), 0.5)
    report["nms"] = {"keep": keep.tolist(), "device": str(keep.device)}
    ok &= keep.tolist() == [0, 2] and keep.is_cuda
    mel = torchaudio.transforms.MelSpectrogram(sample_rate=16000, n_mels=40).cuda()
    wave = torch.randn(1, 16000, device="cuda")
    spec = mel(wave)
    report["torchaudio_mel"] = {"shape": list(spec.shape), "device": str(spec.device)}
    ok &= spec.is_cuda and spec.shape[1] == 40
    try:
        filtered = torchaudio.functional.lfilter(wave, torch.tensor([1.0, 0.0], device="cuda"),
                                                 torch.tensor([0.5, 0.5], device="cuda"))
        report["torchaudio_lfilter"] = str(filtered.device)
    except Exception as exc:  # reported, not required: the transform above is the check
        report["torchaudio_lfilter"] = f"{type(exc).__name__}: {exc}"
    start = time.perf_counter()
    compiled = torch.compile(lambda t: torch.sin(t) * 2 + torch.cos(t))
    t = torch.randn(4096, device="cuda")
    diff = (compiled(t) - (torch.sin(t) * 2 + torch.cos(t))).abs().max().item()
    report["torch_compile"] = {"max_abs_err": diff, "seconds": round(time.perf_counter() - start, 1)}
    ok &= diff < 1e-5
    with open("/proc/self/maps") as maps:
        libs = sorted({line.split()[-1] for line in maps if ".so" in line.split()[-1]})
    report["cuda_libraries_loaded"] = [p for p in libs if any(k in os.path.basename(p) for k in
                                       ("cudart", "cublas", "cudnn", "nccl", "nvrtc", "cusparse", "cufft", "curand",
                                        "nvJitLink", "cupti", "nvshmem", "cusolver", "libcuda", "triton"))]
    report["ok"] = bool(ok)
    print(json.dumps(report, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
