"""Tapes: one recorded agent run as append-only, hash-chained JSON Lines."""

from __future__ import annotations

from ._model import (
    FORMAT,
    VERSION,
    Event,
    LlmEvent,
    NondetEvent,
    RequestRecord,
    ResponseRecord,
    Step,
    TapeHeader,
    TapeSeal,
    ToolError,
    ToolEvent,
)
from ._reader import Tape, TapeError, load_tape, parse_tape
from ._writer import TapeWriter

__all__ = [
    "FORMAT",
    "VERSION",
    "Event",
    "LlmEvent",
    "NondetEvent",
    "RequestRecord",
    "ResponseRecord",
    "Step",
    "Tape",
    "TapeError",
    "TapeHeader",
    "TapeSeal",
    "TapeWriter",
    "ToolError",
    "ToolEvent",
    "load_tape",
    "parse_tape",
]
