"""Small stand-in wheels shaped like the official PyTorch stack: the same names and file names, the same
Requires-Dist (a subset of torch 2.10.0's, with its real pins), the same `<top>/version.py` build tags, the
same library folders (`torch/lib`, `site-packages/nvidia/*/lib`, `torchvision.libs`) and RPATHs (torch's
DT_RPATH list into nvidia/*/lib, torchvision's build-machine RPATH). The libraries are real ELF files built with
gcc, linked to each other by SONAME as the real ones are, so the loader really resolves them.
"""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

PY = f"{sys.version_info.major}.{sys.version_info.minor}"
PYTAG = f"cp{sys.version_info.major}{sys.version_info.minor}"
TORCH = "2.10.0"
VISION = "0.25.0"
# torch 2.10.0's real pins (PyPI METADATA) for the components the stand-ins carry.
PINS = {"nvidia-cuda-runtime-cu12": "12.8.90", "nvidia-cublas-cu12": "12.8.4.1", "nvidia-cudnn-cu12": "9.10.2.21"}
TRITON = "3.6.0"
MARK = 'platform_system == "Linux" and platform_machine == "x86_64"'
NVIDIA_RPATH = ":".join(f"$ORIGIN/../../nvidia/{d}/lib" for d in ("cudnn", "cublas", "cuda_runtime")) + ":$ORIGIN"


@dataclass(frozen=True)
class Lib:
    """A shared library: its file name (also its SONAME), the libraries it links, its RPATH."""

    name: str
    needs: tuple[str, ...] = ()
    rpath: str = ""
    runpath: bool = False
    soname: str = ""  # when not the file name (a wheel's hashed copy of libcudart keeps SONAME libcudart.so.13)


def _record(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build_lib(lib: Lib, out: Path, search: Path) -> bytes:
    """Compile an ELF shared library with DT_NEEDED entries on the given SONAMEs (found in `search`)."""
    src = out / f"{lib.name}.c"
    symbol = lib.name.split(".")[0].replace("-", "_")
    src.write_text(f"int {symbol}_answer(void) {{ return 42; }}\n")
    target = out / lib.name
    argv = ["gcc", "-shared", "-fPIC", "-o", str(target), str(src), f"-Wl,-soname,{lib.soname or lib.name}", f"-L{search}",
            "-Wl,--no-as-needed"]
    argv += [f"-l:{n}" for n in lib.needs]
    if lib.rpath:
        argv.append(f"-Wl,{'--enable-new-dtags' if lib.runpath else '--disable-new-dtags'},-rpath,{lib.rpath}")
    subprocess.run(argv, check=True, capture_output=True)
    (search / lib.name).write_bytes(target.read_bytes())  # later libraries link against it by SONAME
    return target.read_bytes()


def write_wheel(out: Path, name: str, version: str, tag: str, files: dict[str, bytes], requires: list[str],
                build_tag: str = "") -> Path:
    dist = f"{name}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: {version}\nSummary: stand-in\n"
    meta += "License: BSD-3-Clause\n" + "".join(f"Requires-Dist: {r}\n" for r in requires)
    files = {**files, f"{dist}/METADATA": meta.encode(), f"{dist}/LICENSE": b"stand-in licence text\n",
             f"{dist}/WHEEL": f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: {tag}\n".encode()}
    record = "".join(f"{n},{_record(d)},{len(d)}\n" for n, d in files.items()) + f"{dist}/RECORD,,\n"
    wheel = out / f"{name}-{version}{'-' + build_tag if build_tag else ''}-{tag}.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        for member, data in files.items():
            info = zipfile.ZipInfo(member)
            info.external_attr = (0o755 if ".so" in member else 0o644) << 16
            zf.writestr(info, data)
        zf.writestr(f"{dist}/RECORD", record)
    return wheel


class Factory:
    """Builds the stand-in wheels into `out`; libraries are compiled once into `out/libs`."""

    def __init__(self, out: Path, libs: Path | None = None) -> None:
        """`libs`: another factory's compiled libraries, to link against (its torch's SONAMEs)."""
        self.out = out
        self.libs = libs or out / "libs"
        self.libs.mkdir(parents=True, exist_ok=True)
        self.work = out / "work"
        self.work.mkdir(parents=True, exist_ok=True)

    def stack(self, local: str = "cu128") -> list[Path]:
        """Components first: torch links their libraries by SONAME."""
        first = self.components() if local.startswith("cu") else []
        return [self.torch(local), self.torchvision(local), self.torchaudio(local), *first,
                *([self.triton()] if first else [])]

    def lib(self, lib: Lib) -> bytes:
        return build_lib(lib, self.work, self.libs)

    def component(self, project: str, folder: str, libs: list[Lib], requires: list[str] | None = None) -> Path:
        version = PINS[project]
        files = {"nvidia/__init__.py": b"", f"nvidia/{folder}/__init__.py": b""}
        for lib in libs:
            files[f"nvidia/{folder}/lib/{lib.name}"] = self.lib(lib)
        tag = "py3-none-manylinux2014_x86_64"
        return write_wheel(self.out, project.replace("-", "_"), version, tag, files, requires or [])

    def components(self) -> list[Path]:
        return [
            self.component("nvidia-cuda-runtime-cu12", "cuda_runtime", [Lib("libcudart.so.12", rpath="$ORIGIN", runpath=True)]),
            self.component("nvidia-cublas-cu12", "cublas", [Lib("libcublasLt.so.12", rpath="$ORIGIN", runpath=True),
                                                           Lib("libcublas.so.12", ("libcublasLt.so.12",), "$ORIGIN", True)]),
            # cuDNN 9's graph library links zlib (libz.so.1), which no wheel of the stack carries.
            self.component("nvidia-cudnn-cu12", "cudnn", [Lib("libcudnn.so.9", rpath="$ORIGIN", runpath=True),
                                                         Lib("libcudnn_graph.so.9", ("libz.so.1",), "$ORIGIN", True)],
                           ["nvidia-cublas-cu12"]),
        ]

    def torch(self, local: str = "cu128", python_tag: str = PYTAG) -> Path:
        cuda = local.startswith("cu")
        files = {"torch/__init__.py": TORCH_INIT.encode(),
                 "torch/version.py": (f"__version__ = '{TORCH}+{local}'\n"
                                      f"cuda = {repr(local[2:-1] + '.' + local[-1]) if cuda else None}\n").encode()}
        files["torch/lib/libc10.so"] = self.lib(Lib("libc10.so", rpath="$ORIGIN"))
        rpath = NVIDIA_RPATH if cuda else "$ORIGIN"
        if cuda:
            files["torch/lib/libc10_cuda.so"] = self.lib(Lib("libc10_cuda.so", ("libc10.so", "libcudart.so.12"), rpath))
            files["torch/lib/libtorch_cuda.so"] = self.lib(Lib(
                "libtorch_cuda.so", ("libc10_cuda.so", "libcudart.so.12", "libcublas.so.12", "libcudnn.so.9"), rpath))
        main = ("libc10.so", "libtorch_cuda.so") if cuda else ("libc10.so",)
        files["torch/lib/libtorch_python.so"] = self.lib(Lib("libtorch_python.so", main, rpath))
        files[f"torch/_C.{PYTAG}.so"] = self.lib(Lib(f"_C.{PYTAG}.so", ("libtorch_python.so",), rpath + ":$ORIGIN/lib"))
        requires = ["filelock", "typing-extensions>=4.10.0", 'setuptools; python_version >= "3.12"', "sympy>=1.13.3"]
        if cuda:
            requires += [f"{name}=={version}; {MARK}" for name, version in PINS.items()]
            requires.append(f"triton=={TRITON}; {MARK}")
        requires.append('optree>=0.13.0; extra == "optree"')
        return write_wheel(self.out, "torch", TORCH, f"{python_tag}-{python_tag}-manylinux_2_28_x86_64", files,
                           requires, build_tag="3" if cuda else "")

    def torchvision(self, local: str = "cu128", torch_pin: str = TORCH) -> Path:
        files = {"torchvision/__init__.py": b"from torchvision.version import __version__\n",
                 "torchvision/version.py": f"__version__ = '{VISION}+{local}'\n".encode()}
        cuda = ("libcudart.so.12", "libtorch_cuda.so") if local.startswith("cu") else ()
        # The real _C.so links torch's libraries with no RPATH to them and an RPATH of the build machine.
        files["torchvision/_C.so"] = self.lib(Lib("_C.so", ("libc10.so", *cuda), "/__w/_temp/conda_environment_1/lib"))
        if local.startswith("cu"):
            files["torchvision.libs/libcudart.e8e8b82a.so.12"] = self.lib(Lib("libcudart.e8e8b82a.so.12"))
            files["torchvision/image.so"] = self.lib(Lib("image.so", ("libcudart.e8e8b82a.so.12", "libc10.so"),
                                                         "$ORIGIN:$ORIGIN/../torchvision.libs", runpath=True))
        requires = ["numpy", f"torch (=={torch_pin})", "pillow (!=8.3.*,>=5.3.0)", "scipy ; extra == 'scipy'"]
        return write_wheel(self.out, "torchvision", VISION, f"{PYTAG}-{PYTAG}-manylinux_2_28_x86_64", files, requires)

    def torchaudio(self, local: str = "cu128") -> Path:
        files = {"torchaudio/__init__.py": b"from torchaudio.version import __version__\n",
                 "torchaudio/version.py": f"__version__ = '{TORCH}+{local}'\n".encode()}
        cuda = ("libcudart.so.12", "libtorch_cuda.so") if local.startswith("cu") else ()
        files["torchaudio/lib/libtorchaudio.so"] = self.lib(Lib("libtorchaudio.so", ("libc10.so", *cuda)))
        return write_wheel(self.out, "torchaudio", TORCH, f"{PYTAG}-{PYTAG}-manylinux_2_28_x86_64", files,
                           [f"torch=={TORCH}"])

    def triton(self) -> Path:
        files = {"triton/__init__.py": b"__version__ = '3.6.0'\n",
                 "triton/_C/libtriton.so": self.lib(Lib("libtriton.so"))}
        return write_wheel(self.out, "triton", TRITON, f"{PYTAG}-{PYTAG}-manylinux_2_27_x86_64.manylinux_2_28_x86_64",
                           files, ['importlib-metadata; python_version < "3.10"'])


# A torch stand-in that behaves like torch for `torchforge verify`: it loads its libraries the way torch does
# (its _C through the loader) and answers the questions verify asks; no GPU here, so CUDA is never available.
TORCH_INIT = """
import ctypes, os
from torch import version
from torch.version import __version__
_C = ctypes.CDLL(os.path.join(os.path.dirname(__file__), [n for n in os.listdir(os.path.dirname(__file__)) if n.startswith("_C.")][0]))
class cuda:
    @staticmethod
    def is_available():
        return False
"""
