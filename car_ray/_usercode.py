"""Failures of the user's own code (an agent, a scorer), as plain data a person can read."""

from __future__ import annotations

import inspect
import sysconfig
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

Role = Literal["agent", "scorer"]

_CAR_RAY = str(Path(__file__).resolve().parent)
_LIBRARIES = tuple(
    {str(Path(sysconfig.get_paths()[key]).resolve()) for key in ("stdlib", "purelib", "platlib")}
)


class UserCodeError(Exception):
    """The job's agent or scorer raised, or broke its contract (a score outside [0, 1]).

    Strings only, so it crosses a process boundary as data: `error` is the exception's type
    and message, `where` the last line of the user's own code it went through (`file:line`,
    or "" when none is known), `when` what car-ray was doing, `stack` the full traceback
    for `--verbose`."""

    def __init__(
        self, role: Role, error: str, where: str = "", when: str = "", stack: str = ""
    ) -> None:
        self.role = role
        self.error = error
        self.where = where
        self.when = when
        self.stack = stack
        super().__init__(error + (f" (at {where})" if where else ""))

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.role, self.error, self.where, self.when, self.stack))

    @classmethod
    def of(
        cls, role: Role, fn: Callable[..., Any], exc: BaseException, when: str = ""
    ) -> UserCodeError:
        """`exc`, raised by (or about) the user's `fn`: located at the last frame of the
        user's code in its traceback, else at `fn`'s definition."""
        error = f"{type(exc).__name__}: {exc}"
        stack = "".join(traceback.format_exception(exc)) if exc.__traceback__ else ""
        return cls(role, error, _user_frame(exc) or _defined(fn), when, stack)

    def as_dict(self) -> dict[str, str]:
        return {k: getattr(self, k) for k in ("role", "error", "where", "when", "stack")}

    def describe(self, job_file: Path | str, ref: str) -> str:
        """One line: the job file, the ref, what failed and where in the user's code."""
        when = f" {self.when}" if self.when else ""
        return f"{job_file}: {self.role} {ref!r} failed{when}: {self}"


def _is_users(filename: str) -> bool:
    if filename.startswith("<"):  # <frozen ...>, <string>: nothing to open
        return False
    where = str(Path(filename).resolve())
    return not where.startswith((_CAR_RAY + "/", *(lib + "/" for lib in _LIBRARIES)))


def _user_frame(exc: BaseException) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if _is_users(f.filename)]
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else ""


def _defined(fn: Callable[..., Any]) -> str:
    try:
        target = inspect.unwrap(fn)
        file = inspect.getsourcefile(target)
        _, line = inspect.getsourcelines(target)
    except (TypeError, OSError):
        return ""
    return f"{file}:{line}" if file else ""
