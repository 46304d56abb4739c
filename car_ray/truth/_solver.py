"""Exact values of a scenario by enumerating branches through the fork machinery.

Every fork runs through the same `ForkRunner`, `Run` and interventions as the engine's; only
the simulated provider's draw is replaced: where a fork draws fresh (a resampled step, a live
tail, a swapped model), the solver answers with each action of the policy's distribution in
turn, weighted by its probability; where a held step is re-answered with the recorded draw's
randomness, it answers exactly as the simulated provider would. So the semantics of `held`,
`pinned`, `live` and every intervention cannot drift between the engine and its ground truth.

Two games (`Game`). `held`: a held step whose request changed lands the recorded draw's
uniform on its new distribution (the coupled simulated provider; the held game as defined).
`maximal`: what a job off the coupled provider estimates (`replay.Run._coupled`), with the
true chances in place of a few draws: a held step whose request changed keeps its recorded
decision d with probability min(1, p'(d) / p(d)) (p at its recorded request, p' at the changed
one) and otherwise answers with an action of another decision, in proportion to p'; a step
whose recorded decision has a share below 1 / COUPLE_MOST at its recorded request draws from
p' (a job's few draws could not tell its share). A step that never chose (p(d) = 1) draws from
p' under either rule. Unlike `held`, `maximal` does not depend on the order a policy lists
its actions in.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict

from ..job import Job
from ..providers import Action
from ..replay import (
    BaseUrls,
    ForkRow,
    ForkRunner,
    ForkSpec,
    Intervention,
    Resample,
    Tail,
    Upstream,
    fresh_seed,
    is_bad,
    step_seed,
)
from ..replay._decisions import Decisions
from ..replay._upstream import WireRequest, WireResponse
from ..schedule import Arm, exact_shapley, job_arms
from ..schedule._tuning import COUPLE_MOST
from ..sim import Distribution, ScenarioPolicy, SimApp, draw, uniform_for_seed
from ..tape import LlmEvent, Tape

MAX_PLAYERS = 12
MAX_RUNS = 200_000
_SEED = 0  # the solver's forks all use fork seed 0: fresh draws are told apart by step
# What a held step whose request changed answers (see the module).
Game = Literal["held", "maximal"]


def game_of(draws: str) -> Game:
    """The game a job estimates on a simulated provider drawing `draws` (`sim_draws`): the
    held game on the coupled one, the maximal game off it (with the estimated coupling)."""
    return "held" if draws == "coupled" else "maximal"


class BranchingTooLarge(ValueError):
    """The scenario's tree is too large to enumerate: says where and what to do."""


@dataclass
class _Draw:
    step: int | None
    options: tuple[tuple[float, Action], ...]
    chosen: int


class _EnumeratingApp(SimApp):
    """The simulated provider with its fresh draws scripted: the i-th fresh draw of a run
    takes option `script[i]` (0 past the script), and every draw is traced. Under the
    `maximal` game a held step whose distribution changed is a draw too (see the module),
    once `recorded` holds the step's distribution at its recorded request."""

    def __init__(
        self,
        policy: ScenarioPolicy,
        recorded_seed: int | None,
        steps: int,
        *,
        game: Game = "held",
        decisions: Decisions | None = None,
    ) -> None:
        super().__init__(policy)
        span = range(steps + 64)
        # Seed 0 is a seed: a tape recorded with it re-answers held steps with its draws.
        self._held = (
            {step_seed(recorded_seed, k): k for k in span} if recorded_seed is not None else {}
        )
        self._fresh_step = {fresh_seed(_SEED, k): k for k in span}
        self.game = game
        self.decisions = decisions or Decisions()
        # Each step's distribution at its recorded request (read off its first fresh draw
        # there, `Solver._read_recorded`).
        self.recorded: dict[int, Distribution] = {}
        self.fresh: dict[int, Distribution] = {}
        self.script: list[int] = []
        self.trace: list[_Draw] = []

    def begin(self, script: list[int]) -> None:
        self.script, self.trace = list(script), []

    def choose(self, distribution: Distribution, seed: int | None) -> Action:
        held = self._held.get(seed) if seed is not None else None
        if held is not None:
            recorded = self.recorded.get(held)
            if self.game == "held" or recorded is None or _same(distribution, recorded):
                return super().choose(distribution, seed)
            return self._branch(None, self._coupled(distribution, recorded, seed))
        step = self._fresh_step.get(seed) if seed is not None else None
        if step is not None:
            self.fresh.setdefault(step, tuple(distribution))
        return self._branch(step, tuple((p, a) for p, a in distribution if p > 0))

    def _branch(self, step: int | None, weighted: tuple[tuple[float, Action], ...]) -> Action:
        options = _merged(self.policy, weighted)
        i = len(self.trace)
        chosen = self.script[i] if i < len(self.script) else 0
        self.trace.append(_Draw(step, options, chosen))
        return options[chosen][1]

    def _coupled(
        self, changed: Distribution, recorded: Distribution, seed: int | None
    ) -> tuple[tuple[float, Action], ...]:
        """The `maximal` game's answer of a held step at a changed request: each action with
        its chance (see the module)."""
        assert seed is not None
        decided = self._decision(draw(recorded, uniform_for_seed(seed)))
        p = sum(w for w, a in recorded if self._decision(a) == decided)
        live = tuple((w, a) for w, a in changed if w > 0)
        if p * COUPLE_MOST < 1:
            return live
        q = sum(w for w, a in live if self._decision(a) == decided)
        keep = min(1.0, q / p)
        return tuple(
            (keep * w / q if self._decision(a) == decided else (1 - keep) * w / (1 - q), a)
            for w, a in live
            if (keep * w > 0 if self._decision(a) == decided else (1 - keep) * w > 0)
        )

    def _decision(self, action: Action) -> Any:
        return self.decisions.decision(action.to_json())


def _same(a: Distribution, b: Distribution) -> bool:
    """Whether two distributions list the same actions with the same chances."""
    return [(p, x) for p, x in a if p > 0] == [(p, x) for p, x in b if p > 0]


def _merged(
    policy: ScenarioPolicy, options: tuple[tuple[float, Action], ...]
) -> tuple[tuple[float, Action], ...]:
    """The options of a draw with the actions the policy declares interchangeable for
    everything downstream (`interchangeable(action)`: one key for alike actions, as the
    wordings of `sim.Worded` are) merged into one, their probabilities summed: the solver
    enumerates what can change an outcome, not every wording of it."""
    key = getattr(policy, "interchangeable", None)
    if key is None:
        return options
    merged: dict[Hashable, tuple[float, Action]] = {}
    for p, action in options:
        k = key(action)
        total, first = merged.get(k, (0.0, action))
        merged[k] = (total + p, first)
    return tuple(merged.values())


class _AppUpstream:
    """An `Upstream` that answers in process from a `SimApp` (no sockets)."""

    def __init__(self, app: SimApp) -> None:
        self.app = app

    async def send(self, request: WireRequest) -> WireResponse:
        headers = {k.lower(): v for k, v in request.headers}
        status, extra, body = await self.app.answer(
            urlsplit(request.url).path, headers, request.body
        )
        return WireResponse(status, tuple(extra), body)

    async def aclose(self) -> None:
        return None


class StepTruth(BaseModel):
    """The exact values of one step. `phi` is the Shapley blame over the held game (positive:
    the step pushed toward the bad outcome); `necessity` = P(the failure disappears |
    re-draw this step alone, the rest held); `sufficiency` = P(the failure stays | hold this
    step alone, re-draw the rest); `live_flip` = P(flip | re-draw this step and everything
    after it). A step that never has a choice to make is not a player: its phi is 0."""

    model_config = ConfigDict(frozen=True)

    step: int
    kind: str
    label: str
    player: bool
    phi: float
    necessity: float
    sufficiency: float
    live_flip: float | None


class ArmTruth(BaseModel):
    """The exact flip probability of one arm of the job (an intervention kind at a step),
    with the tail the engine measures it under."""

    model_config = ConfigDict(frozen=True)

    kind: str
    step: int
    tail: str
    flip: float


class Truth(BaseModel):
    """A scenario's exact answer: what `validate` and `bench` score the engine against."""

    model_config = ConfigDict(frozen=True)

    job: str
    tape_id: str
    recorded_outcome: float
    base_rate: float
    players: list[int]
    top: list[int]
    steps: list[StepTruth]
    arms: list[ArmTruth]
    coalitions: dict[str, float]
    runs: int
    # The game the values are of: "held" (the coupled provider's) or "maximal".
    game: Game = "held"

    def step(self, k: int) -> StepTruth:
        return self.steps[k]

    def arm(self, kind: str, step: int) -> ArmTruth | None:
        return next((a for a in self.arms if a.kind == kind and a.step == step), None)

    def coalition(self, steps: Sequence[int]) -> float:
        """v(S) = P(bad | re-draw S, hold the rest), for S among the players."""
        return self.coalitions[_key(steps)]


def _key(steps: Sequence[int]) -> str:
    return ",".join(map(str, sorted(steps)))


class Solver:
    """Enumerates a job's scenario on one tape. Use `async with` or call `aclose`."""

    def __init__(
        self,
        job: Job,
        tape: Tape,
        *,
        max_players: int = MAX_PLAYERS,
        max_runs: int = MAX_RUNS,
        game: Game = "held",
    ) -> None:
        if job.spec.policy is None:
            raise BranchingTooLarge(
                f"{job.path}: exact values need a simulated scenario: set 'policy'"
            )
        self.job = job
        self.tape = tape
        self.max_players = max_players
        self.max_runs = max_runs
        self.game: Game = game
        self.app = _EnumeratingApp(
            job.load("policy"),
            tape.header.seed,
            len(tape.steps),
            game=game,
            decisions=job.decisions,
        )
        self._read = game == "held"
        upstream: Upstream = _AppUpstream(self.app)
        self.runner = ForkRunner(
            job.load("agent"),
            job.load("scorer"),
            base_urls=BaseUrls.recorded_in(tape),
            upstream=upstream,
            max_threads=1,
            decisions=job.decisions,
        )
        self.runner.add_tape(tape)
        self.runs = 0
        self.recorded_bad = is_bad(self.runner.recorded_outcome(tape.tape_id))

    async def aclose(self) -> None:
        await self.runner.aclose()

    async def __aenter__(self) -> Solver:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def leaves(
        self, plan: dict[int, Intervention], tail: Tail
    ) -> list[tuple[float, ForkRow, list[_Draw]]]:
        """Every branch of one fork spec: (probability, row, the fresh draws taken)."""
        if not self._read:
            await self._read_recorded()
        spec = ForkSpec(tape_id=self.tape.tape_id, interventions=plan, tail=tail, seed=_SEED)
        out: list[tuple[float, ForkRow, list[_Draw]]] = []
        script: list[int] = []
        while True:
            self.runs += 1
            if self.runs > self.max_runs:
                raise BranchingTooLarge(
                    f"{self.job.path}: more than {self.max_runs} runs to enumerate (at the "
                    f"fork {sorted(plan)} with a {tail} tail): the scenario branches too much "
                    "for exact values; give its policy fewer stochastic steps or actions"
                )
            self.app.begin(script)
            row = await self.runner.run(spec)
            if row.outcome is None:
                raise BranchingTooLarge(
                    f"{self.job.path}: a branch of the fork {sorted(plan)} ({tail} tail) "
                    f"ended without an outcome ({row.status}: "
                    f"{row.error or row.divergence or row.blocked_effect}); exact values "
                    "need every branch to end in a score"
                )
            trace = list(self.app.trace)
            probability = 1.0
            for d in trace:
                probability *= d.options[d.chosen][0]
            out.append((probability, row, trace))
            i = len(trace) - 1
            while i >= 0 and trace[i].chosen + 1 >= len(trace[i].options):
                i -= 1
            if i < 0:
                return out
            script = [d.chosen for d in trace[:i]] + [trace[i].chosen + 1]

    async def _read_recorded(self) -> None:
        """Each model step's distribution at its recorded request, for the `maximal` game:
        the first fresh draw of a fork that re-draws that step alone is made there."""
        self._read = True
        for event in self.tape.steps:
            if isinstance(event, LlmEvent):
                k = event.step
                self.app.begin([])
                spec = ForkSpec(
                    tape_id=self.tape.tape_id,
                    interventions={k: Resample()},
                    tail="held",
                    seed=_SEED,
                )
                await self.runner.run(spec)
                if k in self.app.fresh:
                    self.app.recorded[k] = self.app.fresh[k]

    async def p_bad(self, plan: dict[int, Intervention], tail: Tail) -> float:
        return sum(p for p, row, _ in await self.leaves(plan, tail) if is_bad(row.outcome or 0))

    async def p_flip(self, plan: dict[int, Intervention], tail: Tail) -> float:
        bad = await self.p_bad(plan, tail)
        return 1.0 - bad if self.recorded_bad else bad

    async def players(self) -> list[int]:
        """The steps that ever have a choice to make: a step whose draw is a single action in
        every context reachable with everything re-drawn is the same whether re-drawn or
        held, so it is a null player of the held game (phi 0, necessity 0)."""
        everything: dict[int, Intervention] = {k: Resample() for k in range(len(self.tape.steps))}
        found: set[int] = set()
        for _, _, trace in await self.leaves(everything, "held"):
            for d in trace:
                if d.step is not None and d.step < len(self.tape.steps) and len(d.options) > 1:
                    found.add(d.step)
        return sorted(found)

    async def solve(self) -> Truth:
        steps = self.tape.steps
        players = await self.players()
        if len(players) > self.max_players:
            raise BranchingTooLarge(
                f"{self.job.path}: {len(players)} steps make choices ({players}); exact "
                f"Shapley values enumerate 2^n coalitions and stop at {self.max_players} "
                "players: give the scenario fewer stochastic steps"
            )
        # v(S) = P(bad | re-draw S, hold the rest); Shapley over f(S) = 1 - v(S), the chance
        # that re-drawing S removes the failure, so phi > 0 is blame.
        v: dict[frozenset[int], float] = {}
        for size in range(len(players) + 1):
            for subset in combinations(players, size):
                plan: dict[int, Intervention] = {k: Resample() for k in subset}
                v[frozenset(subset)] = await self.p_bad(plan, "held")
        phi = exact_shapley({s: 1.0 - value for s, value in v.items()}, players)
        everyone = frozenset(players)
        truths: list[StepTruth] = []
        for event in steps:
            k = event.step
            live = await self.p_flip({k: Resample()}, "live")
            player = k in phi
            truths.append(
                StepTruth(
                    step=k,
                    kind=event.type,
                    label=event.what() if isinstance(event, LlmEvent) else event.name,
                    player=player,
                    phi=phi.get(k, 0.0),
                    necessity=_flip(self.recorded_bad, v[frozenset({k})]) if player else 0.0,
                    sufficiency=_stay(self.recorded_bad, v[everyone - {k}]),
                    live_flip=live,
                )
            )
        arms = [await self._arm(arm, v) for arm in job_arms(self.job, self.tape)]
        best = max((t.phi for t in truths), default=0.0)
        top = [t.step for t in truths if best > 1e-9 and t.phi >= best - 1e-9]
        return Truth(
            job=str(self.job.path),
            tape_id=self.tape.tape_id,
            recorded_outcome=self.runner.recorded_outcome(self.tape.tape_id),
            base_rate=v[everyone],
            players=players,
            top=top,
            steps=truths,
            arms=arms,
            coalitions={_key(sorted(s)): value for s, value in v.items()},
            runs=self.runs,
            game=self.game,
        )

    async def _arm(self, arm: Arm, v: dict[frozenset[int], float]) -> ArmTruth:
        if arm.kind == "resample":
            value = v.get(frozenset({arm.step}))
            flip = (
                _flip(self.recorded_bad, value)
                if value is not None
                else await self.p_flip({arm.step: arm.intervention}, "held")
            )
        else:
            flip = await self.p_flip({arm.step: arm.intervention}, "held")
        return ArmTruth(kind=arm.kind, step=arm.step, tail="held", flip=flip)


def _flip(recorded_bad: bool, p_bad: float) -> float:
    return 1.0 - p_bad if recorded_bad else p_bad


def _stay(recorded_bad: bool, p_bad: float) -> float:
    return p_bad if recorded_bad else 1.0 - p_bad


def sim_runner(job: Job, tape: Tape) -> ForkRunner:
    """A ForkRunner whose live calls the job's simulated provider answers in this process
    (no sockets), answering seeds as the job's `sim_draws` says: the engine's forks, exactly
    as over HTTP, for benchmarks and tests."""
    app = SimApp(job.load("policy"), draws=job.spec.provider.sim_draws)
    runner = ForkRunner(
        job.load("agent"),
        job.load("scorer"),
        base_urls=BaseUrls.recorded_in(tape),
        upstream=_AppUpstream(app),
        max_threads=8,
        decisions=job.decisions,
    )
    runner.add_tape(tape)
    return runner


async def solve(job: Job, tape: Tape, *, game: Game = "held", **limits: int) -> Truth:
    """The exact values of `job`'s scenario on `tape` in `game` (see `Solver`)."""
    async with Solver(job, tape, game=game, **limits) as solver:
        return await solver.solve()
