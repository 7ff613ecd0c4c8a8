"""Upload targets: where packages go, from a URL on the command line or a named file in `channels/`.

Three kinds:

* `file:///abs/path`                       a directory channel on this machine (or a shared mount)
* `anaconda://OWNER`                       anaconda.org (or a compatible server given by `api_url`)
* `quetz+http(s)://HOST[:PORT]/CHANNEL`    a quetz server

A named target is `channels/<name>.toml`. Files hold the *name* of the environment variable with the
token (`token_env`), never the token itself: a file gets committed, copied and shared.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, ValidationError

from torchforge.errors import UsageError
from torchforge.fileops import check_dir, path_of_file_url, read_utf8
from torchforge.labels import check_labels


class TargetKind(str, Enum):
    DIRECTORY = "directory"
    ANACONDA = "anaconda"
    QUETZ = "quetz"


# The variables each kind reads when the target names none (anaconda-client's own, quetz's usual name).
DEFAULT_TOKEN_ENV: Mapping[TargetKind, str] = {
    TargetKind.ANACONDA: "ANACONDA_API_TOKEN",
    TargetKind.QUETZ: "QUETZ_API_KEY",
}

# anaconda.org owners and quetz channels: letters, digits, '-', '_', '.' (no path separators or spaces).
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class Target:
    """A parsed upload target. Exactly the fields of its kind are set."""

    name: str  # what the user typed: a URL or the name of a channels/*.toml file
    kind: TargetKind
    labels: tuple[str, ...] = ("main",)
    token_env: str | None = None
    description: str = ""
    path: Path | None = None  # directory
    owner: str | None = None  # anaconda
    api_url: str | None = None  # anaconda; None means the client's own default (anaconda.org)
    base_url: str | None = None  # quetz: http(s)://host:port
    channel: str | None = None  # quetz

    def __post_init__(self) -> None:
        check_labels(self.labels, self.name)  # every target, however made, holds only labels

    @property
    def url(self) -> str:
        if self.kind is TargetKind.DIRECTORY:
            assert self.path is not None
            return self.path.as_uri()
        if self.kind is TargetKind.ANACONDA:
            return f"anaconda://{self.owner}"
        return f"quetz+{self.base_url}/{self.channel}"

    @property
    def token_vars(self) -> tuple[str, ...]:
        """Environment variables that may hold the token, in the order they are read."""
        names: list[str] = []
        if self.token_env:
            names.append(self.token_env)
        default = DEFAULT_TOKEN_ENV.get(self.kind)
        if default and default not in names:
            names.append(default)
        return tuple(names)


_USERINFO = re.compile(r"(?<=://)[^/@\s]*@")
# A secret in a query string (quetz and others read ?token= / ?api_key=): refused like user:token@.
_QUERY_SECRET = re.compile(r"(?<=[?&])((?:api_?key|token|access_token|password|key)=)[^&#\s]*", re.IGNORECASE)


def redact_url(text: str) -> str:
    """`text` with any `user:password@` of a URL shown as `***@`, and any `?token=VALUE` as `?token=***`."""
    return _QUERY_SECRET.sub(r"\1***", _USERINFO.sub("***@", text))


def _reject_credentials(text: str, kind: TargetKind | None) -> None:
    """Credentials in a URL are refused rather than stripped or used: the URL is echoed in logs, written
    into CI files (`torchforge ci --upload-to`) and kept in shell history, and the project reads secrets
    only from the environment or the keyring. The message never repeats them."""
    if not _USERINFO.search(text) and not _QUERY_SECRET.search(text):
        return
    where = (f"export {DEFAULT_TOKEN_ENV[kind]}=<token>" if kind in DEFAULT_TOKEN_ENV
             else "put the token in the target's variable (ANACONDA_API_TOKEN, QUETZ_API_KEY) or the keyring")
    raise UsageError(
        f"{redact_url(text)!r} carries credentials in the URL (shown as ***); torchforge does not take secrets "
        "from URLs or flags",
        f"remove 'user:token@' or '?token=...' from the URL and {where} (or name a variable with token_env in "
        "channels/*.toml)",
    )


def parse_url(text: str, labels: tuple[str, ...] = ("main",), token_env: str | None = None) -> Target:
    """A target from its URL form. Raises UsageError with the accepted forms when `text` is none of them."""
    forms = "file:///abs/path, anaconda://OWNER or quetz+http(s)://HOST[:PORT]/CHANNEL"
    kind = (TargetKind.QUETZ if text.startswith("quetz+") else TargetKind.ANACONDA
            if text.startswith("anaconda://") else None)
    _reject_credentials(text, kind)
    labels = check_labels(labels, text)
    if text.startswith("file://"):
        path = path_of_file_url(text)
        if path is None:
            raise UsageError(f"{text!r} is not an absolute file URL", "write file:///absolute/path/to/channel")
        return Target(name=text, kind=TargetKind.DIRECTORY, labels=labels, path=path)
    if text.startswith("anaconda://"):
        owner = text[len("anaconda://") :].strip("/")
        if not _NAME.match(owner):
            raise UsageError(f"{text!r} does not name an anaconda.org owner", "write anaconda://OWNER, e.g. anaconda://my-org")
        return Target(name=text, kind=TargetKind.ANACONDA, labels=labels, owner=owner, token_env=token_env)
    if text.startswith(("quetz+http://", "quetz+https://")):
        parts = urlsplit(text[len("quetz+") :])
        if parts.query or parts.fragment:  # never silently dropped: it would not reach the server
            raise UsageError(f"{text!r} has a query or fragment, which a quetz target does not take",
                             "write quetz+http://HOST:PORT/CHANNEL")
        channel = parts.path.strip("/")
        try:
            parts.port  # noqa: B018 -- parsing it is the check: a port that is not a number raises here
        except ValueError:
            raise UsageError(f"{text!r} has an invalid port", "write quetz+http://HOST:PORT/CHANNEL, PORT a number") from None
        if not parts.hostname or not _NAME.match(channel):
            raise UsageError(f"{text!r} does not name a quetz channel", "write quetz+http://HOST:PORT/CHANNEL")
        base = f"{parts.scheme}://{parts.netloc}"
        return Target(name=text, kind=TargetKind.QUETZ, labels=labels, base_url=base, channel=channel, token_env=token_env)
    if text.startswith("/") or text.startswith("."):
        raise UsageError(f"{text!r} is a path, not a target URL", f"write it as file://{Path(text).resolve()}")
    raise UsageError(f"{text!r} is not a target URL or a named target", f"use {forms}, or a name from `torchforge channels`")


class _ChannelFile(BaseModel):
    """The schema of channels/<name>.toml. Unknown keys are errors, so a typo cannot silently drop a setting."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["directory", "anaconda", "quetz"]
    url: str | None = None  # directory: file:///...; quetz: http(s)://host:port/channel
    owner: str | None = None  # anaconda
    api_url: str | None = None  # anaconda-compatible server
    labels: tuple[str, ...] = ("main",)
    token_env: str | None = None
    description: str = ""


_FIELDS = tuple(_ChannelFile.model_fields)


def load_file(path: Path) -> Target:
    """Parse one channels/*.toml file into a Target named after the file."""
    try:
        raw = tomllib.loads(read_utf8(path))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"cannot read target file {path}: {exc}") from exc
    for secret_key in ("token", "api_key", "password", "api_token"):
        if secret_key in raw:
            raise UsageError(
                f"{path} stores a secret under {secret_key!r}",
                "remove it and set token_env = \"NAME_OF_ENV_VAR\"; the token itself belongs in that variable",
            )
    try:
        spec = _ChannelFile.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(file)'}: "
            + ("unknown key" if e["type"] == "extra_forbidden" else e["msg"])
            for e in exc.errors()
        )
        raise UsageError(f"{path} is not a valid target: {problems}", f"allowed keys: {', '.join(_FIELDS)}") from exc
    name = path.stem
    where = str(path)
    labels = check_labels(spec.labels, where)
    if spec.token_env is not None and not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", spec.token_env):
        raise UsageError(f"{where}: token_env {spec.token_env!r} is not an environment variable name",
                         "token_env holds the variable's name, e.g. \"MY_ANACONDA_TOKEN\", never the token")
    if spec.kind == "directory":
        if not spec.url or spec.owner or spec.api_url:
            raise UsageError(f"{where}: a directory target needs url = \"file:///...\" and no owner/api_url")
        parsed = parse_url(spec.url, labels)
        if parsed.kind is not TargetKind.DIRECTORY:
            raise UsageError(f"{where}: kind is directory but url is {spec.url!r}", "write url = \"file:///abs/path\"")
        return Target(name=name, kind=parsed.kind, labels=labels, path=parsed.path, description=spec.description)
    if spec.kind == "anaconda":
        if not spec.owner or spec.url:
            raise UsageError(f"{where}: an anaconda target needs owner = \"...\" (and optionally api_url), not url")
        parsed = parse_url(f"anaconda://{spec.owner}", labels)
        if spec.api_url is not None:
            _reject_credentials(spec.api_url, TargetKind.ANACONDA)
        if spec.api_url is not None and not spec.api_url.startswith(("http://", "https://")):
            raise UsageError(f"{where}: api_url {spec.api_url!r} is not an http(s) URL")
        return Target(name=name, kind=parsed.kind, labels=labels, owner=parsed.owner, api_url=spec.api_url,
                      token_env=spec.token_env, description=spec.description)
    if not spec.url or spec.owner or spec.api_url:
        raise UsageError(f"{where}: a quetz target needs url = \"http(s)://HOST[:PORT]/CHANNEL\" and no owner/api_url")
    url = spec.url if spec.url.startswith("quetz+") else f"quetz+{spec.url}"
    parsed = parse_url(url, labels)
    return Target(name=name, kind=parsed.kind, labels=labels, base_url=parsed.base_url, channel=parsed.channel,
                  token_env=spec.token_env, description=spec.description)


def default_channels_dir() -> Path:
    """`$TORCHFORGE_CHANNELS_DIR`, else ./channels. Never the channels/ folder of torchforge's source checkout:
    its examples (/srv/conda/torchforge ...) are nobody's real targets outside it."""
    env = os.environ.get("TORCHFORGE_CHANNELS_DIR")
    return Path(env) if env else Path.cwd() / "channels"


def load_all(channels_dir: Path) -> dict[str, Target]:
    """Every named target in `channels_dir`, by name. A missing folder means no named targets."""
    check_dir(channels_dir, "--channels-dir")
    if not channels_dir.is_dir():
        return {}
    return {path.stem: load_file(path) for path in sorted(channels_dir.glob("*.toml"))}


def resolve(
    text: str,
    channels_dir: Path | None = None,
    labels: tuple[str, ...] = (),
    api_url: str | None = None,
) -> Target:
    """The target a `--to` value means: a URL, or the name of a channels/*.toml file.

    `labels` and `api_url` from the command line override the file's.
    """
    labels = check_labels(labels, "--label")
    if "://" in text or "/" in text:  # a URL, or a path that parse_url turns into a file:// hint
        target = parse_url(text, labels or ("main",))
    else:
        folder = channels_dir or default_channels_dir()
        known = load_all(folder)
        if text not in known:
            names = ", ".join(sorted(known)) or "none"
            raise UsageError(
                f"no target named {text!r} in {folder}",
                f"named targets: {names}; or give a URL (file:///..., anaconda://OWNER, quetz+http://HOST/CHANNEL)",
            )
        target = known[text]
        if labels:
            target = replace(target, labels=labels)
    if api_url is not None:
        _reject_credentials(api_url, TargetKind.ANACONDA)
        if target.kind is not TargetKind.ANACONDA:
            raise UsageError("--api-url applies to anaconda:// targets only")
        if not api_url.startswith(("http://", "https://")):
            raise UsageError(f"--api-url {api_url!r} is not an http(s) URL")
        target = replace(target, api_url=api_url.rstrip("/"))
    return target


@dataclass(frozen=True)
class Credential:
    """A token and where it came from. `repr` never shows the value, so a stray log line cannot leak it."""

    value: str
    source: str  # e.g. "$ANACONDA_API_TOKEN" or "keyring torchforge/team"

    def __repr__(self) -> str:
        return f"Credential(source={self.source!r})"

    __str__ = __repr__


KEYRING_SERVICE = "torchforge"


def find_token(target: Target, env: Mapping[str, str] | None = None) -> Credential | None:
    """The token for `target`: its env variables in order, then the system keyring (service "torchforge",
    user = target name), if the `keyring` package is installed. None when nothing holds one."""
    env = os.environ if env is None else env
    for var in target.token_vars:
        value = env.get(var, "").strip()
        if value:
            return Credential(value, f"${var}")
    try:
        import keyring  # optional: present where the user installed it for their desktop keyring
    except ImportError:
        return None
    try:
        value = keyring.get_password(KEYRING_SERVICE, target.name)
    except Exception:  # no backend, locked keyring: treat as "not stored there"
        return None
    return Credential(value, f"keyring {KEYRING_SERVICE}/{target.name}") if value else None
