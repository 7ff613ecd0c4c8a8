"""`torchforge matrix --json` calls every official conda package of PyTorch 1.4 - 2.5 official, with its exact
build string. The table of packages is tests/fixtures/official_conda_packages.toml (sources cited there)."""

from __future__ import annotations

import json
import re
import tomllib
from collections import defaultdict
from pathlib import Path

import pytest

from torchforge.cli import main

TABLE = tomllib.loads((Path(__file__).parent / "fixtures" / "official_conda_packages.toml").read_text())
_NAME = re.compile(r"^pytorch-(?P<version>\d+\.\d+\.\d+)-py(?P<python>\d\.\d+)_(?:cpu_|cuda(?P<cuda>[\d.]+)_cudnn[\d.]+_)?0$")
PLATFORMS = ("linux-64", "win-64", "osx-64", "osx-arm64")


def _cuda_xy(tag: str) -> str:
    """'11.0.221' / '11.1' -> X.Y; the Windows DLL tags '102' / '92' -> '10.2' / '9.2'."""
    return ".".join(tag.split(".")[:2]) if "." in tag else f"{tag[:-1]}.{tag[-1]}"


def _groups() -> dict[tuple[str, str], dict[tuple[str, str], str]]:
    """(version, platform) -> {(accel, python): build string}."""
    groups: dict[tuple[str, str], dict[tuple[str, str], str]] = defaultdict(dict)
    for platform in PLATFORMS:
        for name in TABLE[platform]:
            match = _NAME.match(name)
            assert match, name
            accel = _cuda_xy(match["cuda"]) if match["cuda"] else "cpu"
            groups[(match["version"], platform)][(accel, match["python"])] = name.split("-", 2)[2]
    return groups


GROUPS = _groups()


def test_the_table_covers_every_release_from_1_4_to_2_5() -> None:
    minors = {".".join(version.split(".")[:2]) for version, _ in GROUPS}
    assert minors == {f"1.{m}" for m in range(4, 14)} | {f"2.{m}" for m in range(6)}
    assert sum(len(v) for v in GROUPS.values()) == sum(len(TABLE[p]) for p in PLATFORMS)


@pytest.mark.parametrize(("version", "platform"), sorted(GROUPS), ids=lambda v: str(v))
def test_matrix_json_calls_each_official_package_official(version: str, platform: str,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    expected = GROUPS[(version, platform)]
    accels = ",".join(sorted({a for a, _ in expected}))
    pythons = ",".join(sorted({p for _, p in expected}))
    main(["matrix", "--pytorch", version, "--cuda", accels, "--py", pythons, "--platform", platform, "--json"])
    rows = {(row["cuda"], row["python"]): row for row in json.loads(capsys.readouterr().out) if row["package"] == "pytorch"}
    wrong = {
        key: (rows[key]["status"], rows[key]["build_string"], rows[key]["refusals"] or rows[key]["warnings"])
        for key, build in expected.items()
        if rows[key]["status"] != "official" or rows[key]["build_string"] != build
    }
    assert not wrong, wrong
