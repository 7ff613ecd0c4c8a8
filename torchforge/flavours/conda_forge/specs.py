"""A conda-forge recipe's requirement specs in each engine's form: conda-build keeps the feedstock's Jinja
functions (pin_subpackage, compiler ...), rattler-build's recipe.yaml writes them as its own expressions; and
the explicit version a spec pins.
"""

from __future__ import annotations

import re

from torchforge.templates import yaml_scalar


_JINJA_SPEC = re.compile(r"^(pin_subpackage|pin_compatible|compiler|stdlib) ([\w-]+)(?: (exact|x[.x]*))?$")


def conda_build_spec(spec: str) -> str:
    """One requirement in meta.yaml syntax: the data's `pin_subpackage libtorch exact` becomes conda-build's
    Jinja call; any other spec is a YAML scalar."""
    found = _JINJA_SPEC.match(spec)
    if found is None:
        return yaml_scalar(spec)
    function, name, pin = found.groups()
    argument = ", exact=True" if pin == "exact" else f", max_pin='{pin}'" if pin else ""
    return "{{ " + f"{function}('{name}'{argument})" + " }}"


def rattler_build_spec(spec: str) -> str:
    """One requirement in recipe.yaml syntax: the data's `pin_subpackage libtorch x.x` becomes rattler-build's
    `${{ pin_subpackage('libtorch', upper_bound='x.x') }}`; any other spec is a YAML scalar."""
    found = _JINJA_SPEC.match(spec)
    if found is None:
        return yaml_scalar(_explicit_version(spec))
    function, name, pin = found.groups()
    argument = ", exact=True" if pin == "exact" else f", upper_bound='{pin}'" if pin else ""
    return "${{ " + f"{function}('{name}'{argument})" + " }}"


def _explicit_version(spec: str) -> str:
    """rattler-build refuses a bare version (`cuda-version 13.0`); conda-build reads `name X.Y` as `X.Y.*` and a
    bare version followed by a build string as exact (conda_build/utils.py, ensure_valid_spec): say so explicitly."""
    fields = spec.split()
    if len(fields) < 2 or not re.fullmatch(r"[0-9a-zA-Z.]+", fields[1]):
        return spec
    fields[1] = f"{fields[1]}.*" if len(fields) == 2 else f"=={fields[1]}"
    return " ".join(fields)
