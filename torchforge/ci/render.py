"""A `CiPlan` as the text of its provider's file: one ruamel.yaml configuration for every file torchforge
emits (block style, no wrapping)."""

from __future__ import annotations

import io
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq

from torchforge.ci import CiPlan, Provider
from torchforge.ci.github import github_workflow
from torchforge.ci.gitlab import gitlab_pipeline


def _yaml() -> YAML:
    # One formatting for every file torchforge emits: block style, 2-space maps, "- " inside the parent's
    # indentation, no line wrapping (a wrapped `if:` expression is hard to read and diff).
    yaml = YAML(typ="rt")
    yaml.indent(mapping=2, sequence=4, offset=2)
    yaml.width = 4096
    yaml.default_flow_style = False
    return yaml


def _plain(value: Any) -> Any:
    """Lists become CommentedSeq so the dumper uses block style for every level."""
    if isinstance(value, CommentedMap):
        for key in list(value):
            value[key] = _plain(value[key])
        return value
    if isinstance(value, list):
        return CommentedSeq(_plain(v) for v in value)
    return value


def render(plan: CiPlan, provider: Provider) -> str:
    doc = github_workflow(plan) if provider is Provider.GITHUB else gitlab_pipeline(plan)
    buffer = io.StringIO()
    _yaml().dump(_plain(doc), buffer)
    return buffer.getvalue()
