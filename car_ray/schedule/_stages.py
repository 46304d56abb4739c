"""A job's stages: each one small class with the shape of Ray Tune's `Searcher`.

`suggest(room)` gives up to `room` forks to run next, `[]` while it waits for rows of forks in
flight, `None` when it is done; `observe(row)` takes each row of its forks (and rows an earlier
run of the job wrote, for the forks it asks for again); `unrun(spec)` says a fork it asked for
will not run (the budget refused it, or its provider kept failing); `done(exhausted)` is called
once nothing of it is in flight, and says what comes next (`Next`). A job's plan is an ordered
list of stages (`Scheduler.plan`); the run loop (`_loop.RunLoop`) drives it.

Stages keep their statistics on the job (`Scheduler`): the screen, the Shapley estimators and
the rows by arm are what the job's table is aggregated from, and what a later stage reads.
A new stage is a class here and a line in `Scheduler.plan`."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

import structlog

from .._answer import RAN, Answer
from ..execute import Row
from ..replay import ForkSpec, Intervention, Probe, Resample, SwapPolicy
from ._mechanism import MIN_SEEDS, DeviationScreen, SeedShapley, clean_to_clear

if TYPE_CHECKING:
    from ._plan import Scheduler

log = structlog.get_logger("car_ray.schedule")

Fork = tuple[str, ForkSpec]  # (stage name, spec): what a stage suggests

CONTROL_HINT = (
    "the agent is not deterministic under replay. Usual causes: a client or cache shared "
    "across concurrent runs (a module-level SDK client, a global conversation list), ids or "
    "timestamps in request bodies not taken from ctx.now / ctx.uuid4, randomness not from "
    "ctx.random. Check: `car-ray fork TAPE --job JOB.toml --step 0 --tail pinned` twice; "
    "both rows must show the tape's outcome and no divergence"
)
# The screen clears steps lazily. Its first pass runs one fork at a time and stops at the
# first step found (or once every step has SCREEN_FIRST clean re-draws); Shapley then runs over
# it, and every Shapley fork probes the steps not found (`replay.Probe`), so the other steps
# that choose are found by the seeds (Shapley then starts over, keeping every row it had) and
# their draws clear the rest. The screen goes on only while a step it has not found could
# still outrank the top: until each such step has the clean draws that show it below the top
# (`clean_to_clear`; at most SCREEN_MOST). When the first pass finds nothing, the screen goes
# on (SCREEN_IN_FLIGHT at a time) to its first find or SCREEN_CLEAN clean draws a step: then
# nothing makes a choice (a step leaving the tape 20% of the time is missed 1.2%). (A first
# pass that cleared every step to 4 stopped as often at the default budget and was right less
# often at small ones: and_conj at 14 forks, 2 of 6 seeds against 5 of 6; relay spent 42.6
# forks against 34.6, 20 seeds.)
SCREEN_FIRST = 4
SCREEN_CLEAN = 20
SCREEN_MOST = 60
# Shapley seeds of the held game are fork seeds from here on (of the attribution's 2^32): the
# screen's forks count from 0 and pick the candidates, so Shapley seeds that were the screen's
# would see every step it found leave the tape (a selection bias toward the found steps).
SHAPLEY_SEEDS = 1 << 31
# The share of alpha a clearance spends on bounding how much of a step's weight reaches it
# (`SeedShapley.reach`); the rest goes to the joint test (`clean_to_clear`).
REACH_ALPHA = 0.25
# What a job whose budget ended before its top separated suggests to go on: the forks it
# projects, and half as many again (`HeldShapley._unsettled`). Default jobs of the six
# scenarios that do not always stop, attribution seeds 0-79, `benchmarks/go_on.py`: of the
# 60 that ended on their budget with a projection, 55 separated within this (51 within the
# projection alone); small projections of seeds at their mean are the optimistic ones.
GO_ON_SLACK = 1.5
SCREEN_IN_FLIGHT = 4  # screen forks at once (each one's block depends on the ones before)
SEEDS_IN_FLIGHT = 2  # Shapley seeds at once while the verdict is far (`HeldShapley._window`)
# The share of the forks its caps leave unspent (in flight or not begun) that Shapley has in
# flight at once: a find among their rows (Shapley starts over) still has the rest to spend.
# (Attribution seeds 0-39: and_conj at 7 forks ranks an exact top step first in 35 against 25
# with every fork at once, research_async at 8 in 32 against 19; six default jobs, seeds
# 20-59: mean forks within 0.1.)
IN_FLIGHT_OF_LEFT = 0.5
ARM_FORKS = 8  # forks of an arm whose forks are not deterministic
UNSCORED = frozenset({"divergence", "error", "provider_error"})


@dataclass(frozen=True)
class Next:
    """What follows a stage: `then` runs before the rest of the plan; `end` ends the job now
    with that status. A stage that ended with the budget spent and says nothing ends the job
    `budget_exhausted`."""

    then: tuple[Stage, ...] = ()
    end: str | None = None


class Stage(Protocol):
    name: str

    def start(self) -> None: ...

    def suggest(self, room: int) -> list[Fork] | None: ...

    def observe(self, row: Row) -> None: ...

    def unrun(self, spec: ForkSpec) -> None: ...

    def done(self, exhausted: bool) -> Next: ...

    def state(self) -> dict[str, Any]: ...


class BaseStage:
    """Defaults: entering the stage starts its clock (`Scheduler.enter`); rows and unrun
    forks change nothing; the job goes on to the next stage."""

    name = ""

    def __init__(self, job: Scheduler) -> None:
        self.job = job

    def start(self) -> None:
        self.job.enter(self.name)

    def suggest(self, room: int) -> list[Fork] | None:
        return None

    def observe(self, row: Row) -> None:
        return None

    def unrun(self, spec: ForkSpec) -> None:
        return None

    def done(self, exhausted: bool) -> Next:
        return Next()

    def state(self) -> dict[str, Any]:
        return {}


class Listed(BaseStage):
    """A stage whose forks are a list fixed when it starts (`forks`), `room` at a time."""

    def start(self) -> None:
        super().start()
        self._given = self.forks()

    def forks(self) -> Iterator[Fork]:
        return iter(())

    def suggest(self, room: int) -> list[Fork] | None:
        return list(itertools.islice(self._given, room)) or None


# -- method "auto": the held mechanism ------------------------------------------------------------


class HeldControl(Listed):
    """The negative control: nothing intervened, every step held. It must reproduce the
    recorded outcome (with a seed-honouring provider it is the replay: no live call)."""

    name = "controls"

    def forks(self) -> Iterator[Fork]:
        return iter([("controls", self.job._spec("controls", "held", {}, "held", 0))])

    def done(self, exhausted: bool) -> Next:
        job = self.job
        rows = [r for _, r in job._rows("controls", "held")]
        bad = [r for r in rows if r["outcome"] != r["recorded_outcome"]]
        # A control that never ran (its provider failed every try) controls nothing.
        missing = not rows and not exhausted
        if missing or bad or any(r["status"] in UNSCORED | {"budget_cut"} for r in rows):
            job.control_failed = True
            what = (
                rows[0]["divergence"] or rows[0]["error"]
                if rows
                else "it never ran: its provider failed every try"
            )
            job.notes.append(
                "NEGATIVE CONTROL FAILED: the fork that changes nothing did not reproduce the "
                f"recorded outcome{f' ({what})' if what else ''}; {CONTROL_HINT}"
            )
            log.warning("control_failed", status=rows[0]["status"] if rows else None)
        if exhausted:
            return Next(end="budget_exhausted")
        # Every fork after it would measure the nondeterminism, not the steps.
        return Next(end="control_failed") if job.control_failed else Next()


class HeldArms(Listed):
    """Every other arm (observation, action, context, policy) with a held tail: one fork
    when the provider honours seeds and the fork draws nothing fresh (it is then exact),
    ARM_FORKS otherwise."""

    name = "arms"

    def forks(self) -> Iterator[Fork]:
        job = self.job
        for arm in job.arms:
            if arm.kind == "resample":
                continue
            exact = job.honours_seed and not isinstance(arm.intervention, SwapPolicy)
            for j in range(1 if exact else ARM_FORKS):
                plan = {arm.step: arm.intervention}
                yield ("arms", job._spec("arms", arm.key, plan, "held", j))


def screen_forks(
    job: Scheduler, room: int, pending: int, most: int = SCREEN_IN_FLIGHT
) -> list[Fork]:
    """Up to `room` forks of the screen's block (at most `most` in flight)."""
    assert job.screen is not None
    if job.screen.done():  # every step cleared, or it gave up on strays
        return []
    block = job.screen.block()
    plan: dict[int, Intervention] = {k: Resample() for k in block}
    n = max(0, min(room, most - pending))
    return [("screen", job._spec("screen", "block", plan, "held")) for _ in range(n)]


class HeldScreen(BaseStage):
    """Which steps ever choose differently: blocks of steps re-drawn together, held tail
    (see `DeviationScreen`), until the first step found or every step has its clean draws.
    Hands over to `HeldShapley` over the steps it found; with none found, screens again
    to the first find or SCREEN_CLEAN before it says no step makes a choice."""

    name = "screen"

    def start(self) -> None:
        job = self.job
        if job.screen is None:
            steps = [a.step for a in job.arms if a.kind == "resample"]
            job.screen = DeviationScreen(steps, clean_needed=SCREEN_FIRST)
            for spec, row in job._rows("screen", "held"):
                if row["outcome"] is not None:
                    job.screen.observe(sorted(spec.interventions), row["first_deviation"])
            for spec, row in job._rows("shapley", "held"):
                _probed(job.screen, spec, row)
        super().start()
        self.pending = 0

    @property
    def screen(self) -> DeviationScreen:
        assert self.job.screen is not None
        return self.job.screen

    def suggest(self, room: int) -> list[Fork] | None:
        screen = self.screen
        if screen.done() or screen.candidates:
            # Once a step is found, Shapley's probes screen the rest.
            return None
        # The first pass goes one fork at a time, so forks in flight do not all find the
        # same step; the second (nothing found yet) SCREEN_IN_FLIGHT at a time.
        first = screen.clean_needed < SCREEN_CLEAN
        out = screen_forks(self.job, room, self.pending, 1 if first else SCREEN_IN_FLIGHT)
        self.pending += len(out)
        return out

    def observe(self, row: Row) -> None:
        self.pending -= 1
        if row["outcome"] is not None:
            spec = ForkSpec.model_validate_json(row["spec"])
            self.screen.observe(sorted(spec.interventions), row["first_deviation"])

    def unrun(self, spec: ForkSpec) -> None:
        self.pending -= 1

    def done(self, exhausted: bool) -> Next:
        if exhausted:
            return Next(end="budget_exhausted")
        screen = self.screen
        if screen.candidates:
            return Next(then=(HeldShapley(self.job),))
        if screen.clean_needed >= SCREEN_CLEAN:
            self.job.verdict = ("separated", [])
            return Next()
        # Nothing found yet: clear every step to SCREEN_CLEAN before saying so.
        screen.clean_needed = SCREEN_CLEAN
        return Next(then=(HeldScreen(self.job),))

    def state(self) -> dict[str, Any]:
        return {"candidates": self.screen.candidates, "clean_needed": self.screen.clean_needed}


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

    def __init__(self, job: Scheduler, previous: SeedShapley | None = None) -> None:
        super().__init__(job)
        # The Shapley this one started over from (fewer candidates): its estimates may be the
        # answer if the budget ends first (`answering`).
        self.previous = previous

    def start(self) -> None:
        super().start()
        job = self.job
        assert job.screen is not None
        self.screen = job.screen
        self.found = len(self.screen.candidates)
        shap = self._replayed()
        self.shap = shap
        job.seed_shapley = shap
        job.verdict = None
        job.candidates = list(shap.candidates)
        self.pending: set[tuple[int, frozenset[int]]] = set()
        self.screening: set[str] = set()
        self.out_of_budget = False
        self.per_seed = max(1, len(shap.coalitions(0)))
        self.target = job.spec.target_half_width

    def _replayed(self) -> SeedShapley:
        """Shapley over the steps the screen has found, from what the job's forks showed so
        far: a probe that drew a step's recorded action in a seed is that step's fresh draw
        there, and every row of an earlier Shapley (over fewer candidates) is a coalition
        of this one's."""
        job, screen = self.job, self.screen
        shap = SeedShapley(screen.candidates, job.alpha, salt=str(job.spec.attribution_seed))
        if job.honours_seed:
            first = job.seed_base + SHAPLEY_SEEDS
            for fork_seed, k in sorted(screen.probes):
                if k in shap.candidates and fork_seed >= first:
                    shap.learn_clean(fork_seed - first, [k])
        for spec, row in job._rows("shapley", "held"):
            if self._seed(spec) >= 0:  # not a row of an older car-ray (the screen's seeds)
                _observe(shap, self._seed(spec), spec, row, learn=job.honours_seed)
        return shap

    def _seed(self, spec: ForkSpec) -> int:
        """Which seed of the Shapley stage a fork belongs to."""
        return spec.seed - self.job.seed_base - SHAPLEY_SEEDS

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
        _probed(self.screen, spec, row)
        _observe(self.shap, seed, spec, row, learn=self.job.honours_seed)

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
        left = self.job.forks_left()
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
            if not begun and left is not None and left - len(out) - owed < per_seed:
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
                key = ",".join(map(str, sorted(coalition)))
                out.append(("shapley", self.job._spec("shapley", key, plan, "held", fork_seed)))
            seed += 1
        return out

    def _window(self, per_seed: float, left: float | None) -> int:
        """Shapley forks in flight at once: up to SEEDS_IN_FLIGHT seeds' worth (at least 8
        forks) while the verdict is far, about half the forks the seeds still needed for it
        would take once it is near (`SeedShapley.seeds_to_verdict`), and one when it only
        waits on clearance. A fork in flight when the verdict comes is paid for and tells
        nothing; halving what is left keeps that waste to about half a look's forks, at the
        cost of more, smaller rounds near the end (on a provider: wall time, not money).
        `--more` keeps the window the caps allow (it waits on widths, not on the verdict).
        The caps (every job has a fork cap) allow about IN_FLIGHT_OF_LEFT of the forks they
        leave unspent (rounded up, at least one): at a small budget the first forks of a
        Shapley often find another step (it starts over), and forks in flight then were
        spent on the game it leaves."""
        most = max(SEEDS_IN_FLIGHT * self.per_seed, 8)
        if left is not None:  # `Scheduler.forks_left`: beside those in flight
            unspent = left + len(self.pending)
            most = min(most, max(1, math.ceil(unspent * IN_FLIGHT_OF_LEFT)))
        if self.job.precise_only:
            return most
        seeds = self.shap.seeds_to_verdict()
        if seeds == math.inf:
            return most
        return int(min(most, max(1, math.ceil(seeds * per_seed / 2))))

    def _probe_steps(self, fork_seed: int) -> list[int]:
        """The steps a fork probes: those not found that are short of the clean draws a
        verdict is likely to need (`_probes_wanted`), and not drawn with this fork seed before
        (by another fork of the seed, or by a Shapley that started over)."""
        screen, seed = self.screen, self.job.seed_base + fork_seed
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
        of a model step is a live call (the demo spends 29,705 tokens in 59 forks with
        probes, 26,372 in 71 without): this bounds a long tape with a weak top, whose every
        step would be probed by up to 60 seeds."""
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
            need = max(need, DeviationScreen.clean_for(lead / 2, self.job.alpha))
        return int(min(SCREEN_MOST, max(self.screen.clean_needed, need)))

    def suggest(self, room: int) -> list[Fork] | None:
        shap, screen = self.shap, self.screen
        if screen.candidates != shap.candidates:
            return None  # the screen found another step: Shapley starts over
        verdict = shap.verdict(self.target)
        if verdict is None or not self._may_stop():
            return self._seeds(room)
        if self._stands(verdict):
            self.job.verdict = verdict
            return None
        if self._screen_next(verdict):
            out = screen_forks(self.job, room, len(self.screening))
            self.screening.update(spec.task_id for _, spec in out)
            if out or self.screening:
                return out
            # The screen has gone as far as it goes (SCREEN_MOST draws, or it gave up on
            # strays): only seeds, which lower what the top needs, can make the verdict.
        return self._seeds(room)

    def done(self, exhausted: bool) -> Next:
        shap, screen, job = self.shap, self.screen, self.job
        found = screen.candidates != shap.candidates
        ended = exhausted or self.out_of_budget
        shown = answering(shap, self.previous)
        if (exhausted and found) or (ended and shown is not shap):
            # The budget ended before a step found late was measured: as the screen found
            # it (no Shapley over it will begin), or before the Shapley over it completed
            # seeds that blame anything, fewer than a verdict looks at (`answering`). The
            # game before (that step held) is the answer there is, the step shown found and
            # not measured; no verdict stands without it.
            late = sorted(set(screen.candidates) - set(shown.candidates))
            if late and shown.complete_seeds():
                job.seed_shapley, job.candidates = shown, list(shown.candidates)
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
                job.notes.append(
                    f"shapley: {why}: the blame shown is over {shown.candidates}, and step(s) "
                    f"{late} make choices but {how}"
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
                job.verdict = verdict
                if not self._may_stop():
                    job.notes.append(
                        f"--more: the budget ended before every interval was within "
                        f"±{self.target:g}"
                    )
            else:
                job.unsettled = self._unsettled(verdict)
            return Next(end="complete" if job.verdict is not None else "budget_exhausted")
        if len(screen.candidates) == self.found:
            return Next()
        return Next(then=(HeldShapley(job, previous=shown),))

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
        shap, screen, job = self.shap, self.screen, self.job
        if verdict is not None and verdict[0] == "separated":
            reasons: list[str] = []
            seeds, top = 0.0, verdict[1]
        else:
            reasons, seeds, top = shap.lacks()
        short = self._short(("separated", top)) if top else {}
        job.lacking = short if top else None
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
        go_on, also = job.governor.go_on(more)
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
        alpha = self.job.alpha
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
        (`_signs_agree`)."""
        return self.job.alpha * (1 - REACH_ALPHA)

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
            need = DeviationScreen.clean_for(self.target, self.job.alpha)
            return {k: need for k in unfound}
        shap, alpha = self.shap, self._clear_alpha
        out: dict[int, float] = {}
        for k in unfound:
            reach = shap.reach(k, self.job.alpha * REACH_ALPHA)
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
        first = self.job.seed_base + SHAPLEY_SEEDS
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
        if not self.job.precise_only:
            return True
        return all(phi.half_width <= self.target for phi, _, _ in self.shap.estimates().values())


def answering(later: SeedShapley, earlier: SeedShapley | None) -> SeedShapley:
    """Of a Shapley and the one it started over from (over fewer candidates, the steps found
    since held), the one whose blame answers if the budget ends: the later, unless its
    complete seeds are fewer than a verdict looks at (MIN_SEEDS) and than the earlier's, and
    blame nothing (no coalition of them flipped: every candidate tied at phi 0). Under a
    tight cap that is common: a seed whose forks stay on the tape is settled in one fork,
    one that leaves it needs more, so the complete seeds (0, 1, ... up to the first that is
    not) tend to end where a seed left the tape. The earlier then ranks what its seeds
    measured: jobs/research_async at 16 forks ranks an exact top step first in 38 of
    attribution seeds 0-39 against 36 with the later's always (`bench.top1`; the seeds the
    rule was chosen on), and on seeds 40-79 in 37 against 36, echo at 7 and 8 forks in 36
    and 39 against 33 and 36, no cell worse. A later game whose few seeds blame something
    answers: holding a step found late is no neutral choice (in an over-determined failure
    it hides the other cause), and with the earlier's blame instead, jobs/overdetermined at
    18 forks was right in 33 against 39."""
    if earlier is None:
        return later
    seeds = later.complete_seeds()
    blame = any(later.values[s][c] for s in seeds for c in later.values[s])
    if len(seeds) < MIN_SEEDS and len(earlier.complete_seeds()) > len(seeds) and not blame:
        return earlier
    return later


def held_notes(job: Scheduler) -> list[str]:
    """What the screen and Shapley found, for the job's notes (once they have run)."""
    screen = job.screen
    assert screen is not None
    notes = []
    if screen.strays:
        notes.append(
            f"screen: {screen.strays} forks left the tape at a step they did not re-draw "
            "(nondeterminism outside the context's seams?)"
        )
    probed = f" and probes in {screen.probe_forks} Shapley forks" if screen.probe_forks else ""
    notes.append(
        f"screen: {screen.forks} forks{probed}; steps that make choices: "
        f"{screen.candidates or 'none'}"
    )
    shap = job.seed_shapley
    n = len(shap.complete_seeds()) if shap is not None else 0
    if job.verdict is None:
        why = f": {job.unsettled}" if job.unsettled else ""
        notes.append(f"shapley: {n} seeds; the budget ended before the top separated{why}")
    elif job.verdict[1]:
        notes.append(
            f"shapley: {n} seeds; top cause {job.verdict[1]} {job.verdict[0]} at "
            f"{job.spec.confidence:.0%}"
        )
    elif job.verdict[0] == "precise":
        notes.append(
            f"shapley: {n} seeds; precise: every interval within "
            f"±{job.spec.target_half_width:g}, and no step's blame is above 0 at "
            f"{job.spec.confidence:.0%}"
        )
    elif screen.steps:
        # A claim about draws, so it says how many: a step that leaves the tape rarely enough
        # can be missed (one that does 20% of the time, by 20 draws, 1.2% of the time).
        fewest = min(screen.clean.get(k, 0) for k in screen.steps)
        if screen.strays and fewest < SCREEN_CLEAN:
            notes.append(
                "shapley: no step was seen to make a choice, but the screen stopped on forks "
                f"that left the tape where nothing was re-drawn, with as few as {fewest} "
                "re-draw(s) of a step: this says little"
            )
        else:
            # Rounded up: the bound is a most, and "14%" must not read below it.
            most = math.ceil(round(screen.bound_after(fewest, job.alpha) * 100, 9))
            notes.append(
                "shapley: no step makes a choice that could change the outcome, as far as "
                f"{fewest} re-draw(s) of each step show: at {job.spec.confidence:.0%}, none "
                f"leaves its recorded action more than {most}% of the time"
            )
    else:
        notes.append("shapley: no step makes a choice that could change the outcome")
    return notes


def held_answer(job: Scheduler, status: str) -> Answer:
    """What the held screen and Shapley let the job claim (`Answer`). A step is examined when
    Shapley measured its blame; a step the screen did not find is cleared by the verdict's
    own rule (with a top: the clean draws `_stands` asked of it; for a lead whose budget
    ended, those its top would need; with neither: the SCREEN_CLEAN clean re-draws a "no
    step makes a choice" note rests on); every other
    step is unexamined, and a job with an unexamined step has no answer (`lead` if it shows
    blame somewhere). A job whose status is not one of `RAN` answers nothing. The projection
    for unexamined steps is the forks so far per step examined or cleared, times the steps
    left, and never fewer than the screen forks that would give each unexamined step its
    SCREEN_CLEAN clean re-draws; the options allow GO_ON_SLACK of it again."""
    steps = [a.step for a in job.arms if a.kind == "resample"]
    screen, shap, verdict = job.screen, job.seed_shapley, job.verdict
    if screen is None:  # the job ended before its screen began
        return Answer(kind="unanswered", steps=steps, unexamined=steps, never=steps)
    estimates = shap.estimates() if shap is not None else {}
    examined = [k for k in steps if k in estimates]
    found = [k for k in steps if k in screen.hits and k not in estimates]
    unfound = [k for k in steps if k not in screen.hits]
    if verdict is not None and verdict[1]:
        cleared, short = unfound, []  # the verdict stands on their clean draws (`_stands`)
    elif verdict is None and job.lacking is not None:
        # A lead: the steps short of the clean draws its top would need (`_unsettled`).
        short = [k for k in unfound if k in job.lacking]
        cleared = [k for k in unfound if k not in job.lacking]
    else:
        cleared = [k for k in unfound if screen.clean.get(k, 0) >= SCREEN_CLEAN]
        short = [k for k in unfound if k not in cleared]
    unexamined = sorted(found + short)
    shown = any((phi.value or 0.0) > 0 for phi, _, _ in estimates.values())
    top = list(verdict[1]) if verdict is not None else []
    if status not in RAN:
        kind = "unanswered"
    elif verdict is not None and not unexamined:
        kind = "nothing" if verdict == ("separated", []) else verdict[0]
    else:
        kind = "lead" if shown else "unanswered"
    more = go_on = None
    if unexamined and status in RAN:
        spent = job.governor.spent.forks + job.governor.carried.forks
        seen = len(examined) + len(cleared)
        rate = spent * len(unexamined) / seen if seen else 0.0
        clear = SCREEN_CLEAN - min((screen.clean.get(k, 0) for k in short), default=SCREEN_CLEAN)
        more = max(1, math.ceil(max(rate, clear)))
        go_on, also = job.governor.go_on(math.ceil(more * GO_ON_SLACK))
        go_on = f"{go_on}; {also}" if also else go_on
    return Answer(
        kind=kind,
        steps=steps,
        top=top,
        examined=examined,
        cleared=cleared,
        unexamined=unexamined,
        never=[k for k in short if not screen.clean.get(k, 0)],
        found=found,
        more_forks=more,
        go_on=go_on,
    )


def measured_answer(job: Scheduler, table: Sequence[dict[str, Any]], status: str) -> Answer:
    """What the uniform scheme's table (flip-rates, no stopping rule) lets the job claim: an
    effect if any interval is shown above 0; else nothing to blame only when every re-drawn
    step's flip-rate is shown within the target half-width, and no answer otherwise (nor
    for a job whose status is not one of `RAN`)."""
    steps = [a.step for a in job.arms if a.kind == "resample"]
    rows = {r["step"]: r for r in table if r["intervention"] == "resample"}
    measured = [k for k in steps if rows.get(k, {}).get("flip_n")]
    target = job.spec.target_half_width
    cleared = [k for k in measured if (rows[k].get("flip_hi") or 1.0) <= target]
    unexamined = [k for k in steps if k not in measured]
    shown = any((r.get("flip_lo") or 0.0) > 0 for r in table)
    if status not in RAN:
        kind = "unanswered"
    elif shown:
        kind = "measured"
    else:
        kind = "nothing" if len(cleared) == len(steps) else "unanswered"
    return Answer(
        kind=kind,
        measure="flip_rate",
        steps=steps,
        examined=[k for k in measured if k not in cleared],
        cleared=cleared,
        unexamined=unexamined,
        never=unexamined,
    )


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


def _probed(screen: DeviationScreen, spec: ForkSpec, row: Row) -> None:
    """A scored fork's probes, to the screen (`DeviationScreen.probed`)."""
    probes = probes_of(spec)
    if probes and row["outcome"] is not None:
        screen.probed(spec.seed, probes, row["first_deviation"])


def coalition_of(spec: ForkSpec) -> frozenset[int]:
    """The steps a fork intervenes on, its probes aside (`replay.Probe`)."""
    return frozenset(k for k, iv in spec.interventions.items() if not isinstance(iv, Probe))


def probes_of(spec: ForkSpec) -> list[int]:
    """The steps a fork probes."""
    return sorted(k for k, iv in spec.interventions.items() if isinstance(iv, Probe))


# -- method "uniform" -----------------------------------------------------------------------------


class Uniform(Listed):
    """The uniform scheme: `forks_per_step` forks of every arm, one tail for all."""

    name = "uniform"

    def forks(self) -> Iterator[Fork]:
        job = self.job
        k, tail = job.spec.forks_per_step, job.spec.uniform_tail
        for j in range(k):
            for arm in job.arms:
                plan = {arm.step: arm.intervention}
                yield ("uniform", job._spec("uniform", arm.key, plan, tail, j))


def arm_key_of(stage: str, spec: ForkSpec) -> str:
    """The arm a fork belongs to, from its spec alone (so resumed rows find their arm)."""
    if stage == "shapley":
        return ",".join(map(str, sorted(coalition_of(spec))))
    if stage == "controls":
        if not spec.interventions:
            return "held" if spec.tail == "held" else "pinned"
        return "base"
    if stage == "screen" and spec.tail == "held":
        return "block"
    ((step, iv),) = spec.interventions.items()
    return f"{iv.kind}@{step}"
