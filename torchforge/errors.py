"""One small error hierarchy. Library code raises; only the CLI catches and maps to exit codes."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    USAGE = 2
    DATA = 3
    REFUSED = 4
    TOOL_MISSING = 5
    BUILD_FAILED = 6
    UPLOAD_FAILED = 7
    AUDIT_FAILED = 8
    PREFLIGHT_FAILED = 9
    FILESYSTEM = 10
    INTERNAL = 70  # a bug in torchforge (sysexits' EX_SOFTWARE)
    INTERRUPTED = 130  # Ctrl-C, as shells report SIGINT


class ForgeError(Exception):
    """An error the user can act on: `message` says what is wrong, `hint` what would work."""

    exit_code: ExitCode = ExitCode.USAGE

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  hint: {self.hint}"


class UsageError(ForgeError):
    exit_code = ExitCode.USAGE


class ArchiveError(UsageError):
    """A package or wheel that cannot be used: unreadable, truncated, without metadata, or in the wrong folder."""

    @classmethod
    def unreadable(cls, path: object, exc: BaseException) -> ArchiveError:
        """The one message for a damaged file, whichever reader (zip, tar, zstd, bz2, cph) noticed."""
        detail = str(exc).strip().splitlines()[-1] if str(exc).strip() else ""
        return cls(f"{path} is not a readable archive ({type(exc).__name__}: {detail})",
                   "it is damaged or truncated: rebuild it, or download it again")


class DataError(ForgeError):
    """A data file is malformed or inconsistent (a bug in torchforge's tables, not in the request)."""

    exit_code = ExitCode.DATA


class RefusedError(ForgeError):
    """The requested variant cannot be built; the message lists each reason and what would work."""

    exit_code = ExitCode.REFUSED


class ToolMissingError(ForgeError):
    exit_code = ExitCode.TOOL_MISSING


class ToolFailedError(ForgeError):
    """A subprocess exited non-zero; `tail` holds the last lines of its output."""

    exit_code = ExitCode.BUILD_FAILED

    def __init__(self, message: str, hint: str | None = None, tail: str = "", returncode: int | None = None,
                 peak_rss_kib: int = 0) -> None:
        super().__init__(message, hint)
        self.tail = tail
        self.returncode = returncode  # the command's exit status (negative: the signal that ended it)
        self.peak_rss_kib = peak_rss_kib  # the largest RSS of a process of its tree (0: not measured)


class ToolTimeoutError(ToolFailedError):
    """A subprocess ran past its time limit and was stopped."""


class BuildFailedError(ForgeError):
    exit_code = ExitCode.BUILD_FAILED


class UploadFailedError(ForgeError):
    exit_code = ExitCode.UPLOAD_FAILED


class AuditFailedError(ForgeError):
    exit_code = ExitCode.AUDIT_FAILED


class PreflightError(ForgeError):
    exit_code = ExitCode.PREFLIGHT_FAILED


class FileSystemError(ForgeError):
    """A path cannot be read or written as asked (a file where a folder is needed, read-only, full disk)."""

    exit_code = ExitCode.FILESYSTEM
