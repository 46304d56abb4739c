"""What a fork may cost, beside the ledger that enforces the caps (`ForkCosts`): each fork is
reserved at an estimate before it runs and settled at its real usage after; estimates are the
worst case until forks of the same shape have settled, then learned from them."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from functools import cached_property
from typing import Any

from .._canon import canonical_bytes
from ..execute import Row
from ..providers import PriceTable
from ..replay import ForkSpec, SwapPolicy, call_bound
from ..tape import LlmEvent, ToolEvent
from ._budget import BudgetGovernor, Cost
from ._tuning import LEARN_AFTER, LEARNED_OUTPUT_FLOOR, OUTPUT_FLOOR_TOKENS, TAIL_SLACK

# A fork's shape: its tail and intervened steps, its tail and first intervened step, or its
# tail alone (`ForkCosts.shapes`).
Shape = tuple[str, Any]


class ForkCosts:
    """A job's fork estimates: the worst case from the tape and the price table, or, once
    `learn_after` (LEARN_AFTER) forks of a fork's shape have settled under a dollar or token
    cap, their most live calls at a learned output. A fork whose learned reservation was too
    small is cut, never overspent, and runs again at the worst case (`cut_tasks`)."""

    def __init__(
        self,
        steps: Sequence[LlmEvent | ToolEvent],
        prices: PriceTable,
        governor: BudgetGovernor,
        learn_after: int = LEARN_AFTER,
    ) -> None:
        self.steps = steps
        self.prices = prices
        self.governor = governor
        self.learn_after = learn_after
        # Live calls of settled forks by shape: what a fork of that shape is reserved for.
        self.calls_by_shape: dict[Shape, list[int]] = defaultdict(list)
        self.output_per_call: list[int] = []  # output tokens per live call of settled forks
        self.cut_tasks: set[str] = set()  # forks cut at a learned reservation: worst case now
        self._learned: set[str] = set()  # ledger keys reserved at a learned estimate

    def settled(self, row: Row, spec: ForkSpec) -> None:
        """Learn from a fork's row (new or resumed): its live calls and output per call; a
        row kept under `<task>/cut` marks its fork for the worst case from now on."""
        calls = row.get("tail_calls", 0)
        if row["status"] not in ("budget_cut", "provider_error", "error"):
            for shape in self.shapes(spec):
                self.calls_by_shape[shape].append(calls)
            if calls:
                self.output_per_call.append(-(-row.get("tokens_out", 0) // calls))
        if row["task_id"].endswith("/cut"):
            self.cut_tasks.add(spec.task_id)

    def shapes(self, spec: ForkSpec) -> tuple[Shape, ...]:
        """A fork's shapes, finest first: its tail and intervened steps (the forks of a
        Shapley coalition across seeds), its tail and first intervened step, and its tail
        alone (the most live calls any fork of that tail made: Shapley chains and screen
        blocks come in many shapes, few of which settle four forks under a tight cap)."""
        first = min(spec.interventions, default=len(self.steps))
        steps = tuple(sorted(spec.interventions))
        return (spec.tail, steps), (spec.tail, first), (spec.tail, None)

    def _seen_calls(self, spec: ForkSpec) -> list[int]:
        """Live calls of settled forks of the finest shape with LEARN_AFTER of them."""
        for shape in self.shapes(spec):
            seen = self.calls_by_shape.get(shape, [])
            if len(seen) >= self.learn_after:
                return seen
        return []

    def estimate(self, spec: ForkSpec, *, worst: bool = False) -> Cost:
        """What a fork is reserved for (see `reservation`)."""
        return self.reservation(spec, worst=worst)[0]

    def reservation(self, spec: ForkSpec, *, worst: bool = False) -> tuple[Cost, int, bool]:
        """A fork's reservation, the output tokens a call without max_tokens is assumed to
        stay under (its SpendLimit must use the same), and whether it was learned.

        The worst case: every recorded model call from the first intervention on, TAIL_SLACK
        times, plus one, and a coupled step's extra draws, each at the largest call's bound.
        Learned, once LEARN_AFTER forks of its shape (`shapes`) have settled under a dollar or
        token cap: their most live calls, each at the bound with a learned output
        (`output_bound`). A fork that needs more is cut at its reservation, never overspent,
        and runs again at the worst case."""
        seen = self._seen_calls(spec)
        worst_calls = self._tail_calls(spec)
        # Only a dollar or token cap is served by a tighter reservation; without one, a
        # learned reservation would only cut forks.
        budget = self.governor.budget
        money = budget.max_usd is not None or budget.max_tokens is not None
        learned = money and not worst and len(seen) >= self.learn_after and max(seen) < worst_calls
        output = self.output_bound(learned=learned)
        bound = self.call_bound(spec, output)
        calls = max(seen) if learned else worst_calls
        return Cost(forks=1, usd=bound.usd * calls, tokens=bound.tokens * calls), output, learned

    def _tail_calls(self, spec: ForkSpec) -> int:
        first = min(spec.interventions, default=len(self.steps))
        # Pinned tails too: a pin is lost (and the call goes live) when the run's shape
        # leaves the tape's, so every later model call may be live.
        live = [e for e in self.steps if isinstance(e, LlmEvent) and e.step >= first]
        # A coupled step met at a changed request draws several times (`Run._coupled`).
        couple = spec.couple or {}
        coupled = sum(
            draws - 1
            for k, (_, draws) in couple.items()
            if k >= first and k not in spec.interventions
        )
        return len(live) * TAIL_SLACK + 1 + coupled

    def call_bound(self, spec: ForkSpec, output: int) -> Cost:
        """The largest live call a fork may make (tokens, usd): the recorded requests it may
        resend, at the model a policy swap puts in their place."""
        first = min(spec.interventions, default=len(self.steps))
        live = [e for e in self.steps if isinstance(e, LlmEvent) and e.step >= first]
        # Room for one call beyond the tape's, sized like its largest: also after a trailing
        # tool step, whose live tail may still call a model.
        sized = live or [e for e in self.steps if isinstance(e, LlmEvent)]
        # A policy swap holds from its step until the next swap: its model, at its price.
        swaps = sorted(
            (k, iv) for k, iv in spec.interventions.items() if isinstance(iv, SwapPolicy)
        )
        usd = tokens = 0.0
        for event in sized:
            body, model = event.request.body, event.model
            active = [iv for k, iv in swaps if k <= max(event.step, first)]
            if active and active[-1].model is not None:
                model = active[-1].model
                body = {**body, "model": model} if isinstance(body, dict) else body
            t, u = call_bound(body, self.prices, model, output, self.tokens_per_byte)
            usd, tokens = max(usd, u), max(tokens, t)
        return Cost(forks=1, usd=usd, tokens=int(tokens))

    def output_bound(self, *, learned: bool = False) -> int:
        """Output tokens assumed for a call that sets no max_tokens: four times the most the
        tape's model calls produced, at least OUTPUT_FLOOR_TOKENS; learned (once LEARN_AFTER
        forks made live calls), twice the most of the tape's calls and of the forks' output
        per call, at least LEARNED_OUTPUT_FLOOR."""
        recorded = [e.usage.get("output_tokens", 0) for e in self.steps if isinstance(e, LlmEvent)]
        most = max(recorded, default=0)
        if learned and len(self.output_per_call) >= self.learn_after:
            most = max(most, *self.output_per_call)
            return max(LEARNED_OUTPUT_FLOOR, 2 * most)
        return max(OUTPUT_FLOOR_TOKENS, 4 * most)

    @cached_property
    def tokens_per_byte(self) -> float:
        """Input tokens per byte of canonical request JSON: the most the tape's own calls
        had (their provider's tokenizer), a quarter more for safety; 1/3 without usage."""
        ratios = [
            e.usage.get("input_tokens", 0) / len(canonical_bytes(e.request.body))
            for e in self.steps
            if isinstance(e, LlmEvent) and e.request.body is not None
        ]
        ratios = [r for r in ratios if r > 0]
        return min(1.0, 1.25 * max(ratios)) if ratios else 1 / 3

    def reserve(self, key: str, spec: ForkSpec, *, worst: bool) -> tuple[Cost, int, bool] | None:
        """Reserve a fork's attempt under ledger `key`: its estimate, or, at a cap's edge with
        nothing in flight, what the caps leave if that holds at least one call (it is cut,
        never overspent, if it needs more) rather than the job stopping with its budget
        unspent. The reservation, the output bound its calls assume and whether it was
        learned (`mark_learned` once the fork is admitted); None if refused."""
        worst = worst or spec.task_id in self.cut_tasks
        estimate, output, learned = self.reservation(spec, worst=worst)
        if not self.governor.try_reserve(key, estimate):
            # (Not for a fork already cut once: its rerun needs the worst case.)
            shrunk = None if worst else self._what_is_left(spec, estimate, output)
            if shrunk is None or not self.governor.try_reserve(key, shrunk):
                return None
            estimate, learned = shrunk, True
        return estimate, output, learned

    def mark_learned(self, key: str) -> None:
        """The attempt under ledger `key` runs at a learned estimate (`learned`)."""
        self._learned.add(key)

    def learned(self, key: str) -> bool:
        """Whether the attempt under ledger `key` was reserved at a learned estimate."""
        return key in self._learned

    def _what_is_left(self, spec: ForkSpec, estimate: Cost, output: int) -> Cost | None:
        if self.governor.in_flight:
            return None  # settling those may make room for the whole estimate
        left = self.governor.remaining()
        if left.forks == 0 or (left.wall_s is not None and left.wall_s <= 0):
            return None
        call = self.call_bound(spec, output)
        usd = estimate.usd if left.usd is None else min(estimate.usd, left.usd)
        tokens = estimate.tokens if left.tokens is None else min(estimate.tokens, left.tokens)
        if usd < call.usd or tokens < call.tokens:
            return None
        return Cost(forks=1, usd=usd, tokens=tokens)
