"""Read a stack file: TOML parsed, the schema applied, the combinations checked, relative paths resolved against
the file's folder. Every refusal is a usage error (exit 2) naming the file, the key's line and what would work,
before anything is planned."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from torchforge import data as tables
from torchforge.commands.options import check_channel_arg
from torchforge.errors import UsageError
from torchforge.extensions.sdist import parse_spec
from torchforge.extensions.variables import checked as checked_variable
from torchforge.stackfile.positions import Path as KeyPath
from torchforge.stackfile.positions import key_lines, line_of
from torchforge.stackfile.schema import StackFile

DOCS = "docs/stack-file.md lists every key"
LOCK_SUFFIX = ".lock"  # stack.toml -> stack.lock, beside it
REPACKED = ("wheels", "index")  # the routes that repack wheels
_ARCH = re.compile(r"^\d+\.\d+[af]?(\+PTX)?$")  # one entry of TORCH_CUDA_ARCH_LIST (9.0, 10.0f, 9.0+PTX)
_SYNTAX_LINE = re.compile(r"\(at line (\d+), column \d+\)")  # where tomllib's message says the error is


@dataclass(frozen=True)
class Stack:
    """A stack file read and checked: its model, and its paths resolved against its folder."""

    path: Path
    model: StackFile
    wheels: tuple[Path, ...]  # [pytorch] wheels: the files (a folder's *.whl, sorted)
    out: Path
    channels: tuple[str, ...]  # [channels] next_to: URLs and names as given, folders made absolute
    extensions: tuple[str, ...]  # each [[extensions]] spec, a local path made absolute
    source: str | None
    # each [[extensions]] env's variables as --extension-env gives them: (name in conda's form, KEY, VALUE)
    extension_env: tuple[tuple[str, str, str], ...] = ()
    # (SPEC, name, version, sdist identity) of each extension with an env, planned to read its name
    planned_extensions: tuple[tuple[str, str, str, str], ...] = ()
    requirement_wheels: tuple[Path, ...] = ()  # [channels] wheels: the folders, absolute

    @property
    def lock_path(self) -> Path:
        return self.path.with_suffix(LOCK_SUFFIX)

    @property
    def repacked(self) -> bool:
        return self.model.pytorch.from_ in REPACKED


class _Refusal(Exception):
    def __init__(self, key: KeyPath, message: str, hint: str) -> None:
        super().__init__(message)
        self.key, self.message, self.hint = key, message, hint


def _tuples(value: object) -> object:
    """TOML arrays as tuples: the models are frozen and strict."""
    if isinstance(value, list):
        return tuple(_tuples(item) for item in value)
    if isinstance(value, dict):
        return {key: _tuples(item) for key, item in value.items()}
    return value


def read(path: Path) -> Stack:
    """The stack file at `path`, checked whole."""
    try:
        text = path.read_text("utf-8")
    except FileNotFoundError:
        raise UsageError(f"--stack {path}: no such file", "give the stack file's path; `torchforge init` writes one"
                         ) from None
    except UnicodeDecodeError:
        raise UsageError(f"--stack {path}: not UTF-8 text", "a stack file is TOML, written as UTF-8") from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        at = _SYNTAX_LINE.search(str(exc))
        raise UsageError(f"{path}{':' + at.group(1) if at else ''}: not TOML: {exc}",
                         "fix the syntax at that line (toml.io)") from None
    lines = key_lines(text)
    try:
        model = StackFile.model_validate(_tuples(raw))
    except ValidationError as exc:
        raise _schema_error(path, lines, exc) from None
    try:
        return _checked(path, model)
    except _Refusal as refusal:
        line = line_of(lines, refusal.key)
        where = f"{path}:{line}" if line else str(path)
        raise UsageError(f"{where}: {_dotted(refusal.key)}: {refusal.message}", refusal.hint) from None


def _dotted(key: KeyPath) -> str:
    return ".".join(f"[{part}]" if isinstance(part, int) else part for part in key).replace(".[", "[")


def _schema_error(path: Path, lines: dict[KeyPath, int], exc: ValidationError) -> UsageError:
    """The first schema error, at its key's line, with what the schema would take."""
    error = exc.errors()[0]
    key = tuple(part if isinstance(part, int) or part != "from_" else "from" for part in error["loc"])
    line = line_of(lines, key)
    where = f"{path}:{line}" if line else str(path)
    kind = error["type"]
    if kind == "extra_forbidden":
        message, hint = "unknown key", f"remove it or correct its spelling; {DOCS}"
    elif kind == "missing":
        message, hint = "is missing", f"add it; {DOCS}"
    else:
        message, hint = error["msg"], f"{DOCS} with its type and values"
    return UsageError(f"{where}: {_dotted(key) or 'the file'}: {message}", hint)


def _checked(path: Path, model: StackFile) -> Stack:
    folder = path.parent
    _check_routes(model)
    _check_targets(model)
    wheels = _wheel_files(folder, model.pytorch.wheels)
    channels = tuple(_channel(folder, number, url) for number, url in enumerate(model.channels.next_to))
    extensions = tuple(_extension(folder, number, ext.spec) for number, ext in enumerate(model.extensions))
    source = model.pytorch.source
    if source is not None and "://" not in source and not source.startswith("git@"):
        source = str((folder / source).resolve())
    with_env = [(number, ext.env, _planned(number, extensions[number]))
                for number, ext in enumerate(model.extensions) if ext.env]
    variables = tuple(variable for number, env, (_, name, _, _) in with_env
                      for variable in _variables(number, name, env))
    return Stack(path, model, wheels, (folder / model.channels.out).resolve(), channels, extensions, source,
                 variables, tuple(planned for _, _, planned in with_env),
                 tuple(_wheel_folder(folder, number, entry) for number, entry in enumerate(model.channels.wheels)))


# (key of [pytorch], the routes it goes with, what it is for)
_ROUTE_KEYS = (("wheels", ("wheels",)), ("index", ("index",)), ("cuda_libs", REPACKED),
               ("flavour", ("source",)), ("source", ("source",)), ("match", ("channel",)))
_NEEDED = {"wheels": "wheels", "channel": "match"}


def _check_routes(model: StackFile) -> None:
    """Which [pytorch] keys go with its `from`, and what a route needs."""
    torch = model.pytorch
    route = torch.from_
    for key, routes in _ROUTE_KEYS:
        if getattr(torch, key) not in (None, ()) and route not in routes:
            raise _Refusal(("pytorch", key), f"goes with from = {' or '.join(routes)}, not from = {route!r}",
                           f"remove {key}, or set from = {routes[0]!r}")
    needed = _NEEDED.get(route)
    if needed and getattr(torch, needed) in (None, ()):
        raise _Refusal(("pytorch", "from"), f"from = {route!r} needs {needed}",
                       "wheels = [\"wheels/\"] (files or folders)" if needed == "wheels"
                       else "match = \"pytorch 2.11.0\" (a match spec of the pytorch in [channels] next_to)")
    if route in REPACKED and len(model.python) > 1:
        raise _Refusal(("python",), f"a repacked torch wheel is for one Python; {len(model.python)} are listed",
                       "list the wheels' Python only (one stack file per Python)")
    for name, made in model.companions.items():
        if made == "wheels" and route not in REPACKED:
            raise _Refusal(("companions", name), f"= 'wheels': only a repacked torch (from = wheels or index) has "
                           "its companions' wheels repacked beside it", f"{name} = \"source\"")
        if made == "source" and route in REPACKED:
            raise _Refusal(("companions", name), "= 'source': a repacked torch's companions are repacked from "
                           "their wheels too", f"{name} = \"wheels\" (its wheel among [pytorch] wheels)")


def _check_targets(model: StackFile) -> None:
    """The platform, the arch list and the CUDA they go with."""
    if model.platform not in tables.PLATFORMS:
        raise _Refusal(("platform",), f"unknown platform {model.platform!r}", f"one of {', '.join(tables.PLATFORMS)}")
    if model.arch_list is not None and model.pytorch.cuda == "cpu":
        raise _Refusal(("arch_list",), "a CPU stack has no device code to build for an arch list",
                       "remove arch_list, or give [pytorch] cuda = \"X.Y\"")
    wrong = [p for p in re.split(r"[;\s]+", model.arch_list or "") if p and not _ARCH.match(p)]
    if wrong or (model.arch_list is not None and not model.arch_list.strip(" ;")):
        raise _Refusal(("arch_list",), f"{', '.join(map(repr, wrong)) or 'empty'}: not an arch list",
                       "write it like \"8.0;9.0+PTX\" (X.Y, separated by ';' or blanks)")


def _wheel_files(folder: Path, given: tuple[str, ...]) -> tuple[Path, ...]:
    found: list[Path] = []
    for number, entry in enumerate(given):
        path = (folder / entry).resolve()
        if path.is_dir():
            wheels = sorted(path.glob("*.whl"))
            if not wheels:
                raise _Refusal(("pytorch", "wheels"), f"{entry!r} ({path}) holds no .whl file",
                               "name a folder of wheels, or the wheel files")
            found += wheels
        elif path.is_file() and path.suffix == ".whl":
            found.append(path)
        else:
            raise _Refusal(("pytorch", "wheels"), f"entry {number + 1}, {entry!r}: no wheel file or folder at {path}",
                           "paths are relative to the stack file's folder")
    return tuple(dict.fromkeys(found))


def _wheel_folder(folder: Path, number: int, entry: str) -> Path:
    path = (folder / entry).resolve()
    if not path.is_dir():
        raise _Refusal(("channels", "wheels"), f"entry {number + 1}, {entry!r}: no folder at {path}",
                       "name a folder of wheels, relative to the stack file's folder")
    return path


def _channel(folder: Path, number: int, url: str) -> str:
    local = folder / url
    # a folder beside the stack file is that folder (a name like conda-forge is a name where no such folder is)
    given = str(local.resolve()) if "://" not in url and ("/" in url or url.startswith(".") or local.is_dir()) else url
    try:
        return check_channel_arg(given)
    except UsageError as exc:
        raise _Refusal(("channels", "next_to"), f"entry {number + 1}: {exc.message.removeprefix('--channel ')}",
                       "a channel URL, a folder relative to the stack file, or a name (conda-forge)") from None


def _extension(folder: Path, number: int, spec: str) -> str:
    local = spec.strip()
    if not local.startswith("git+") and "==" not in local:
        local = str((folder / local).resolve())
    try:
        parse_spec(local)
    except UsageError as exc:
        raise _Refusal(("extensions", number, "spec"), exc.message.removeprefix("--extension "),
                       (exc.hint or "") + "; a path is relative to the stack file") from None
    return local


def _planned(number: int, spec: str) -> tuple[str, str, str, str]:
    """(SPEC, name, version, sdist identity) of an extension: its name is the sdist's (a local archive is read,
    not run)."""
    from torchforge.extensions.plan import planned_source
    from torchforge.proc import Runner

    try:
        source = planned_source(parse_spec(spec), Runner())
    except UsageError as exc:
        raise _Refusal(("extensions", number, "spec"), exc.message.removeprefix("--extension "),
                       exc.hint or "") from None
    return spec, source.name, source.version, source.sdist


def _variables(number: int, name: str, env: dict[str, str]) -> tuple[tuple[str, str, str], ...]:
    """An extension's env as (name, KEY, VALUE), each checked."""
    found = []
    for key, value in env.items():
        try:
            found.append(checked_variable(name, key, value))
        except UsageError as exc:
            raise _Refusal(("extensions", number, "env", key), exc.message.split(": ", 1)[-1],
                           exc.hint or "") from None
    return tuple(found)
