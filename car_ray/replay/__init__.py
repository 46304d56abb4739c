"""Replay and forks: the transport seam, the step machine, interventions and the runner."""

from __future__ import annotations

from ._context import AgentContext
from ._divergence import Difference, DivergenceError, json_diff
from ._fork import (
    AgentFn,
    BaseUrls,
    ForkRow,
    ForkRunner,
    ForkSpec,
    RunResult,
    ScorerFn,
    is_bad,
    record,
)
from ._interventions import (
    INTERVENTION_KINDS,
    ContextEdit,
    EditContext,
    ForceAction,
    ForcedToolCall,
    Intervention,
    ReplaceObservation,
    Resample,
    SwapPolicy,
)
from ._run import (
    EffectBlocked,
    InterventionError,
    Plan,
    Run,
    ToolFailed,
    recorded_trajectory,
    step_seed,
)
from ._upstream import AiohttpUpstream, HttpxUpstream, RetryPolicy, Upstream

__all__ = [
    "INTERVENTION_KINDS",
    "AgentContext",
    "AgentFn",
    "AiohttpUpstream",
    "BaseUrls",
    "ContextEdit",
    "Difference",
    "DivergenceError",
    "EditContext",
    "EffectBlocked",
    "ForceAction",
    "ForcedToolCall",
    "ForkRow",
    "ForkRunner",
    "ForkSpec",
    "HttpxUpstream",
    "Intervention",
    "InterventionError",
    "Plan",
    "ReplaceObservation",
    "Resample",
    "RetryPolicy",
    "Run",
    "RunResult",
    "ScorerFn",
    "SwapPolicy",
    "ToolFailed",
    "Upstream",
    "is_bad",
    "json_diff",
    "record",
    "recorded_trajectory",
    "step_seed",
]
