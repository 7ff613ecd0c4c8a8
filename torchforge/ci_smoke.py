"""The test stage's smoke check of a built PyTorch, run by the Python of a fresh environment on a CI runner.

Standalone on purpose: it imports nothing but the standard library and torch, because it runs in the
environment the packages were just installed into, where torchforge is not. `torchforge ci` writes this file's
text into the test job (a heredoc), so it can also be run as it is:

    python ci_smoke.py --version 2.10.0 --cuda     # on a GPU machine
    python ci_smoke.py --version 2.13.0            # a CPU build

Checks: torch imports from this environment with the expected version; a matmul gives the right numbers; with
--cuda, CUDA is available, the same matmul runs on the GPU, and the GPU's architecture is one the package was
compiled for (sm_XY in torch.cuda.get_arch_list(), or PTX compute_XY at or below it, which the driver compiles).
Exit 0 when all hold, 1 with one line per failed check otherwise, 3 when this Python cannot import torch at all
(the line says which Python and why: run it with the environment's own Python, where the package is installed).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


def _arch_covered(capability: tuple[int, int], arch_list: list[str]) -> bool:
    major, minor = capability
    number = major * 10 + minor
    # sm_90a / sm_100f: cubins with the arch-specific (family) features of that same compute capability.
    if {f"sm_{number}", f"sm_{number}a", f"sm_{number}f"} & set(arch_list):
        return True
    # PTX is compiled by the driver for the GPU it runs on, at or above its own compute capability.
    ptx = [int(a[len("compute_"):]) for a in arch_list if a.startswith("compute_") and a[len("compute_"):].isdigit()]
    return any(p <= number for p in ptx)


def _matmul(t: Any, device: str) -> float:
    a = t.arange(6, dtype=t.float32, device=device).reshape(2, 3)
    product = a @ a.T
    # [[0,1,2],[3,4,5]] @ its transpose = [[5,14],[14,50]]
    expected = t.tensor([[5.0, 14.0], [14.0, 50.0]], device=device)
    return float((product - expected).abs().max().item())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--version", required=True, help="the pytorch version the package should report")
    parser.add_argument("--cuda", action="store_true", help="the package is a CUDA build: check the GPU too")
    args = parser.parse_args(argv)
    failed: list[str] = []
    try:
        import torch
    except (ImportError, OSError) as exc:  # not installed here, or a library it loads is missing
        print(f"FAILED: {sys.executable} cannot import torch ({type(exc).__name__}: {exc}); run this check with "
              "the Python of the environment the package was installed into", file=sys.stderr)
        return 3

    print(f"torch {torch.__version__} from {torch.__file__}")
    if torch.__version__.split("+")[0] != args.version:
        failed.append(f"torch reports version {torch.__version__}, the package is {args.version}")
    error = _matmul(torch, "cpu")
    print(f"cpu matmul: max error {error}")
    if error > 1e-5:
        failed.append(f"a 2x3 matmul on the CPU is off by {error}")
    if args.cuda:
        failed += _check_cuda(torch)
    for line in failed:
        print(f"FAILED: {line}", file=sys.stderr)
    print("smoke test " + ("failed" if failed else "passed"))
    return 1 if failed else 0


def _check_cuda(t: Any) -> list[str]:
    print(f"torch.version.cuda {t.version.cuda}")
    if not t.cuda.is_available():
        return ["torch.cuda.is_available() is False: no GPU or no driver on this runner, or a CPU-only build"]
    failed: list[str] = []
    capability = t.cuda.get_device_capability(0)
    arch_list = list(t.cuda.get_arch_list())
    print(f"GPU {t.cuda.get_device_name(0)}, sm_{capability[0]}{capability[1]}; package archs {' '.join(arch_list)}")
    if not _arch_covered(capability, arch_list):
        failed.append(f"the GPU's sm_{capability[0]}{capability[1]} is not in the package's arch list {arch_list}")
    error = _matmul(t, "cuda")
    print(f"cuda matmul: max error {error}")
    if error > 1e-3:  # TF32 may be on for float32 matmuls
        failed.append(f"a 2x3 matmul on the GPU is off by {error}")
    return failed


if __name__ == "__main__":
    sys.exit(main())
