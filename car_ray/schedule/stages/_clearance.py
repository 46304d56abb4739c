"""The screen's side of a Shapley verdict (`Clearance`): which steps the screen has not found,
the clean draws each needs before a verdict stands, where the next fork does more (a screen
draw or a seed), which steps a fork probes, and, when the budget ends first, why the top did
not separate and what would separate it."""

from __future__ import annotations

import math
from collections.abc import Sequence

from .._context import JobContext
from .._results import Unsettled
from .._tuning import GO_ON_SLACK, MIN_SEEDS, REACH_ALPHA, SCREEN_MOST
from ..estimators import DeviationScreen, SeedShapley
from ..rules import clean_to_clear

# Shapley seeds of the held game are fork seeds from here on (of the attribution's 2^32): the
# screen's forks count from 0 and pick the candidates, so Shapley seeds that were the screen's
# would see every step it found leave the tape (a selection bias toward the found steps).
SHAPLEY_SEEDS = 1 << 31


class Clearance:
    """The clearance behind the verdict of one Shapley game (`shap`) over the steps `screen`
    found: every step the screen has not found has the clean draws that show its phi below
    the top's (`needed`: `clean_to_clear` with `SeedShapley.reach`), or a deviation bound
    within the target half-width when the verdict is "precise"."""

    def __init__(
        self, ctx: JobContext, shap: SeedShapley, screen: DeviationScreen, target: float
    ) -> None:
        self.ctx = ctx
        self.shap = shap
        self.screen = screen
        self.target = target
        # The steps not found that lack the clean draws the top would need, and the draws
        # each needs, once the budget ended before a verdict (`unsettled`).
        self.lacking: dict[int, float] | None = None

    def probe_steps(self, fork_seed: int) -> list[int]:
        """The steps a fork probes: those not found that are short of the clean draws a
        verdict is likely to need (`probes_wanted`), and not drawn with this fork seed before
        (by another fork of the seed, or by a Shapley that started over)."""
        screen, seed = self.screen, self.ctx.seeds.base + fork_seed
        wanted = self.probes_wanted()
        return [
            k
            for k in self.unfound()
            if screen.clean.get(k, 0) < wanted and (seed, k) not in screen.probes
        ]

    def probes_wanted(self) -> int:
        """Clean draws a step not found should have: what the screen asks for, and what the
        leader's phi would need to stand (`needed`; while the leader is not shown above 0,
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
        needs = [self.shap.clean_to_clear(k, self.clear_alpha) for k in near]
        need = max((n for n in needs if n < math.inf), default=0)
        if math.inf in needs:
            need = max(need, DeviationScreen.clean_for(lead / 2, self.ctx.alpha))
        return int(min(SCREEN_MOST, max(self.screen.clean_needed, need)))

    def unsettled(self, verdict: tuple[str, list[int]] | None) -> Unsettled:
        """Why the top did not separate before the budget ended (the tests that fail, and
        the steps not found that lack clean draws), and about how many more forks would
        separate it if the forks to come were like those so far: k more seeds, at least
        those `SeedShapley.lacks` projects for the tests, at the forks a seed has cost, and
        the screen forks still short of clearance after them (each one more clean draw; a
        seed brings `probe_rate` of one), for the k of 0, 1, 2, 4, ... more that needs
        fewest (`screen_next`'s trade: seeds also lower what the top needs of the steps not
        found); and the caps that would let it: the forks it spent (and carried) and the
        projection with GO_ON_SLACK of it again."""
        shap, screen = self.shap, self.screen
        if verdict is not None and verdict[0] == "separated":
            reasons: list[str] = []
            seeds, top = 0.0, verdict[1]
        else:
            reasons, seeds, top = shap.lacks()
        short = self.short(("separated", top)) if top else {}
        self.lacking = short if top else None
        settled = {k: n for k, n in short.items() if k in screen.settled}
        if settled:
            reasons.append(
                self._lacking(
                    settled, "cleared on the outcome in groups lack the seeds of their round"
                )
            )
        short = {k: n for k, n in short.items() if k not in screen.settled}
        if short:
            reasons.append(self._lacking(short, "not found to make choices lack the clean draws"))
        projected = self.forks_to_separate(seeds, top) if reasons else math.inf
        text = "; ".join(reasons) or "the forks it had did not settle it"
        if projected == math.inf:
            why = f"{text}. How many more forks would separate it is not known from these"
            return Unsettled(why, tuple(reasons))
        more = math.ceil(projected * GO_ON_SLACK)
        forks = math.ceil(projected)
        go_on, also = self.ctx.go_on(more)
        aside = f" ({also})" if also else ""
        why = (
            f"{text}. If the forks to come go as these did, about {forks} more would separate "
            f"it: the same command with {go_on} ({more} more, for the chance they do not) "
            f"goes on from here, keeping the forks paid for{aside}"
        )
        return Unsettled(why, tuple(reasons), forks, more, go_on)

    def _furthest(self, short: dict[int, float]) -> int:
        """Of steps and the clean draws each needs, the one furthest short of them."""
        clean = self.screen.clean
        return max(short, key=lambda k: short[k] - clean.get(k, 0))

    def _lacking(self, short: dict[int, float], what: str) -> str:
        """`unsettled`'s reason for steps short of clean draws: which, and the furthest's
        draws against its need."""
        step = self._furthest(short)
        need = short[step]
        return (
            f"step(s) {sorted(short)} {what} that show their blame below the top's ("
            + (
                "the top's blame is not yet shown far enough above 0 for any number"
                if need == math.inf
                else f"step {step}: {self.screen.clean.get(step, 0)} of the {need:g} clean draws "
                "the top's seeds so far ask for"
            )
            + ")"
        )

    def forks_to_separate(self, seeds: float, top: list[int]) -> float:
        """`unsettled`'s projection: the fewest forks, over k = `seeds` + 0, 1, 2, 4, ...
        more seeds, of k seeds at the forks a seed has cost and the clearance still short
        after them (at least one fork); inf if none is finite."""
        shap, screen = self.shap, self.screen
        if seeds == math.inf or not top:
            return math.inf
        per_seed = max(1.0, shap.forks_per_seed())
        unfound = self.cleared()
        # What does not change with k, once: each step's reach and probe rate, and the round
        # that settled each settled step.
        reach = {k: self._reach(k) for k in unfound}
        rate = {k: self.probe_rate(k) for k in unfound}
        settled_in = {k: screen.round_of(k) for k in unfound if k in screen.settled}
        best, extra = math.inf, 0
        while extra <= max(4 * len(shap.complete_seeds()), 50):
            more = math.ceil(seeds) + extra
            if more * per_seed >= best:
                break  # the clearance only adds
            lowers = [shap.phi_lower(t, more) for t in top]
            needs = {
                k: max(clean_to_clear(lower, self.clear_alpha, reach[k]) for lower in lowers)
                - screen.clean.get(k, 0)
                for k in unfound
            }
            # A settled step's draws come from its round going on, a seed of every group a
            # clean draw of each; the others' from the screen, one a fork, and from probes.
            rounds: dict[int, float] = {}
            for k, number in settled_in.items():
                if number is not None:
                    rounds[number] = max(rounds.get(number, 0.0), needs[k])
            going_on = sum(
                max(0.0, n) * len(screen.rounds[number].groups) for number, n in rounds.items()
            )
            others = [k for k in unfound if k not in screen.settled]
            clear = max((needs[k] - rate[k] * more for k in others), default=0.0)
            best = min(best, more * per_seed + max(0.0, clear) + going_on)
            extra = 2 * extra if extra else 1
        return max(1.0, best)

    def stands(self, verdict: tuple[str, list[int]]) -> bool:
        """Whether Shapley's verdict has the screen's clearance behind it: every step not
        found has the clean draws the verdict needs of it (`needed`). If not, the screen
        is asked for them (at most SCREEN_MOST: a top that needs more waits for seeds to
        lower it, and a screen that gave up on strays clears nothing more)."""
        if verdict == ("separated", []):
            return True  # nothing makes a choice: the screen cleared every step already
        short = self.short(verdict)
        if not short:
            return True
        screened = [n for k, n in short.items() if k not in self.screen.settled]
        if screened:
            self.screen.clean_needed = int(min(SCREEN_MOST, max(screened)))
        return False

    def go_on(self, verdict: tuple[str, list[int]]) -> tuple[int, int] | None:
        """Whether the next forks should be a round of the group game going on (its number,
        and how many more seeds its settled steps lack), while a separated verdict waits on
        their clearance: a seed of the round is a clean draw of each of them at a fork a
        group, a Shapley seed lowers what the top needs (`screen_next`'s trade, for the
        settled step furthest short)."""
        shap, screen = self.shap, self.screen
        if verdict[0] != "separated" or not shap.complete_seeds():
            return None
        short = {k: n for k, n in self.short(verdict).items() if k in screen.settled}
        if not short:
            return None
        weakest = self._furthest(short)
        need, number = short[weakest], screen.round_of(weakest)
        if need == math.inf or number is None:
            return None
        later = self.needed(verdict, more_seeds=1, steps=[weakest])[weakest]
        per_draw = len(screen.rounds[number].groups)
        if max(0.0, need - later) / max(1.0, shap.forks_per_seed()) > 1.0 / per_draw:
            return None  # a Shapley seed lowers the need more, fork for fork
        more = max(
            n - screen.clean.get(k, 0) for k, n in short.items() if screen.round_of(k) == number
        )
        return number, math.ceil(more)

    @property
    def clear_alpha(self) -> float:
        """The level at which a step not found is shown below the top (`clean_to_clear`):
        the job's alpha, whatever number of clean draws the screen gathered (it tops them up
        to what the top's seeds ask for), less REACH_ALPHA for the bound on how much of the
        step's weight reaches it (`SeedShapley.reach`). The pairs of candidates are tested
        at alpha over the rivals, their signs however often they are looked at
        (`rules.signs_agree`)."""
        return self.ctx.alpha * (1 - REACH_ALPHA)

    def needed(
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
        unfound = self.cleared() if steps is None else list(steps)
        if verdict[0] != "separated":
            need = DeviationScreen.clean_for(self.target, self.ctx.alpha)
            return {k: need for k in unfound}
        shap, alpha = self.shap, self.clear_alpha
        out: dict[int, float] = {}
        for k in unfound:
            reach = self._reach(k)
            out[k] = max(shap.clean_to_clear(t, alpha, more_seeds, reach) for t in verdict[1])
        return out

    def _reach(self, k: int) -> float:
        """How much of step k's Shapley weight its clean draws speak for (`SeedShapley.
        reach`); all of it for a step the group game settled (its seeds bound its group's
        blame, wherever it stands in the order)."""
        if k in self.screen.settled:
            return 1.0
        return self.shap.reach(k, self.ctx.alpha * REACH_ALPHA)

    def short(self, verdict: tuple[str, list[int]]) -> dict[int, float]:
        """The steps not found that lack clean draws `verdict` needs of them, and the draws
        each needs."""
        clean = self.screen.clean
        return {k: n for k, n in self.needed(verdict).items() if clean.get(k, 0) < n}

    def unfound(self) -> list[int]:
        """The resample steps the screen has not seen leave the tape (and the group game has
        not settled): those a fork may probe."""
        screen = self.screen
        return [k for k in screen.steps if k not in screen.hits and k not in screen.settled]

    def cleared(self) -> list[int]:
        """The resample steps a verdict must clear: those not found, and those the group
        game settled (their group's seeds are their clean draws)."""
        screen = self.screen
        return [k for k in screen.steps if k not in screen.hits or k in screen.settled]

    def probe_rate(self, k: int) -> float:
        """The share of the complete Shapley seeds whose forks probed step k (reached it on
        the tape): how many clean draws of k a seed brings."""
        first = self.ctx.seeds.base + SHAPLEY_SEEDS
        seeds = {first + s for s in self.shap.complete_seeds()}
        if not seeds:
            return 0.0
        return sum(1 for s, j in self.screen.probes if j == k and s in seeds) / len(seeds)

    def screen_next(self, verdict: tuple[str, list[int]]) -> bool:
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
        short = {k: n for k, n in self.short(verdict).items() if k not in screen.settled}
        if not short:
            return False  # only seeds lower what a settled step needs
        weakest = self._furthest(short)
        need = short[weakest]
        if need == math.inf:
            return False
        later = self.needed(verdict, more_seeds=1, steps=[weakest])[weakest]
        gain = self.probe_rate(weakest) + max(0.0, need - later)
        return gain / max(1.0, shap.forks_per_seed()) <= 1.0
