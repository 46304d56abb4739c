"""car-ray: which step of a recorded LLM-agent run caused the bad outcome.

Record a run as a tape, replay it byte for byte, and fork it with interventions on steps."""

from __future__ import annotations

from .recorder import failing_tapes, mark_tape, recording
from .replay import (
    AgentContext,
    BaseUrls,
    DivergenceError,
    EditContext,
    ForceAction,
    ForkRow,
    ForkRunner,
    ForkSpec,
    Intervention,
    ReplaceObservation,
    Resample,
    SwapPolicy,
    record,
)
from .tape import Tape, TapeError, load_tape

__version__ = "0.1.0"

__all__ = [
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
    "Tape",
    "TapeError",
    "__version__",
    "failing_tapes",
    "load_tape",
    "mark_tape",
    "record",
    "recording",
]
