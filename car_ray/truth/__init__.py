"""Ground truth: a scenario's exact flip-rates, coalition values, Shapley values, necessity and
sufficiency, by enumerating the simulated policy's branches through the fork machinery."""

from __future__ import annotations

from ._local import local_scheduler, run_local, run_local_scheduler
from ._solver import (
    ArmTruth,
    BranchingTooLarge,
    Game,
    Solver,
    StepTruth,
    Truth,
    game_of,
    sim_runner,
    solve,
)

__all__ = [
    "ArmTruth",
    "BranchingTooLarge",
    "Game",
    "Solver",
    "StepTruth",
    "Truth",
    "game_of",
    "local_scheduler",
    "run_local",
    "run_local_scheduler",
    "sim_runner",
    "solve",
]
