"""The held Shapley stage: blame over the steps the screen found, one seed at a time, with
the screen's clearance behind its verdict."""

from __future__ import annotations

import json
from types import MappingProxyType
from typing import Any

import numpy as np

from ..._notes import Note
from ...execute import Row
from ...replay import ForceAction, ForkSpec, Intervention, Probe, Resample, SeedDraw
from ...tape import LlmEvent
from .._context import JobContext, coalition_of, probes_of
from .._results import ShapleyResult, StageResult, Unsettled
from .._tuning import MIN_SEEDS
from ..estimators import DeviationScreen, SeedShapley
from ..rules import WindowLook
from ._base import BaseStage, Fork, Lead, Next
from ._clearance import SHAPLEY_SEEDS, Clearance
from ._groups import GoingOn, HeldGroups, grouped, played
from ._screening import probed, screen_forks, screen_result


class HeldShapley(BaseStage):
    """Shapley blame over the steps the screen found, one seed at a time (see
    `SeedShapley`), until the top cause is separated or the intervals are precise, with
    the screen's clearance behind the verdict: every step the screen has not found has
    the clean draws that show its phi below the top's (`Clearance.needed`: `clean_to_clear` with
    `SeedShapley.reach`), or a deviation bound within the target half-width when the
    verdict is "precise". While it has not, each fork goes where it gives more
    (`Clearance.screen_next`): a screen fork is one more clean draw, a seed a probe and a top that
    needs fewer. When the screen finds another step, Shapley starts over (a new
    `HeldShapley` over the steps found, keeping every row; `HeldGroups` once they are
    GROUPS_FROM or more)."""

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
        self.unsettled: Unsettled | None = None
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
        self.clearance = Clearance(self.ctx, shap, self.screen, self.target)
        self.regroup = False  # the outcome, not the screen, must say what matters
        # An earlier run of the job went on from here to the group game (its rows say so:
        # this run's rows of it come only after this stage).
        self.regrouped = played(self.ctx)
        self.flipped = False  # a complete seed has flipped: never blind again
        self.going_on = GoingOn(self.ctx, self.screen)  # group rounds asked for more seeds

    def _blind(self) -> bool:
        """Whether this Shapley can neither blame nor find anything: MIN_SEEDS complete
        seeds and not one flip among them, and no seed's forks reach any step the screen
        has not found at its recorded request (every candidate leaves the tape before it:
        steps whose words change at every re-draw), so its probes can find nothing more.
        The group game asks the outcome instead (`grouped`)."""
        shap, screen = self.shap, self.screen
        if screen.grouped or self.flipped:
            return False
        if self.regrouped:
            return True
        if len(shap.complete_seeds()) < MIN_SEEDS:
            return False
        phi, _, _ = shap.per_seed()
        self.flipped = bool(np.any(phi))  # complete seeds stay complete: it stays so
        unfound = self.clearance.unfound()
        return (
            bool(unfound)
            and not self.flipped
            and all(self.clearance.probe_rate(k) == 0.0 for k in unfound)
        )

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
            # Off a provider that couples draws, a seed's forks draw its model steps alike
            # (`_plan`).
            learnable=None
            if ctx.honours_seed
            else frozenset(k for k in screen.candidates if isinstance(ctx.steps[k], LlmEvent)),
        )
        # A probe that drew a step's recorded action in a seed is that step's draw there.
        first = ctx.seeds.base + SHAPLEY_SEEDS
        for fork_seed, k in sorted(screen.probes):
            if k in shap.candidates and fork_seed >= first:
                shap.learn_clean(fork_seed - first, [k])
        # Off a provider that couples draws: the candidates this game keeps as a maximal
        # coupling would once their requests changed, and the seeds that drew one of them
        # live (`_stale`).
        couple = ctx.seeds.couple
        self.coupled = frozenset(couple().keys() & set(shap.candidates)) if couple else frozenset()
        # (A seed below 0: a row of an older car-ray's screen.)
        rows = [(sp, r) for sp, r in ctx.rows.of("shapley", "held") if self._seed(sp) >= 0]
        self.stale = {self._seed(spec) for spec, _ in rows if self._stale(spec)}
        for spec, row in rows:
            if self._seed(spec) in self.stale:
                shap.failed.add(self._seed(spec))
            else:
                _observe(shap, self._seed(spec), spec, row)
        return shap

    def _stale(self, spec: ForkSpec) -> bool:
        """Whether a fork shows its seed plays another game than this one: it probed a
        candidate this game couples (the screen had not found it yet) and its seed's
        coupling, fixed at the seed's first fork (`Seeds.fork`), lacks it. Such a seed drew
        that candidate live wherever its request had changed, so an earlier step took its
        blame (an over-determined pair's first half credited with the whole, the second
        shown below 0); it is left out, as a failed seed is. Seeds begun once it was a
        candidate never probe it, so they are never left out, whatever coupling the
        provider's draws give them later."""
        if spec.couple is None:
            return False
        return bool((self.coupled & set(probes_of(spec))) - spec.couple.keys())

    def _seed(self, spec: ForkSpec) -> int:
        """Which seed of the Shapley stage a fork belongs to."""
        return spec.seed - self.ctx.seeds.base - SHAPLEY_SEEDS

    def observe(self, row: Row) -> None:
        spec = ForkSpec.model_validate_json(row["spec"])
        if spec.task_id in self.going_on.pending:
            self.going_on.observe(spec, None if row["outcome"] is None else bool(row["flipped"]))
            return
        if spec.task_id in self.screening:
            self.screening.discard(spec.task_id)
            if row["outcome"] is not None:
                self.screen.observe(sorted(spec.interventions), row["first_deviation"])
            return
        seed, coalition = self._seed(spec), coalition_of(spec)
        self.pending.discard((seed, coalition))
        # A probe that left the tape is a step the screen had not found: Shapley starts over.
        probed(self.screen, spec, row)
        if self._stale(spec):
            self.stale.add(seed)
        if seed in self.stale:
            self.shap.failed.add(seed)
            return
        _observe(self.shap, seed, spec, row)

    def unrun(self, spec: ForkSpec) -> None:
        if spec.task_id in self.going_on.pending:
            self.going_on.observe(spec, None)  # the seed is left out; its round goes no further
            return
        if spec.task_id in self.screening:
            self.screening.discard(spec.task_id)
            return
        seed, coalition = self._seed(spec), coalition_of(spec)
        # Given up (its provider failed every try) or refused by the budget: the seed has no
        # outcome and is left out; its other forks are not asked again. (Marking it `cut`,
        # which ends the seeds counted, would leave a given-up seed blocking every later one:
        # the loop's unrun does not yet tell the two apart.)
        self.pending.discard((seed, coalition))
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
            serial = not self.ctx.honours_seed
            if serial and any((seed, c) in pending for c in todo):
                # Off a coupling provider a seed's forks run one at a time: each draws a step
                # at its recorded request only where no fork of the seed has (`_plan`).
                owed += sum(1 for c in todo if not shap.known(seed, c) and (seed, c) not in pending)
                seed += 1
                continue
            if serial and begun:
                # The forks this seed may still need beyond the one asked now.
                owed += max(0, sum(1 for c in todo if not shap.known(seed, c)) - 1)
            for coalition in todo:
                if len(out) >= room:
                    break
                if shap.known(seed, coalition) or (seed, coalition) in pending:
                    continue
                pending.add((seed, coalition))
                fork_seed = SHAPLEY_SEEDS + seed
                plan = self._plan(seed, coalition)
                # The fork also probes the steps not found that no fork of its seed has
                # shown yet: screen draws for free (a smaller coalition stays on the tape
                # longer, and reaches later steps at their recorded requests).
                plan.update((k, Probe()) for k in self.clearance.probe_steps(fork_seed))
                key = tuple(sorted(coalition))
                out.append(
                    ("shapley", self.ctx.seeds.fork("shapley", key, plan, "held", fork_seed))
                )
                if serial:
                    break
            seed += 1
        return out

    def _plan(self, seed: int, coalition: frozenset[int]) -> dict[int, Intervention]:
        """A coalition's fork: each step re-drawn. Off a provider that does not repeat a
        seed's draws, a model step a fork of the seed has drawn at its recorded request
        answers as it did wherever the run meets it there (`replay.SeedDraw`: the recorded
        answer, or the action it drew, forced), so that each step is drawn there once a seed
        and the seed's coalitions read one another as on the coupled provider; the seed's
        forks run one at a time (`_seeds`), so no two draw a step there at once."""
        plan: dict[int, Intervention] = {}
        for k in sorted(coalition):
            standing = "fresh" if self.ctx.honours_seed else self.shap.standing(seed, k)
            if standing == "fresh":
                plan[k] = Resample()
            elif standing == "clean":
                plan[k] = SeedDraw()
            else:
                plan[k] = SeedDraw(action=ForceAction.model_validate(_forceable(standing)))
        return plan

    def _window(self, per_seed: float, left: float | None) -> int:
        """Shapley forks in flight at once, as the job's window rule says
        (`ShapleyRules.window`), from the forks its caps leave unspent (those in flight
        counted: `forks_left` leaves them out)."""
        look = WindowLook(
            self.shap,
            coalitions=self.per_seed,
            per_seed=per_seed,
            unspent=None if left is None else left + len(self.pending),
            precise_only=self.ctx.precise_only,
        )
        return self.ctx.rules.window.size(look)

    def suggest(self, room: int) -> list[Fork] | None:
        shap, screen = self.shap, self.screen
        if screen.candidates != shap.candidates:
            return None  # the screen found another step: Shapley starts over
        if self._blind():
            self.regroup = True
            return None
        self._look_ahead()
        verdict = shap.verdict(self.target)
        if verdict is None or not self._may_stop():
            return self._seeds(room)
        if self.clearance.stands(verdict):
            self.verdict = verdict
            return None
        if self.clearance.screen_next(verdict):
            out = screen_forks(self.ctx, screen, room, len(self.screening))
            self.screening.update(spec.task_id for _, spec in out)
            if out or self.screening:
                return out
            # The screen has gone as far as it goes (SCREEN_MOST draws, or it gave up on
            # strays): only seeds, which lower what the top needs, can make the verdict.
        going_on = self.clearance.go_on(verdict)
        if going_on is not None:
            out = self.going_on.forks(*going_on, room)
            if screen.candidates != shap.candidates:
                return None  # a group the round settled was not clear: Shapley starts over
            if out or self.going_on.pending:
                return out
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
            if verdict is not None and may_stop and self.clearance.stands(verdict):
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
                self.unsettled = self.clearance.unsettled(verdict)
            return Next(end="complete" if self.verdict is not None else "budget_exhausted")
        if self.regroup and not exhausted:
            return Next(then=(HeldGroups(self.ctx, screen),))
        if len(screen.candidates) == self.found:
            return Next()
        if grouped(self.ctx, screen):
            # Many steps found: the outcome says which of them matter first.
            return Next(then=(HeldGroups(self.ctx, screen),))
        return Next(then=(HeldShapley(self.ctx, screen, previous=shown),))

    def result(self) -> tuple[StageResult, ...]:
        shown = self.shown
        phi, _, _ = shown.per_seed()
        phi.setflags(write=False)
        lacking = self.clearance.lacking
        verdict = (self.verdict[0], tuple(self.verdict[1])) if self.verdict else None
        return (
            ShapleyResult(
                candidates=tuple(shown.candidates),
                seeds=tuple(shown.complete_seeds()),
                per_seed_phi=phi,
                estimates=MappingProxyType(shown.estimates()),
                verdict=verdict,
                screen=screen_result(self.screen),
                unsettled=self.unsettled,
                lacking=None if lacking is None else MappingProxyType(dict(lacking)),
                notes=(*self.going_on.notes(), *self.notes),
            ),
        )

    def lead(self) -> Lead | None:
        """The step with the most blame so far in the game the job shows, once two seeds
        are complete."""
        shap = self.shown
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
        shown = self.shown
        return {"candidates": shown.candidates, "seeds": len(shown.complete_seeds())}

    def _may_stop(self) -> bool:
        """Whether a verdict ends the Shapley stage: always, unless the job's `precise_only`
        (`--more`) asks for every phi interval within the target (a separated top is not
        enough then)."""
        if not self.ctx.precise_only:
            return True
        return all(phi.half_width <= self.target for phi, _, _ in self.shap.estimates().values())


def _observe(shap: SeedShapley, seed: int, spec: ForkSpec, row: Row) -> None:
    """A Shapley fork's row, and which of its steps drew their recorded action (where the
    provider repeats a seed's draws, every candidate; elsewhere the model steps, which a
    seed's forks draw once at their recorded request, `SeedShapley.standing`). A fork whose
    first deviation is a probe measured nothing of its coalition while that step is not a
    candidate (the screen found it: Shapley starts over); once it is, the fork is its
    coalition with that step re-drawn (the probe drew it at its recorded request as a
    re-drawn step of that seed does, and later probes kept their mechanism). Dropped, it
    would take with it the clean draws of the steps before the probe, and those steps
    would be drawn again: dirty more often than they are."""
    scored = row["outcome"] is not None
    coalition = coalition_of(spec)
    if scored and row["first_deviation"] in probes_of(spec):
        if row["first_deviation"] not in shap.candidates:
            return
        coalition = coalition | {row["first_deviation"]}
    flipped = row["flipped"] if scored else None
    shap.observe(seed, coalition, flipped, row["first_deviation"], row.get("drawn"))


def _forceable(action: str) -> dict[str, Any]:
    """A drawn action (`ForkRow.drawn`) as a `ForceAction`'s fields: its text and tool calls
    (an answer with neither is forced as empty text)."""
    drawn = json.loads(action)
    text, calls = drawn.get("text"), drawn.get("tool_calls") or []
    return {"text": "" if text is None and not calls else text, "tool_calls": calls}
