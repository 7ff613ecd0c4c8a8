"""Recipe templates, below every flavour: the recipe formats, the one Jinja environment over recipe_templates/
(a checkout) or torchforge/_templates (an installed wheel) with its quoting filters, and the patch files a recipe
folder carries. Every flavour and the container images render through here, so a template renders the same
whoever asks."""

from __future__ import annotations

import io
import json
import re
import shlex
from collections.abc import Sequence
from enum import Enum
from functools import cache
from importlib import resources
from pathlib import Path

import jinja2

from torchforge.errors import UsageError


class RecipeFormat(str, Enum):
    CONDA_BUILD = "conda-build"
    RATTLER_BUILD = "rattler-build"


def templates_dir() -> Path:
    installed = resources.files("torchforge").joinpath("_templates")
    if installed.is_dir():
        return Path(str(installed))
    checkout = Path(__file__).resolve().parent.parent / "recipe_templates"
    if checkout.is_dir():
        return checkout
    raise UsageError("torchforge's recipe templates are missing", "reinstall torchforge (pip install torchforge)")


_PLAIN_SCALAR = re.compile(r"^[A-Za-z_/][A-Za-z0-9_ .*<>=!,|+/:-]*$")
_YAML_WORDS = {"true", "false", "yes", "no", "on", "off", "null", "~"}


def yaml_scalar(value: object) -> str:
    """A YAML scalar for `value`: plain when unambiguous, otherwise double-quoted (JSON is valid YAML)."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, int):
        return str(value)
    text = str(value)
    if _PLAIN_SCALAR.match(text) and ": " not in text and " #" not in text and text.lower() not in _YAML_WORDS \
            and not text.endswith(":"):
        return text
    return json.dumps(text)


def shell_word(value: str, literal: bool = False) -> str:
    """Quote for POSIX sh while keeping $VAR and ${VAR:-x} expansions of torchforge's own values live (double
    quotes when needed); a `literal` value (the user's --env) is single-quoted: nothing in it runs or expands."""
    if not literal and "$" in value and "'" not in value and "$ORIGIN" not in value:
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("`", "\\`") + '"'
    return shlex.quote(value)


def batch_value(value: str, literal: bool = False) -> str:
    """A value inside cmd.exe's `set "NAME=value"`: a `literal` one (the user's --env) has `%` doubled so that no
    %VAR% expands; torchforge's own values keep their %VAR% references. `"` and line breaks are refused earlier."""
    return value.replace("%", "%%") if literal else value


def ruamel_scalar(value: object) -> str:
    """A scalar as ruamel.yaml writes it in a block (the conda-forge flavour's recipes were YAML dumps: this keeps
    their every quote, e.g. a plain `${{ compiler('c') }}`, a double-quoted `"{{ compiler('c') }}"`)."""
    from ruamel.yaml import YAML

    yaml = YAML()
    yaml.width = 4096
    text = io.StringIO()
    yaml.dump([value], text)
    return text.getvalue().removeprefix("- ").removesuffix("\n")


def block_list(pad: str, key: str, items: Sequence[object]) -> str:
    """`key: []`, or `key:` and one `- item` line per item, at `pad` (ruamel.yaml's block style), no last newline."""
    if not items:
        return f"{pad}{key}: []"
    return "\n".join([f"{pad}{key}:", *(f"{pad}- {ruamel_scalar(item)}" for item in items)])


def rattler_env(name: str) -> str:
    """rattler-build passes no outside variable to the script unless the recipe forwards it like this."""
    return '${{ env.get("' + name + '", default="") }}'


@cache
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["yaml"] = yaml_scalar
    env.filters["shell"] = shell_word
    env.filters["batch"] = batch_value
    env.filters["rattler_env"] = rattler_env
    env.filters["ruamel"] = ruamel_scalar
    env.globals["block_list"] = block_list
    env.filters["json"] = json.dumps  # a double-quoted YAML scalar, as given (Jinja's tojson escapes <, > and &)
    return env


def render_template(template: str, **fields: object) -> str:
    """One template of recipe_templates/ with the given fields (the same environment and filters as the recipes)."""
    return environment().get_template(template).render(**fields)


def patch_files(patches: Sequence[Path]) -> dict[str, str | bytes]:
    """The --patch files a recipe folder carries, by name."""
    return {p.name: p.read_bytes() for p in patches}
