"""The arms other than re-drawing a step, with a held tail."""

from __future__ import annotations

from collections.abc import Iterator
from types import MappingProxyType

from ...replay import SwapPolicy
from .._context import JobContext
from .._results import FlipCounts, StageResult
from .._tuning import ARM_FORKS
from ._base import Fork, Listed


class HeldArms(Listed):
    """Every other arm (observation, action, context, policy) with a held tail: one fork
    when the provider honours seeds and the fork draws nothing fresh (it is then the arm's
    exact value), ARM_FORKS otherwise. Hands back each arm's flips (`FlipCounts`)."""

    name = "arms"

    def _exact(self) -> frozenset[str]:
        ctx = self.ctx
        return frozenset(
            a.key
            for a in ctx.arms
            if a.kind != "resample"
            and ctx.honours_seed
            and not isinstance(a.intervention, SwapPolicy)
        )

    def forks(self) -> Iterator[Fork]:
        ctx, exact = self.ctx, self._exact()
        for arm in ctx.arms:
            if arm.kind == "resample":
                continue
            for j in range(1 if arm.key in exact else ARM_FORKS):
                plan = {arm.step: arm.intervention}
                yield ("arms", ctx.seeds.fork("arms", arm.key, plan, "held", j))

    def result(self) -> tuple[StageResult, ...]:
        return (flip_counts(self.ctx, "arms", self._exact()),)


def flip_counts(ctx: JobContext, stage: str, exact: frozenset[str] = frozenset()) -> FlipCounts:
    """Every arm's flips and scored forks among `stage`'s rows."""
    counts: dict[str, tuple[int, int]] = {}
    for arm in ctx.arms:
        rows = [r for r in ctx.rows.arm(stage, arm.key) if r["flipped"] is not None]
        counts[arm.key] = (sum(bool(r["flipped"]) for r in rows), len(rows))
    return FlipCounts(stage, MappingProxyType(counts), exact)
