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
