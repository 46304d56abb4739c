"""The simulated provider: OpenAI- and Anthropic-compatible HTTP answers from a scenario policy.

Offline, $0 and with known ground truth: each policy exposes its distribution over actions, and
the real SDKs talk to it over real HTTP on 127.0.0.1.
"""

from __future__ import annotations

from ._policy import (
    Distribution,
    PolicyError,
    ScenarioPolicy,
    distribution_of,
    draw,
    load_policy,
    uniform_for_seed,
)
from ._run import READY_PREFIX, SimProcess, SimServer, serve
from ._server import STATS_PATH, SimApp, error_body
from ._worded import DECISION_TEXT, SEPARATOR, Worded, noisy_variant

__all__ = [
    "DECISION_TEXT",
    "READY_PREFIX",
    "SEPARATOR",
    "STATS_PATH",
    "Distribution",
    "PolicyError",
    "ScenarioPolicy",
    "SimApp",
    "SimProcess",
    "SimServer",
    "Worded",
    "distribution_of",
    "draw",
    "error_body",
    "load_policy",
    "noisy_variant",
    "serve",
    "uniform_for_seed",
]
