"""Which Shapley answers when the budget ends after Shapley started over
(`ShapleyRules.answering`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from .._tuning import MIN_SEEDS

if TYPE_CHECKING:
    from ..estimators import SeedShapley


class Answering(Protocol):
    """Of a Shapley and the one it started over from (`earlier`: fewer candidates, the steps
    found since held), the one whose blame the job shows."""

    def __call__(self, later: SeedShapley, earlier: SeedShapley | None) -> SeedShapley: ...


def earlier_if_blameless(later: SeedShapley, earlier: SeedShapley | None) -> SeedShapley:
    """The shipped rule: the later, unless its complete seeds are fewer than a verdict looks
    at (MIN_SEEDS) and than the earlier's, and blame nothing (no coalition of them flipped:
    every candidate tied at phi 0). Under a tight cap that is common: a seed whose forks stay
    on the tape is settled in one fork, one that leaves it needs more, so the complete seeds
    (0, 1, ... up to the first that is not) tend to end where a seed left the tape; the
    earlier then ranks what its seeds measured. A later game whose few seeds blame something
    answers: holding a step found late is no neutral choice (in an over-determined failure
    it hides the other cause)."""
    if earlier is None:
        return later
    seeds = later.complete_seeds()
    blame = any(later.values[s][c] for s in seeds for c in later.values[s])
    if len(seeds) < MIN_SEEDS and len(earlier.complete_seeds()) > len(seeds) and not blame:
        return earlier
    return later


def later_always(later: SeedShapley, earlier: SeedShapley | None) -> SeedShapley:
    """The later, unless it has no complete seed at all (for comparison)."""
    if earlier is not None and earlier.complete_seeds() and not later.complete_seeds():
        return earlier
    return later
