"""A job's stages, one file each (see `_base` for their shape): the held control, the other
arms, the deviation screen, the group game and the held Shapley of method `auto`, and the
uniform scheme.
Each gets its job through a `JobContext`, keeps its own state and hands back a frozen,
typed result (`.._results`)."""

from __future__ import annotations

from ._arms import HeldArms
from ._base import UNSCORED, BaseStage, Fork, Lead, Listed, Next, Stage
from ._clearance import SHAPLEY_SEEDS, Clearance
from ._control import CONTROL_HINT, HeldControl
from ._draws import ProviderDraws
from ._groups import HeldGroups
from ._screen import HeldScreen
from ._shapley import HeldShapley
from ._uniform import Uniform

__all__ = [
    "CONTROL_HINT",
    "SHAPLEY_SEEDS",
    "UNSCORED",
    "BaseStage",
    "Clearance",
    "Fork",
    "HeldArms",
    "HeldControl",
    "HeldGroups",
    "HeldScreen",
    "HeldShapley",
    "Lead",
    "Listed",
    "Next",
    "ProviderDraws",
    "Stage",
    "Uniform",
]
