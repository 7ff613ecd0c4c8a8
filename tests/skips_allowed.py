"""Skips that cannot be helped on the project's machines. In CI (`CI` or `TORCHFORGE_STRICT_SKIPS` set, as
`.ci/run` does) every other skip fails the run, so a toolkit bump (nvcc no longer 13.0) or a missing tool
cannot silently drop tests; `make test` prints this list at the end.

Each entry: a test node id (parametrized ids match by prefix `id[`) and why skipping it is right on these
machines. The project's machines (root in a container, nvcc 13.0, gcc 12, no GPU, no conda) run every test
today, so the list is empty: add an entry only with the reason it cannot be helped.
"""

from __future__ import annotations

import re

import os

ALLOWED_SKIPS: tuple[tuple[str, str], ...] = ()
# .ci/run sets TORCHFORGE_NO_CONTAINER only when it could not install podman or make its images (and prints why):
# then, and only then, the real --container builds, the gitlab-ci-local run (its jobs run in those images) and
# the container benchmark may skip.
if os.environ.get("TORCHFORGE_NO_CONTAINER"):
    ALLOWED_SKIPS += (("tests/test_container_build.py::", os.environ["TORCHFORGE_NO_CONTAINER"]),
                      ("tests/test_container_conda_forge.py::", os.environ["TORCHFORGE_NO_CONTAINER"]),
                      ("tests/test_ci_local.py::", os.environ["TORCHFORGE_NO_CONTAINER"]),
                      ("bench/bench_container.py::", os.environ["TORCHFORGE_NO_CONTAINER"]))


def strict() -> bool:
    """In CI (`CI` or `TORCHFORGE_STRICT_SKIPS` set) a skip this list does not allow fails the run."""
    return bool(os.environ.get("CI") or os.environ.get("TORCHFORGE_STRICT_SKIPS"))


def allowed(nodeid: str, reason: str) -> bool:
    del reason  # the node id decides; the reason is printed next to it
    nodeid = re.sub(r"@[\w-]+$", "", nodeid)  # `--dist loadgroup`'s xdist_group suffix (tests/conftest.py)
    return any(nodeid == pattern or nodeid.startswith(pattern + ("" if pattern.endswith("::") else "["))
               for pattern, _why in ALLOWED_SKIPS)
