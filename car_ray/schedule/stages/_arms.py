"""The arms other than re-drawing a step, with a held tail."""

from __future__ import annotations

from collections.abc import Iterator
from types import MappingProxyType

from ...execute import Row
from ...replay import ForkSpec, SwapPolicy
from ...results._verdict import ROOT_KINDS, ROOT_SHARE
from .._context import JobContext
from .._results import FlipCounts, StageResult
from .._tuning import ARM_FIRST, ARM_FORKS
from ._base import BaseStage, Fork


class HeldArms(BaseStage):
    """Every other arm (observation, action, context, policy) with a held tail: one fork
    when the provider honours seeds and the fork draws nothing fresh (it is then the arm's
    exact value), ARM_FORKS otherwise. An arm that may name the failure's root (an
    observation or context arm, `results.is_root`: a flip-rate above one half) runs its
    first ARM_FIRST forks, and the rest only where they could change whether it is the
    root: not once more than half of ARM_FORKS have flipped (it is the root, whatever the
    rest do), nor where the rest flipping too would leave it at half or less (it is not).
    So its root is the one all ARM_FORKS forks would name; its flip-rate is read from the
    forks it ran. Hands back each arm's flips (`FlipCounts`)."""

    name = "arms"

    def start(self) -> None:
        self.exact = self._exact()
        self.queue = list(self._wave(first=True))
        # The first wave's forks: whether an arm goes on is read from them alone, so a job
        # resumed part way through a second wave asks for what the job run in one go did.
        self.first = {spec.task_id for _, spec in self.queue}
        self.second = False
        self.pending: set[str] = set()

    def _exact(self) -> frozenset[str]:
        ctx = self.ctx
        return frozenset(
            a.key
            for a in ctx.arms
            if a.kind != "resample"
            and ctx.honours_seed
            and not isinstance(a.intervention, SwapPolicy)
        )

    def _wave(self, *, first: bool) -> Iterator[Fork]:
        """The first wave's forks of every arm, or the second's of those still open."""
        ctx = self.ctx
        for arm in ctx.arms:
            if arm.kind == "resample":
                continue
            most = 1 if arm.key in self.exact else ARM_FORKS
            split = ARM_FIRST if arm.kind in ROOT_KINDS and most > ARM_FIRST else most
            if first:
                forks = range(split)
            elif split < most and self._open(arm.key):
                forks = range(split, most)
            else:
                continue
            plan = {arm.step: arm.intervention}
            for j in forks:
                yield ("arms", ctx.seeds.fork("arms", arm.key, plan, "held", j))

    def _open(self, key: str) -> bool:
        """Whether the rest of an arm's forks could change whether it is the root: all its
        first ARM_FIRST were scored, and neither more than half of ARM_FORKS flipped nor
        could half or fewer flip with the rest."""
        rows = [
            r
            for r in self.ctx.rows.arm("arms", key)
            if r["task_id"] in self.first and r["flipped"] is not None
        ]
        if len(rows) < ARM_FIRST:
            return True  # a fork without an outcome: its rate is read from all of them
        flips = sum(bool(r["flipped"]) for r in rows)
        half = ROOT_SHARE * ARM_FORKS
        return not (flips > half or flips + ARM_FORKS - ARM_FIRST <= half)

    def suggest(self, room: int) -> list[Fork] | None:
        if not self.queue and not self.second:
            if self.pending:
                return []  # the second wave waits for the first's flips
            self.second = True
            self.queue = list(self._wave(first=False))
        if not self.queue:
            return None
        out, self.queue = self.queue[:room], self.queue[room:]
        self.pending |= {spec.task_id for _, spec in out}
        return out

    def observe(self, row: Row) -> None:
        self.pending.discard(ForkSpec.model_validate_json(row["spec"]).task_id)

    def unrun(self, spec: ForkSpec) -> None:
        self.pending.discard(spec.task_id)

    def result(self) -> tuple[StageResult, ...]:
        return (flip_counts(self.ctx, "arms", self._exact()),)


def flip_counts(ctx: JobContext, stage: str, exact: frozenset[str] = frozenset()) -> FlipCounts:
    """Every arm's flips and scored forks among `stage`'s rows."""
    counts: dict[str, tuple[int, int]] = {}
    for arm in ctx.arms:
        rows = [r for r in ctx.rows.arm(stage, arm.key) if r["flipped"] is not None]
        counts[arm.key] = (sum(bool(r["flipped"]) for r in rows), len(rows))
    return FlipCounts(stage, MappingProxyType(counts), exact)
