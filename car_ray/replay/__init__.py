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
    BudgetCut,
    EffectBlocked,
    InterventionError,
    Plan,
    Run,
    SpendLimit,
    Tail,
    ToolFailed,
    call_bound,
    recorded_trajectory,
    step_seed,
)
from ._upstream import AiohttpUpstream, HttpxUpstream, RateLimiter, RetryPolicy, Upstream

__all__ = [
    "INTERVENTION_KINDS",
    "AgentContext",
    "AgentFn",
    "AiohttpUpstream",
    "BaseUrls",
    "BudgetCut",
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
    "RateLimiter",
    "ReplaceObservation",
    "Resample",
    "RetryPolicy",
    "Run",
    "RunResult",
    "ScorerFn",
    "SpendLimit",
    "SwapPolicy",
    "Tail",
    "ToolFailed",
    "Upstream",
    "call_bound",
    "is_bad",
    "json_diff",
    "record",
    "recorded_trajectory",
    "step_seed",
]
