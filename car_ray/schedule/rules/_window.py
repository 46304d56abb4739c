"""How many Shapley forks a job keeps in flight at once (`ShapleyRules.window`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from .._tuning import IN_FLIGHT_OF_LEFT, SEEDS_IN_FLIGHT

if TYPE_CHECKING:
    from ..estimators import SeedShapley


@dataclass(frozen=True)
class WindowLook:
    """What a window rule sees: the Shapley so far, the coalitions a seed evaluates, the
    forks a seed has cost (`per_seed`), the forks the caps leave unspent, those in flight
    counted (None without a cap), and whether the job runs on for precision (`--more`)."""

    shap: SeedShapley
    coalitions: int
    per_seed: float
    unspent: float | None
    precise_only: bool


class ShapleyWindow(Protocol):
    """Forks of the Shapley stage in flight at once."""

    def size(self, look: WindowLook) -> int: ...


@dataclass(frozen=True)
class NarrowingWindow:
    """The shipped window: up to `seeds` seeds' worth (at least 8 forks) while the verdict is
    far, about half the forks the seeds still needed for it would take once it is near
    (`SeedShapley.seeds_to_verdict`), and one when it only waits on clearance; never more
    than `of_left` of the forks the caps leave unspent (rounded up, at least one). A fork in
    flight when the verdict comes is paid for and tells nothing: halving what is left keeps
    that waste to about half a look's forks. `--more` keeps the window the caps allow (it
    waits on widths, not on the verdict)."""

    seeds: int = SEEDS_IN_FLIGHT
    of_left: float | None = IN_FLIGHT_OF_LEFT  # None: the caps do not bound the window

    def size(self, look: WindowLook) -> int:
        most = max(self.seeds * look.coalitions, 8)
        if look.unspent is not None and self.of_left is not None:
            most = min(most, max(1, math.ceil(look.unspent * self.of_left)))
        if look.precise_only:
            return most
        seeds = look.shap.seeds_to_verdict()
        if seeds == math.inf:
            return most
        return int(min(most, max(1, math.ceil(seeds * look.per_seed / 2))))


@dataclass(frozen=True)
class FixedWindow:
    """A window of `forks`, whatever the verdict and the caps (for comparison)."""

    forks: int

    def size(self, look: WindowLook) -> int:
        return self.forks
