"""The probe `torchforge verify` runs in the environment's own Python (its text is passed with `-c`; it imports
nothing of torchforge): what imports, from where, and, where a GPU is, one small operation through each CUDA
library the prefix provides, compared with the CPU. It prints one line, `TORCHFORGE-PROBE {json}`.

Each GPU probe reports the library file that answered (read from /proc/self/maps after the call: the file of
that library the process mapped), the error against the CPU and its tolerance, or why it was not run. An import
alone proves nothing: an sm_80-only build imports fine on sm_90 and fails at its first kernel.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import tempfile


def _maps() -> list[str]:
    with open("/proc/self/maps") as maps:
        return sorted({line.split()[-1] for line in maps if ".so" in line.split()[-1]})


def _answered(stem: str) -> str:
    """The mapped file of the library `stem` (libcublasLt; an extension module's causal_conv1d_cuda, whose file is
    causal_conv1d_cuda.cpython-312-x86_64-linux-gnu.so), or "" where none is mapped."""
    return next((p for p in _maps() if p.rsplit("/", 1)[-1].startswith((stem + ".so", stem + ".cpython-",
                                                                        stem + ".abi3.so"))), "")


def _max_error(gpu, cpu) -> float:  # type: ignore[no-untyped-def]
    return float((gpu.detach().cpu().double() - cpu.detach().double()).abs().max().item())


def _probe_blas(torch):  # type: ignore[no-untyped-def]
    found = []
    for dtype, tolerance in ((torch.float32, 1e-3), (torch.bfloat16, 0.5)):
        a, b = torch.randn(256, 256, dtype=dtype), torch.randn(256, 256, dtype=dtype)
        error = _max_error(a.cuda() @ b.cuda(), (a.float() @ b.float()).to(dtype))
        library = "libcublasLt" if _answered("libcublasLt") else "libcublas"
        found.append((f"cuBLAS matmul {str(dtype).removeprefix('torch.')}", library, error, tolerance))
    return found


def _probe_fft(torch):  # type: ignore[no-untyped-def]
    x = torch.randn(1 << 20)
    back = torch.fft.ifft(torch.fft.fft(x.cuda())).real
    return [("cuFFT fft/ifft round trip", "libcufft", _max_error(back, x), 1e-4)]


def _probe_rand(torch):  # type: ignore[no-untyped-def]
    """cuRAND directly (torch's own generator does not use it): a uniform sample, its mean against 0.5."""
    import ctypes

    library = _answered("libcurand") or next((p for p in _site_libraries("libcurand.so")), None)  # torch maps it
    if library is None:
        raise LookupError("no libcurand.so.* in the environment's site-packages or lib/")
    curand = ctypes.CDLL(library)
    generator = ctypes.c_void_p()
    out = torch.empty(1 << 20, device="cuda")
    for status in (curand.curandCreateGenerator(ctypes.byref(generator), 100),  # CURAND_RNG_PSEUDO_DEFAULT
                   curand.curandGenerateUniform(generator, ctypes.c_void_p(out.data_ptr()), ctypes.c_size_t(out.numel()))):
        if status != 0:
            raise RuntimeError(f"curand status {status}")
    torch.cuda.synchronize()
    curand.curandDestroyGenerator(generator)
    in_range = bool(((out > 0) & (out <= 1)).all().item())
    return [("cuRAND uniform sample (mean against 0.5)", "libcurand", abs(float(out.mean().item()) - 0.5)
             if in_range else 1.0, 5e-3)]


def _site_libraries(name: str) -> list[str]:
    import glob
    import os

    roots = [p for p in sys.path if p.endswith("site-packages")] + [os.path.join(sys.prefix, "lib")]
    return sorted(p for root in roots for p in glob.glob(os.path.join(root, "**", name + "*"), recursive=True))


def _probe_solver(torch):  # type: ignore[no-untyped-def]
    torch.backends.cuda.preferred_linalg_library("cusolver")
    a = torch.randn(64, 64, dtype=torch.float64)
    spd = a @ a.T + 64 * torch.eye(64, dtype=torch.float64)
    return [("cuSOLVER Cholesky (torch.linalg)", "libcusolver", _max_error(torch.linalg.cholesky(spd.cuda()),
                                                                           torch.linalg.cholesky(spd)), 1e-8)]


def _probe_sparse(torch):  # type: ignore[no-untyped-def]
    dense = torch.randn(128, 128) * (torch.rand(128, 128) < 0.05)
    sparse, other = dense.to_sparse_csr(), torch.randn(128, 16)
    return [("cuSPARSE sparse x dense product", "libcusparse", _max_error(sparse.cuda() @ other.cuda(),
                                                                          sparse @ other), 1e-3)]


def _probe_dnn(torch):  # type: ignore[no-untyped-def]
    torch.backends.cudnn.enabled = True
    x, w = torch.randn(2, 3, 32, 32), torch.randn(8, 3, 3, 3)
    conv = torch.nn.functional.conv2d
    return [("cuDNN convolution", "libcudnn", _max_error(conv(x.cuda(), w.cuda()), conv(x, w)), 1e-2)]


def _probe_nccl(torch):  # type: ignore[no-untyped-def]
    import torch.distributed as dist

    with tempfile.NamedTemporaryFile(prefix="torchforge-nccl-") as store:
        dist.init_process_group("nccl", init_method=f"file://{store.name}", rank=0, world_size=1)
        try:
            x = torch.arange(1024, dtype=torch.float32, device="cuda")
            dist.all_reduce(x)
            torch.cuda.synchronize()
            error = _max_error(x, torch.arange(1024, dtype=torch.float32))
        finally:
            dist.destroy_process_group()
    return [("NCCL one-process all-reduce", "libnccl", error, 0.0)]


def _probe_rtc(torch):  # type: ignore[no-untyped-def]
    code = "template <typename T> T scaled(T x, T y) { return 2 * x + y; }"
    kernel = torch.cuda.jiterator._create_jit_fn(code)
    x, y = torch.randn(4096), torch.randn(4096)
    return [("NVRTC runtime-compiled kernel (jiterator)", "libnvrtc", _max_error(kernel(x.cuda(), y.cuda()), 2 * x + y),
             1e-5)]


def _probe_sparselt(torch):  # type: ignore[no-untyped-def]
    if not torch.backends.cusparselt.is_available():
        raise LookupError("torch.backends.cusparselt.is_available() is False")
    from torch.sparse import SparseSemiStructuredTensor, to_sparse_semi_structured

    SparseSemiStructuredTensor._FORCE_CUTLASS = False  # cuSPARSELt, not CUTLASS
    mask = torch.tensor([1, 1, 0, 0], dtype=torch.bool).tile(128, 32)
    a = torch.randn(128, 128, dtype=torch.float16) * mask
    b = torch.randn(128, 64, dtype=torch.float16)
    product = to_sparse_semi_structured(a.cuda()) @ b.cuda()
    return [("cuSPARSELt 2:4 sparse matmul", "libcusparseLt", _max_error(product, (a.float() @ b.float()).half()), 0.5)]


def _probe_vision(torch):  # type: ignore[no-untyped-def]
    import torchvision

    boxes = torch.rand(512, 4) * 100
    boxes[:, 2:] += boxes[:, :2]
    scores = torch.rand(512)
    gpu = torchvision.ops.nms(boxes.cuda(), scores.cuda(), 0.5).cpu()
    same = gpu.tolist() == torchvision.ops.nms(boxes, scores, 0.5).tolist()
    return [("torchvision nms (its CUDA kernel)", "_C", 0.0 if same else 1.0, 0.0)]


def _probe_audio(torch):  # type: ignore[no-untyped-def]
    import torchaudio

    x = torch.rand(2, 4096) * 2 - 1
    a, b = torch.tensor([1.0, -0.5]), torch.tensor([0.5, 0.5])
    lfilter = torchaudio.functional.lfilter
    return [("torchaudio lfilter (its CUDA kernel)", "libtorchaudio", _max_error(lfilter(x.cuda(), a.cuda(), b.cuda()),
                                                                                 lfilter(x, a, b)), 1e-4)]


def _relative(gpu, ref) -> float:  # type: ignore[no-untyped-def]
    return float(((gpu.detach().double() - ref.detach().double()).abs().max() /
                  ref.detach().double().abs().max().clamp(min=1e-12)).item())


def _probe_scatter(torch):  # type: ignore[no-untyped-def]
    import torch_scatter

    src, index = torch.rand(4096), torch.randint(0, 64, (4096,))
    gpu = torch_scatter.scatter_add(src.cuda(), index.cuda(), dim=0, dim_size=64)
    return [("torch-scatter scatter_add (its CUDA kernel)", "_scatter_cuda",
             _max_error(gpu, torch.zeros(64).index_add_(0, index, src)), 1e-4)]


def _probe_causal_conv1d(torch):  # type: ignore[no-untyped-def]
    """causal_conv1d_fn against a depthwise conv1d padded on the left only (plain torch, on the GPU: cuDNN)."""
    import torch.nn.functional as F
    from causal_conv1d import causal_conv1d_fn

    batch, dim, length, width = 2, 64, 512, 4
    x, weight, bias = torch.randn(batch, dim, length), torch.randn(dim, width), torch.randn(dim)
    ours = causal_conv1d_fn(x.cuda(), weight.cuda(), bias.cuda(), activation="silu")
    ref = F.silu(F.conv1d(F.pad(x.double(), (width - 1, 0)), weight.double().unsqueeze(1), bias.double(), groups=dim))
    return [("causal-conv1d causal_conv1d_fn (its CUDA kernel)", "causal_conv1d_cuda", _max_error(ours, ref), 1e-3)]


def _probe_mamba(torch):  # type: ignore[no-untyped-def]
    """selective_scan_fn against the package's own pure-torch selective_scan_ref (relative error)."""
    from mamba_ssm.ops.selective_scan_interface import selective_scan_fn, selective_scan_ref

    batch, dim, state, length = 2, 32, 16, 256
    u, delta, z = (torch.randn(batch, dim, length, device="cuda") for _ in range(3))
    A, D = -torch.rand(dim, state, device="cuda"), torch.randn(dim, device="cuda")
    B, C = (torch.randn(batch, state, length, device="cuda") for _ in range(2))
    ours = selective_scan_fn(u, delta, A, B, C, D, z, None, True)
    ref = selective_scan_ref(u, delta, A, B, C, D, z, None, True)
    return [("mamba-ssm selective_scan_fn (its CUDA kernel)", "selective_scan_cuda", _relative(ours, ref), 1e-3)]


# Extensions of a stack: probed where their module imports (a stack without them skips the row).
EXTENSIONS = {"torch_scatter": "torch_scatter", "causal_conv1d": "causal_conv1d", "mamba_ssm": "mamba_ssm"}
LABELS = {"cublas": "cuBLAS/cuBLASLt matmul (float32, bfloat16)", "cufft": "cuFFT fft/ifft round trip",
          "curand": "cuRAND uniform sample", "cusolver": "cuSOLVER Cholesky (torch.linalg)",
          "cusparse": "cuSPARSE sparse x dense product", "cudnn": "cuDNN convolution",
          "nccl": "NCCL one-process all-reduce", "nvrtc": "NVRTC runtime-compiled kernel (jiterator)",
          "cusparselt": "cuSPARSELt 2:4 sparse matmul", "torchvision": "torchvision nms (its CUDA kernel)",
          "torchaudio": "torchaudio lfilter (its CUDA kernel)",
          "torch_scatter": "torch-scatter scatter_add (its CUDA kernel)",
          "causal_conv1d": "causal-conv1d causal_conv1d_fn (its CUDA kernel)",
          "mamba_ssm": "mamba-ssm selective_scan_fn (its CUDA kernel)"}
PROBES = {"cublas": _probe_blas, "cufft": _probe_fft, "curand": _probe_rand, "cusolver": _probe_solver,
          "cusparse": _probe_sparse, "cudnn": _probe_dnn, "nccl": _probe_nccl, "nvrtc": _probe_rtc,
          "cusparselt": _probe_sparselt, "torchvision": _probe_vision, "torchaudio": _probe_audio,
          "torch_scatter": _probe_scatter, "causal_conv1d": _probe_causal_conv1d, "mamba_ssm": _probe_mamba}


def gpu_probes(torch, why_not: str | None) -> list[dict[str, object]]:  # type: ignore[no-untyped-def]
    """One row per probe: what was compared, the library file that answered, the error and its tolerance."""
    rows: list[dict[str, object]] = []
    for key, run in PROBES.items():
        if key in ("torchvision", "torchaudio") and key not in sys.modules or \
                key in EXTENSIONS and importlib.util.find_spec(EXTENSIONS[key]) is None:
            rows.append({"probe": key, "name": LABELS[key], "skipped": f"{key} is not installed"})
        elif why_not:
            rows.append({"probe": key, "name": LABELS[key], "skipped": why_not})
        else:
            try:
                for name, stem, error, tolerance in run(torch):
                    rows.append({"probe": key, "name": name, "library": _answered(stem), "error": error,
                                 "tolerance": tolerance})
            except LookupError as exc:  # the library is not in this environment ("where present")
                rows.append({"probe": key, "name": LABELS[key], "skipped": f"not present: {exc}"})
            except Exception as exc:  # a probe's failure is its row, never the end of the others
                rows.append({"probe": key, "name": LABELS[key], "failed": f"{type(exc).__name__}: {str(exc)[:300]}"})
    return rows


def main() -> None:
    report: dict[str, object] = {"python": sys.executable, "modules": {}}
    modules: dict[str, object] = report["modules"]  # type: ignore[assignment]
    for name in ("torch", "torchvision", "torchaudio"):
        try:
            module = __import__(name)
            local = __import__(name + ".version", fromlist=["__version__"]).__version__
            modules[name] = {"file": module.__file__, "version": local}
        except Exception as exc:
            modules[name] = {"error": f"{type(exc).__name__}: {exc}"}
    why_not = "torch does not import"
    try:
        import torch

        report["cuda_build"] = torch.version.cuda
        report["available"] = bool(torch.cuda.is_available())
        why_not = None if report["available"] else ("no GPU: torch.cuda.is_available() is False" if torch.version.cuda
                                                    else "torch is a CPU build")
        if report["available"]:
            report["capability"] = list(torch.cuda.get_device_capability(0))
            report["device"] = torch.cuda.get_device_name(0)
            report["arch_list"] = list(torch.cuda.get_arch_list())
            report["sum"] = float(torch.ones(4, device="cuda").sum().item())
            report["cudnn"] = torch.backends.cudnn.version()
    except Exception as exc:
        report["error"] = f"{type(exc).__name__}: {exc}"
    report["gpu_probes"] = gpu_probes(sys.modules.get("torch"), why_not or report.get("error"))  # type: ignore[arg-type]
    report["maps"] = _maps()
    print("TORCHFORGE-PROBE " + json.dumps(report))


if __name__ == "__main__":
    main()
