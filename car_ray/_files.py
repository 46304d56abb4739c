"""Reading a file the user named (a tape, a job file), with what is wrong with it in words."""

from __future__ import annotations

import stat
from pathlib import Path


class UnreadableFile(ValueError):
    """The path cannot be read as a file: the message says why (the caller names the path)."""


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a special file"


def read_regular_file(path: Path) -> bytes:
    """The bytes of a regular file. Anything else is refused before it is opened: a FIFO
    would block until some writer came, and car-ray reads a tape more than once."""
    try:
        mode = path.stat().st_mode
        if stat.S_ISDIR(mode):
            raise UnreadableFile("is a directory, not a file")
        if not stat.S_ISREG(mode):
            raise UnreadableFile(f"is {_kind(mode)}, not a regular file: save it to a file first")
        return path.read_bytes()
    except FileNotFoundError:
        raise UnreadableFile("no such file") from None
    except PermissionError:
        raise UnreadableFile("permission denied: this user may not read it") from None
    except OSError as exc:
        raise UnreadableFile(f"cannot be read ({exc.strerror or exc})") from None
