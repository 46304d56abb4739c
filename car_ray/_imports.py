"""Importing user code named as `module:attr` (agents, scorers, scenario policies)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any


class ImportRefError(ValueError):
    """A `module:attr` reference that cannot be imported, with what to do about it."""


def import_ref(ref: str, what: str, search_path: tuple[Path, ...] = ()) -> Any:
    """Import `module:attr`; the folders in `search_path` (a job's) are tried first."""
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise ImportRefError(f"{what} {ref!r} must look like 'package.module:function'")
    for folder in reversed(search_path):
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
    _forget_shadowed(module_name, search_path)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ImportRefError(
            f"{what} {ref!r}: cannot import module {module_name!r} ({exc}); "
            "check the name and that its folder is on PYTHONPATH or beside the job file"
        ) from exc
    target: Any = module
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ImportRefError(
                f"{what} {ref!r}: module {module_name!r} has no attribute {attr!r}"
            ) from None
    return target


def _forget_shadowed(module_name: str, search_path: tuple[Path, ...]) -> None:
    """A module of this name imported earlier from another folder (another job's
    `lc_scorer.py`, say, in a process that runs many jobs) is not this job's: forget its
    top-level package and everything under it, so the import finds the job's own file."""
    top = module_name.split(".")[0]
    file = getattr(sys.modules.get(top), "__file__", None)
    if file is None:
        return
    for folder in search_path:
        for candidate in (Path(folder) / f"{top}.py", Path(folder) / top / "__init__.py"):
            if not candidate.is_file():
                continue
            if candidate.resolve() != Path(file).resolve():
                for name in [m for m in sys.modules if m == top or m.startswith(top + ".")]:
                    del sys.modules[name]
                importlib.invalidate_caches()
            return
