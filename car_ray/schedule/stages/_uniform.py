"""The uniform scheme: the comparison the bench and users run beside the held mechanism."""

from __future__ import annotations

from collections.abc import Iterator

from .._results import StageResult
from ._arms import flip_counts
from ._base import Fork, Listed


class Uniform(Listed):
    """`forks_per_step` forks of every arm, one tail for all (`uniform_tail`); hands back
    each arm's flips (`FlipCounts`)."""

    name = "uniform"

    def forks(self) -> Iterator[Fork]:
        ctx = self.ctx
        k, tail = ctx.spec.forks_per_step, ctx.spec.uniform_tail
        for j in range(k):
            for arm in ctx.arms:
                plan = {arm.step: arm.intervention}
                yield ("uniform", ctx.seeds.fork("uniform", arm.key, plan, tail, j))

    def result(self) -> tuple[StageResult, ...]:
        return (flip_counts(self.ctx, "uniform"),)
