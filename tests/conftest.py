from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED_REFERENCE = REPO.parent / "shared" / "reference"


@pytest.fixture(scope="session")
def reference_dir() -> Path:
    if not SHARED_REFERENCE.is_dir():
        pytest.skip("../shared/reference is not beside this checkout")
    return SHARED_REFERENCE


@pytest.fixture()
def bundled_libraries(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder holding empty files under every name a CUDA recipe bundles into torch/lib (bundle.toml), and
    the recipes' folder variables (CUDNN_LIB_DIR ...) pointing at it, for checks that only look for them."""
    from torchforge import data as tables

    folder = tmp_path_factory.mktemp("bundled")
    data = tables.load()
    for rule in data.bundle.linux:
        for cuda in data.cuda.toolkits:
            for lib in rule.libs:
                (folder / lib.name.format(cuda=cuda, cuda_major=cuda.split(".")[0]).replace("*", "")).touch()
    for directory in data.bundle.linux_dirs.values():
        monkeypatch.setenv(directory.var, str(folder))
    return folder
