"""The estimators of the held mechanism, one file each: the deviation screen (which steps ever
leave the tape), the group game (which groups of steps can change the outcome), the
seed-wise Shapley of the held game, and exact Shapley values."""

from __future__ import annotations

from ._decision_shares import DecisionShares
from ._deviation_screen import DeviationScreen
from ._exact import exact_shapley
from ._group_game import GroupGame, split
from ._seed_shapley import SeedShapley

__all__ = [
    "DecisionShares",
    "DeviationScreen",
    "GroupGame",
    "SeedShapley",
    "exact_shapley",
    "split",
]
