"""`torchforge verify`'s GPU probes (torchforge/binaries/gpu_probe.py): on this machine, which has no GPU, each
probe's row says it was not run and why, and the exit is 0 where nothing else failed; the verdict on a probe's
answer (within its tolerance of the CPU's, from a library inside the prefix, named with its package). The probes
themselves run on the GPU machine: tests/gpu/verify_stack.sh."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.test_verify_python import environment, forge
from torchforge.binaries import gpu_probe
from torchforge.binaries.verify import probe_checks

# the probe's questions, answered as torch does on a machine without a GPU
CUDA_TORCH_NO_GPU = "from . import version\nclass cuda:\n    is_available = staticmethod(lambda: False)\n"


def test_without_a_gpu_each_probe_says_it_was_not_run_and_why(tmp_path: Path) -> None:
    prefix = environment(tmp_path, CUDA_TORCH_NO_GPU)
    version = next(prefix.glob("lib/python3*/site-packages/torch/version.py"))
    version.write_text("__version__ = '2.11.0+cu130'\ncuda = '13.0'\n")  # a CUDA build, on a machine without a GPU
    (version.parent.parent / "causal_conv1d").mkdir()  # an extension of the stack: its probe is asked for
    (version.parent.parent / "causal_conv1d" / "__init__.py").write_text("")
    result = forge("verify", str(prefix), "--python", sys.executable, "--want", "cpu", cwd=tmp_path,
                   env={"COLUMNS": "400"})
    text = " ".join(result.stdout.split())
    assert result.returncode == 0, text + result.stderr
    absent = {"torchvision", "torchaudio", *gpu_probe.EXTENSIONS} - {"causal_conv1d"}
    for key, label in gpu_probe.LABELS.items():
        why = f"{key} is not installed" if key in absent else "no GPU: torch.cuda.is_available() is False"
        assert f"GPU probe: {label} │ not run │ {why} │" in text, (label, text)
    assert "FAILED" not in text


def test_on_a_cpu_build_the_probes_say_so(tmp_path: Path) -> None:
    prefix = environment(tmp_path, CUDA_TORCH_NO_GPU)  # version.py: cuda = None, a CPU build
    result = forge("verify", str(prefix), "--python", sys.executable, "--want", "cpu", cwd=tmp_path,
                   env={"COLUMNS": "400"})
    text = " ".join(result.stdout.split())
    assert result.returncode == 0, text
    assert f"GPU probe: {gpu_probe.LABELS['cufft']} │ not run │ torch is a CPU build │" in text


def test_a_probe_answer_passes_within_tolerance_from_the_prefix_and_fails_otherwise(tmp_path: Path) -> None:
    prefix = tmp_path / "env"
    (prefix / "conda-meta").mkdir(parents=True)
    library = prefix / "lib" / "libcufft.so.12"
    library.parent.mkdir()
    library.write_bytes(b"")
    record = {"name": "nvidia-cufft", "files": ["lib/libcufft.so.12"]}
    (prefix / "conda-meta" / "nvidia-cufft-12.0.0.61-whl_0.json").write_text(json.dumps(record))
    elsewhere = tmp_path / "system" / "libcufft.so.12"
    elsewhere.parent.mkdir()
    elsewhere.write_bytes(b"")
    rows = [{"probe": "cufft", "name": "cuFFT", "library": str(library), "error": 3.6e-06, "tolerance": 1e-4},
            {"probe": "cufft", "name": "too far", "library": str(library), "error": 0.5, "tolerance": 1e-4},
            {"probe": "cufft", "name": "outside", "library": str(elsewhere), "error": 0.0, "tolerance": 1e-4},
            {"probe": "nccl", "name": "NCCL", "failed": "DistBackendError: NCCL error"}]
    checks = {c.name: c for c in probe_checks(prefix, rows)}
    assert checks["GPU probe: cuFFT"].ok and checks["GPU probe: cuFFT"].detail == (
        "max error 3.6e-06 against the CPU (tolerance 0.0001); answered by lib/libcufft.so.12 "
        "(nvidia-cufft-12.0.0.61-whl_0)")
    assert not checks["GPU probe: too far"].ok
    assert not checks["GPU probe: outside"].ok and "(outside the prefix)" in checks["GPU probe: outside"].detail
    assert not checks["GPU probe: NCCL"].ok and checks["GPU probe: NCCL"].detail.startswith("failed: DistBackendError")
