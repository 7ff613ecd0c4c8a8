"""torchforge: conda recipes and packages for PyTorch and MAGMA, built the way the official ones were."""

__version__ = "0.1.0"
