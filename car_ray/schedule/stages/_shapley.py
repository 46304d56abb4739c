"""The held Shapley stage: blame over the steps the screen found, one seed at a time, with
the screen's clearance behind its verdict."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

from ..._notes import Note
from ...execute import Row
from ...replay import ForkSpec, Intervention, Probe, Resample
from .._context import JobContext, coalition_of, probes_of
from .._results import ShapleyResult, StageResult
from .._tuning import GO_ON_SLACK, MIN_SEEDS, REACH_ALPHA, SCREEN_MOST
from ..estimators import DeviationScreen, SeedShapley
from ..rules import clean_to_clear
from ._base import BaseStage, Fork, Lead, Next
from ._screening import probed, screen_forks, screen_result

# Shapley seeds of the held game are fork seeds from here on (of the attribution's 2^32): the
# screen's forks count from 0 and pick the candidates, so Shapley seeds that were the screen's
# would see every step it found leave the tape (a selection bias toward the found steps).
SHAPLEY_SEEDS = 1 << 31


class HeldShapley(BaseStage):
    """Shapley blame over the steps the screen found, one seed at a time (see
    `SeedShapley`), until the top cause is separated or the intervals are precise, with
    the screen's clearance behind the verdict: every step the screen has not found has
    the clean draws that show its phi below the top's (`_needed`: `clean_to_clear` with
    `SeedShapley.reach`), or a deviation bound within the target half-width when the
    verdict is "precise". While it has not, each fork goes where it gives more
    (`_screen_next`): a screen fork is one more clean draw, a seed a probe and a top that
    needs fewer. When the screen finds another step, Shapley starts over (a new
    `HeldShapley` over the steps found, keeping every row)."""

    name = "shapley"

    def __init__(
        self, ctx: JobContext, screen: DeviationScreen, previous: SeedShapley | None = None
    ) -> None:
        super().__init__(ctx)
        self.screen = screen
        # The Shapley this one started over from (fewer candidates): its estimates may be the
        # answer if the budget ends first (`ShapleyRules.answering`).
        self.previous = previous
        self.verdict: tuple[str, list[int]] | None = None
        self.unsettled: str | None = None
        self.lacking: dict[int, float] | None = None
        self.notes: list[Note] = []

    def start(self) -> None:
        self.found = len(self.screen.candidates)
        shap = self._replayed()
        self.shap = shap
        self.shown = shap  # the game whose blame the job shows (`ShapleyRules.answering`)
        self.pending: set[tuple[int, frozenset[int]]] = set()
        self.screening: set[str] = set()
        self.out_of_budget = False
        self.per_seed = max(1, len(shap.coalitions(0)))
        self.target = self.ctx.spec.target_half_width

    def _replayed(self) -> SeedShapley:
        """Shapley over the steps the screen has found, from what the job's forks showed so
        far: a probe that drew a step's recorded action in a seed is that step's fresh draw
        there, and every row of an earlier Shapley (over fewer candidates) is a coalition
        of this one's."""
        ctx, screen = self.ctx, self.screen
        shap = SeedShapley(
            screen.candidates,
            ctx.alpha,
            salt=str(ctx.spec.attribution_seed),
            rule=ctx.rules.stop,
        )
        if ctx.honours_seed:
            first = ctx.seeds.base + SHAPLEY_SEEDS
            for fork_seed, k in sorted(screen.probes):
                if k in shap.candidates and fork_seed >= first:
                    shap.learn_clean(fork_seed - first, [k])
        for spec, row in ctx.rows.of("shapley", "held"):
            if self._seed(spec) >= 0:  # not a row of an older car-ray (the screen's seeds)
                _observe(shap, self._seed(spec), spec, row, learn=ctx.honours_seed)
        return shap

    def _seed(self, spec: ForkSpec) -> int:
        """Which seed of the Shapley stage a fork belongs to."""
        return spec.seed - self.ctx.seeds.base - SHAPLEY_SEEDS

    def observe(self, row: Row) -> None:
        spec = ForkSpec.model_validate_json(row["spec"])
        if spec.task_id in self.screening:
            self.screening.discard(spec.task_id)
            if row["outcome"] is not None:
                self.screen.observe(sorted(spec.interventions), row["first_deviation"])
            return
        seed, coalition = self._seed(spec), coalition_of(spec)
        self.pending.discard((seed, coalition))
        # A probe that left the tape is a step the screen had not found: Shapley starts over.
        probed(self.screen, spec, row)
        _observe(self.shap, seed, spec, row, learn=self.ctx.honours_seed)

    def unrun(self, spec: ForkSpec) -> None:
        if spec.task_id in self.screening:
            self.screening.discard(spec.task_id)
            return
        seed, coalition = self._seed(spec), coalition_of(spec)
        self.pending.discard((seed, coalition))
        # Given up (its provider failed every try) or refused by the budget: the seed has no
        # outcome and is left out; its other forks are not asked again. (Marking it `cut`,
        # which ends the seeds counted, would leave a given-up seed blocking every later one:
        # the loop's unrun does not yet tell the two apart.)
        self.shap.observe(seed, coalition, None)

    def _seeds(self, room: int) -> list[Fork]:
        """Forks of Shapley seeds, in seed order: each seed's largest coalition first, its
        other coalitions once that one is known. Under a cap, a seed is begun only if the
        forks left could finish it after those begun: the estimates count complete seeds
        only, so a seed cut off half way is paid for and tells nothing."""
        shap, pending = self.shap, self.pending
        per_seed = max(1.0, shap.forks_per_seed())
        left = self.ctx.forks_left()
        room = min(room, self._window(per_seed, left) - len(pending))
        self.out_of_budget = False  # reservations settle below their estimates: look again
        owed = 0.0  # forks the seeds begun may still need beyond those asked for now
        out: list[Fork] = []
        seed = 0
        while len(out) < room:
            first = shap.first(seed)
            if seed in shap.failed or (seed, first) in pending:
                # The seed's other coalitions wait for its first: it may settle them.
                if seed not in shap.failed:
                    owed += per_seed - 1
                seed += 1
                continue
            begun = shap.known(seed, first)
            finishable = left is None or left - len(out) - owed >= per_seed
            if not begun and self.ctx.rules.finish_seeds and not finishable:
                self.out_of_budget = True  # what is left could not finish another seed
                break
            if not begun:
                owed += per_seed - 1  # its other coalitions may follow its first
            todo = [first] if not begun else shap.coalitions(seed)
            for coalition in todo:
                if len(out) >= room:
                    break
                if shap.known(seed, coalition) or (seed, coalition) in pending:
                    continue
                pending.add((seed, coalition))
                plan: dict[int, Intervention] = {k: Resample() for k in coalition}
                fork_seed = SHAPLEY_SEEDS + seed
                # The fork also probes the steps not found that no fork of its seed has
                # shown yet: screen draws for free (a smaller coalition stays on the tape
                # longer, and reaches later steps at their recorded requests).
                plan.update((k, Probe()) for k in self._probe_steps(fork_seed))
                key = tuple(sorted(coalition))
                out.append(("shapley", self.ctx.fork("shapley", key, plan, "held", fork_seed)))
            seed += 1
        return out

    def _window(self, per_seed: float, left: float | None) -> int:
        """Shapley forks in flight at once, as the job's window rule says
        (`ShapleyRules.window`), from the forks its caps leave unspent (those in flight
        counted: `forks_left` leaves them out)."""
        return self.ctx.rules.window.size(
            self.shap,
            coalitions=self.per_seed,
            per_seed=per_seed,
            unspent=None if left is None else left + len(self.pending),
            precise_only=self.ctx.precise_only,
        )

    def _probe_steps(self, fork_seed: int) -> list[int]:
        """The steps a fork probes: those not found that are short of the clean draws a
        verdict is likely to need (`_probes_wanted`), and not drawn with this fork seed before
        (by another fork of the seed, or by a Shapley that started over)."""
        screen, seed = self.screen, self.ctx.seeds.base + fork_seed
        wanted = self._probes_wanted()
        return [
            k
            for k in self._unfound()
            if screen.clean.get(k, 0) < wanted and (seed, k) not in screen.probes
        ]

    def _probes_wanted(self) -> int:
        """Clean draws a step not found should have: what the screen asks for, and what the
        leader's phi would need to stand (`_needed`; while the leader is not shown above 0,
        a deviation bound of half its phi); SCREEN_MOST before MIN_SEEDS seeds. Each probe
        of a model step is a live call: this bounds a long tape with a weak top, whose every
        step would otherwise be probed by every seed."""
        estimates = self.shap.estimates()
        if len(self.shap.complete_seeds()) < MIN_SEEDS or not estimates:
            return SCREEN_MOST
        lead = max((e[0].value or 0.0) for e in estimates.values())
        if lead <= 0:
            return self.screen.clean_needed
        # The top may be several steps (an AND's halves): the weakest of those near the
        # leader sets what a verdict needs.
        near = [k for k, e in estimates.items() if (e[0].value or 0.0) >= lead / 2]
        needs = [self.shap.clean_to_clear(k, self._clear_alpha) for k in near]
        need = max((n for n in needs if n < math.inf), default=0)
        if math.inf in needs:
            need = max(need, DeviationScreen.clean_for(lead / 2, self.ctx.alpha))
        return int(min(SCREEN_MOST, max(self.screen.clean_needed, need)))

    def suggest(self, room: int) -> list[Fork] | None:
        shap, screen = self.shap, self.screen
        if screen.candidates != shap.candidates:
            return None  # the screen found another step: Shapley starts over
        self._look_ahead()
        verdict = shap.verdict(self.target)
        if verdict is None or not self._may_stop():
            return self._seeds(room)
        if self._stands(verdict):
            self.verdict = verdict
            return None
        if self._screen_next(verdict):
            out = screen_forks(self.ctx, screen, room, len(self.screening))
            self.screening.update(spec.task_id for _, spec in out)
            if out or self.screening:
                return out
            # The screen has gone as far as it goes (SCREEN_MOST draws, or it gave up on
            # strays): only seeds, which lower what the top needs, can make the verdict.
        return self._seeds(room)

    def done(self, exhausted: bool) -> Next:
        shap, screen = self.shap, self.screen
        found = screen.candidates != shap.candidates
        ended = exhausted or self.out_of_budget
        shown = self.ctx.rules.answering(shap, self.previous)
        if (exhausted and found) or (ended and shown is not shap):
            # The budget ended before a step found late was measured: as the screen found
            # it (no Shapley over it will begin), or before the Shapley over it completed
            # seeds that blame anything, fewer than a verdict looks at (`answering`). The
            # game before (that step held) is the answer there is, the step shown found and
            # not measured; no verdict stands without it.
            late = sorted(set(screen.candidates) - set(shown.candidates))
            if late and shown.complete_seeds():
                self.shown = shown
                seeds = len(shap.complete_seeds())
                if shown is shap or not seeds:
                    why = f"the budget ended before step(s) {late} were measured"
                    how = "were not measured"
                else:
                    why = (
                        f"the budget ended with {seeds} complete seed(s) of the Shapley over "
                        f"{shap.candidates}, none blaming any step, fewer than the {MIN_SEEDS} "
                        f"a verdict looks at and than the {len(shown.complete_seeds())} over "
                        f"{shown.candidates}"
                    )
                    how = f"were measured in only {seeds} seed(s)"
                self.notes.append(
                    Note(
                        kind="shapley_late",
                        severity="warning",
                        text=f"shapley: {why}: the blame shown is over {shown.candidates}, "
                        f"and step(s) {late} make choices but {how}",
                        figures={"late": late, "seeds": seeds},
                    )
                )
                return Next(end="budget_exhausted")
        if ended and not found:
            # The budget ended: the verdict of every fork it paid for may stand all the
            # same, and is then the job's answer.
            verdict = shap.verdict(self.target)
            # A separated top stands at the end of a `--more` run too: what it ran on for
            # (every interval within the target) is what the budget did not reach.
            may_stop = self._may_stop() or (verdict is not None and verdict[0] == "separated")
            if verdict is not None and may_stop and self._stands(verdict):
                self.verdict = verdict
                if not self._may_stop():
                    self.notes.append(
                        Note(
                            kind="more",
                            severity="info",
                            text="--more: the budget ended before every interval was within "
                            f"±{self.target:g}",
                        )
                    )
            else:
                self.unsettled = self._unsettled(verdict)
            return Next(end="complete" if self.verdict is not None else "budget_exhausted")
        if len(screen.candidates) == self.found:
            return Next()
        return Next(then=(HeldShapley(self.ctx, screen, previous=shown),))

    def result(self) -> tuple[StageResult, ...]:
        shown = self.shown
        phi, _, _ = shown._per_seed()
        phi.setflags(write=False)
        verdict = (self.verdict[0], tuple(self.verdict[1])) if self.verdict else None
        return (
            ShapleyResult(
                candidates=tuple(shown.candidates),
                seeds=tuple(shown.complete_seeds()),
                per_seed_phi=phi,
                estimates=shown.estimates(),
                verdict=verdict,
                screen=screen_result(self.screen),
                unsettled=self.unsettled,
                lacking=self.lacking,
                notes=tuple(self.notes),
            ),
        )

    def lead(self) -> Lead | None:
        """The step with the most blame so far, once two seeds are complete."""
        shap = self.shap
        if not shap.candidates or len(shap.complete_seeds()) < 2:
            return None
        phis = {k: e[0] for k, e in shap.estimates().items() if e[0].value is not None}
        if not phis:
            return None
        step = max(phis, key=lambda k: phis[k].value or 0.0)
        return step, phis[step]

    def _look_ahead(self) -> None:
        """The seeds the caps are projected to buy, never lowered, for the stopping rule
        (`rules.Look.horizon`): those complete, and those the forks the caps leave unspent
        buy at the forks a seed has cost."""
        shap, left = self.shap, self.ctx.forks_left()
        if left is not None:
            per_seed = max(1.0, shap.forks_per_seed())
            ahead = len(shap.complete_seeds()) + (left + len(self.pending)) / per_seed
            shap.horizon = max(shap.horizon or 0.0, ahead)

    def state(self) -> dict[str, Any]:
        return {"candidates": self.shap.candidates, "seeds": len(self.shap.complete_seeds())}

    def _unsettled(self, verdict: tuple[str, list[int]] | None) -> str:
        """Why the top did not separate before the budget ended (the tests that fail, and
        the steps not found that lack clean draws), and about how many more forks would
        separate it if the forks to come were like those so far: k more seeds, at least
        those `SeedShapley.lacks` projects for the tests, at the forks a seed has cost, and
        the screen forks still short of clearance after them (each one more clean draw; a
        seed brings `_probe_rate` of one), for the k of 0, 1, 2, 4, ... more that needs
        fewest (`_screen_next`'s trade: seeds also lower what the top needs of the steps not
        found); and the caps that would let it: the forks it spent (and carried) and the
        projection with GO_ON_SLACK of it again."""
        shap, screen = self.shap, self.screen
        if verdict is not None and verdict[0] == "separated":
            reasons: list[str] = []
            seeds, top = 0.0, verdict[1]
        else:
            reasons, seeds, top = shap.lacks()
        short = self._short(("separated", top)) if top else {}
        self.lacking = short if top else None
        if short:
            step = max(short, key=lambda k: short[k] - screen.clean.get(k, 0))
            need = short[step]
            reasons.append(
                f"step(s) {sorted(short)} not found to make choices lack the clean draws "
                "that show their blame below the top's ("
                + (
                    "the top's blame is not yet shown far enough above 0 for any number"
                    if need == math.inf
                    else f"step {step}: {screen.clean.get(step, 0)} of {need:g}"
                )
                + ")"
            )
        forks = self._forks_to_separate(seeds, top) if reasons else math.inf
        text = "; ".join(reasons) or "the forks it had did not settle it"
        if forks == math.inf:
            return f"{text}. How many more forks would separate it is not known from these"
        more = math.ceil(forks * GO_ON_SLACK)
        forks = math.ceil(forks)
        go_on, also = self.ctx.go_on(more)
        also = f" ({also})" if also else ""
        return (
            f"{text}. If the forks to come go as these did, about {forks} more would separate "
            f"it: the same command with {go_on} ({more} more, for the chance they do not) "
            f"goes on from here, keeping the forks paid for{also}"
        )

    def _forks_to_separate(self, seeds: float, top: list[int]) -> float:
        """`_unsettled`'s projection: the fewest forks, over k = `seeds` + 0, 1, 2, 4, ...
        more seeds, of k seeds at the forks a seed has cost and the clearance still short
        after them (at least one fork); inf if none is finite."""
        shap, screen = self.shap, self.screen
        if seeds == math.inf or not top:
            return math.inf
        per_seed = max(1.0, shap.forks_per_seed())
        unfound = self._unfound()
        alpha = self.ctx.alpha
        # What does not change with k, once: each step's reach and probe rate.
        reach = {k: shap.reach(k, alpha * REACH_ALPHA) for k in unfound}
        rate = {k: self._probe_rate(k) for k in unfound}
        best, extra = math.inf, 0
        while extra <= max(4 * len(shap.complete_seeds()), 50):
            more = math.ceil(seeds) + extra
            if more * per_seed >= best:
                break  # the clearance only adds
            lowers = [shap.phi_lower(t, more) for t in top]
            clear = max(
                (
                    max(clean_to_clear(lower, self._clear_alpha, reach[k]) for lower in lowers)
                    - screen.clean.get(k, 0)
                    - rate[k] * more
                    for k in unfound
                ),
                default=0.0,
            )
            best = min(best, more * per_seed + max(0.0, clear))
            extra = 2 * extra if extra else 1
        return max(1.0, best)

    def _stands(self, verdict: tuple[str, list[int]]) -> bool:
        """Whether Shapley's verdict has the screen's clearance behind it: every step not
        found has the clean draws the verdict needs of it (`_needed`). If not, the screen
        is asked for them (at most SCREEN_MOST: a top that needs more waits for seeds to
        lower it, and a screen that gave up on strays clears nothing more)."""
        if verdict == ("separated", []):
            return True  # nothing makes a choice: the screen cleared every step already
        short = self._short(verdict)
        if not short:
            return True
        self.screen.clean_needed = int(min(SCREEN_MOST, max(short.values())))
        return False

    @property
    def _clear_alpha(self) -> float:
        """The level at which a step not found is shown below the top (`clean_to_clear`):
        the job's alpha, whatever number of clean draws the screen gathered (it tops them up
        to what the top's seeds ask for), less REACH_ALPHA for the bound on how much of the
        step's weight reaches it (`SeedShapley.reach`). The pairs of candidates are tested
        at alpha over the rivals, their signs however often they are looked at
        (`rules.signs_agree`)."""
        return self.ctx.alpha * (1 - REACH_ALPHA)

    def _needed(
        self,
        verdict: tuple[str, list[int]],
        more_seeds: int = 0,
        steps: Sequence[int] | None = None,
    ) -> dict[int, float]:
        """Clean draws each step not found needs for `verdict` to stand. A separated top:
        enough to show that step's phi below every top step's (`clean_to_clear`: its
        deviation rate, times the share of its weight that reaches it at its recorded
        request, bounds its |phi|; tested jointly with the top's seeds); a precise verdict:
        a deviation bound within the target half-width. `more_seeds` asks what the need
        would be after that many more seeds like the ones so far; `steps`, of those steps
        alone (every step not found by default)."""
        unfound = self._unfound() if steps is None else list(steps)
        if verdict[0] != "separated":
            need = DeviationScreen.clean_for(self.target, self.ctx.alpha)
            return {k: need for k in unfound}
        shap, alpha = self.shap, self._clear_alpha
        out: dict[int, float] = {}
        for k in unfound:
            reach = shap.reach(k, self.ctx.alpha * REACH_ALPHA)
            out[k] = max(shap.clean_to_clear(t, alpha, more_seeds, reach) for t in verdict[1])
        return out

    def _short(self, verdict: tuple[str, list[int]]) -> dict[int, float]:
        """The steps not found that lack clean draws `verdict` needs of them, and the draws
        each needs."""
        clean = self.screen.clean
        return {k: n for k, n in self._needed(verdict).items() if clean.get(k, 0) < n}

    def _unfound(self) -> list[int]:
        """The resample steps the screen has not seen leave the tape."""
        return [k for k in self.screen.steps if k not in self.screen.hits]

    def _probe_rate(self, k: int) -> float:
        """The share of the complete Shapley seeds whose forks probed step k (reached it on
        the tape): how many clean draws of k a seed brings."""
        first = self.ctx.seeds.base + SHAPLEY_SEEDS
        seeds = {first + s for s in self.shap.complete_seeds()}
        if not seeds:
            return 0.0
        return sum(1 for s, j in self.screen.probes if j == k and s in seeds) / len(seeds)

    def _screen_next(self, verdict: tuple[str, list[int]]) -> bool:
        """Whether the next forks should be the screen's rather than Shapley seeds, while a
        verdict waits on its clearance: a screen fork gives the step furthest short of its
        clean draws one more; a fork of seeds gives it a probe where the seed's run reaches
        it on the tape (the share of seeds so far that did) and lowers what the top needs
        of it (the need after one more seed like the others). A precise verdict waits on
        the screen alone."""
        if verdict[0] != "separated":
            return True
        shap, screen = self.shap, self.screen
        if not shap.complete_seeds():
            return False
        short = self._short(verdict)
        if not short:
            return False
        weakest = max(short, key=lambda k: short[k] - screen.clean.get(k, 0))
        need = short[weakest]
        if need == math.inf:
            return False
        later = self._needed(verdict, more_seeds=1, steps=[weakest])[weakest]
        gain = self._probe_rate(weakest) + max(0.0, need - later)
        return gain / max(1.0, shap.forks_per_seed()) <= 1.0

    def _may_stop(self) -> bool:
        """Whether a verdict ends the Shapley stage: always, unless the job's `precise_only`
        (`--more`) asks for every phi interval within the target (a separated top is not
        enough then)."""
        if not self.ctx.precise_only:
            return True
        return all(phi.half_width <= self.target for phi, _, _ in self.shap.estimates().values())


def _observe(shap: SeedShapley, seed: int, spec: ForkSpec, row: Row, *, learn: bool) -> None:
    """A Shapley fork's row. Which steps drew their recorded action is learned only where the
    provider honours seeds: elsewhere another fork of the seed draws afresh, and a coalition
    known from this one would not be the draw its own fork makes. A fork whose first
    deviation is a probe measured nothing of its coalition while that step is not a
    candidate (the screen found it: Shapley starts over); once it is, and the provider
    honours seeds, the fork is its coalition with that step re-drawn (the probe drew it as
    a re-drawn step of that seed does, and later probes kept their mechanism). Without
    seeds it would be a draw chosen for leaving the tape there."""
    scored = row["outcome"] is not None
    coalition = coalition_of(spec)
    if scored and row["first_deviation"] in probes_of(spec):
        if row["first_deviation"] not in shap.candidates or not learn:
            return
        coalition = coalition | {row["first_deviation"]}
    first: int | Literal["unknown"] | None = row["first_deviation"] if learn else "unknown"
    shap.observe(seed, coalition, row["flipped"] if scored else None, first)
