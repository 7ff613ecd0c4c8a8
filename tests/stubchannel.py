"""The stand-in channel of the tests lives in torchforge.standin (`torchforge standin-channel` makes one from
the command line); this module keeps the tests' and benchmarks' imports."""

from torchforge.standin import (  # noqa: F401
    PLATFORM_ARCH, SUBDIR, Stub, base_python, make_stub_channel, patchelf_executable, python_stub, recipe_requirements,
    stub_for, stub_version, write_stub,
)
