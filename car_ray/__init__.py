"""car-ray: which step of a recorded LLM-agent run caused the bad outcome.

Record a run as a tape, replay it byte for byte, and fork it with interventions on steps.

The names below load on first use (PEP 562): `import car_ray.sim` or `car_ray.providers`
does not import the openai and anthropic SDKs (about 2 s), so the simulated provider's
process and other light users start quickly."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names below, for type checkers (redundant aliases: re-exports)
    from .recorder import failing_tapes as failing_tapes
    from .recorder import mark_tape as mark_tape
    from .recorder import recording as recording
    from .replay import AgentContext as AgentContext
    from .replay import BaseUrls as BaseUrls
    from .replay import DivergenceError as DivergenceError
    from .replay import EditContext as EditContext
    from .replay import ForceAction as ForceAction
    from .replay import ForkRow as ForkRow
    from .replay import ForkRunner as ForkRunner
    from .replay import ForkSpec as ForkSpec
    from .replay import Intervention as Intervention
    from .replay import ReplaceObservation as ReplaceObservation
    from .replay import Resample as Resample
    from .replay import SwapPolicy as SwapPolicy
    from .replay import current_context as current_context
    from .replay import record as record
    from .replay import tool as tool
    from .tape import Tape as Tape
    from .tape import TapeError as TapeError
    from .tape import load_tape as load_tape

__version__ = "0.1.0"

_WHERE = {
    **dict.fromkeys(("failing_tapes", "mark_tape", "recording"), ".recorder"),
    **dict.fromkeys(
        (
            "AgentContext",
            "BaseUrls",
            "DivergenceError",
            "EditContext",
            "ForceAction",
            "ForkRow",
            "ForkRunner",
            "ForkSpec",
            "Intervention",
            "ReplaceObservation",
            "Resample",
            "SwapPolicy",
            "current_context",
            "record",
            "tool",
        ),
        ".replay",
    ),
    **dict.fromkeys(("Tape", "TapeError", "load_tape"), ".tape"),
}

__all__ = sorted([*_WHERE, "__version__"])


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'car_ray' has no attribute {name!r}")
    value = getattr(importlib.import_module(where, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])
