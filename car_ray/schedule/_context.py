"""What a stage gets of its job (`JobContext`): the request, the tape's steps and the arms, the
level, the fork-spec factory and its seed counters, the rows by arm, and a view of the ledger.
A stage reads and asks through it; it never touches the scheduler.

Every fork seed derives from the attribution's seed and the run the tape holds (`seed_base`);
a stage's j-th fork of an arm is always seed j (`Seeds.fork`), so a restarted job finds the
forks it wrote and never runs a task id twice."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from .._canon import sha256_hex
from ..execute import Row
from ..job import Job, JobSpec
from ..replay import ForkSpec, Intervention, Probe, Tail
from ..tape import LlmEvent, Tape, ToolEvent
from ._tuning import SCREEN_CLEAN
from .estimators import DecisionShares, DeviationScreen
from .rules import Answering, ShapleyWindow, StopRule

# A coalition of steps, sorted: how Shapley rows are keyed, end to end.
Coalition = tuple[int, ...]
# The arm a row belongs to: an arm's key ("observation@1"), "held" or "block" for the held
# control and the screen's blocks, or a coalition of steps (the Shapley stage).
ArmKey = str | Coalition


def seed_base(attribution_seed: int, run_digest: str) -> int:
    """The first fork seed of an attribution: a hash of its seed and the run the tape holds
    (`Tape.run_digest`), shifted so that a job's 2^32 fork seeds never reach another's. The
    same run and seed draw the same forks (a resume, a rerun, the same scenario recorded
    again on another machine); another run with the same seed draws independently, so the
    traces of a batch (one job file, one seed) are independent trials, not one draw
    sequence whose bad luck every trace shares. Below 2^63: a seed fits a signed 64-bit
    column and a provider's integer seed."""
    digest = sha256_hex(f"car-ray/attribution/{attribution_seed}/{run_digest}".encode())
    return (int(digest[:8], 16) >> 1) << 32


@dataclass(frozen=True)
class Arm:
    """One thing whose flip-rate the job measures: an intervention kind at a step."""

    kind: str
    step: int
    intervention: Intervention

    @property
    def key(self) -> str:
        return f"{self.kind}@{self.step}"


def job_arms(job: Job, tape: Tape) -> list[Arm]:
    """The arms a job measures on a tape: each `[[interventions]]` entry at each of its steps
    (every step for a resample without steps), checked against the step's kind."""
    steps = tape.steps
    arms: list[Arm] = []
    for entry in job.spec.interventions:
        for k in entry.steps if entry.steps is not None else range(len(steps)):
            if k >= len(steps):
                raise ValueError(
                    f"{job.path}: interventions: step {k} does not exist "
                    f"(the tape has steps 0..{len(steps) - 1})"
                )
            event = steps[k]
            if entry.kind == "observation" and not isinstance(event, ToolEvent):
                raise ValueError(
                    f"{job.path}: interventions: 'observation' at step {k}, which is "
                    "a model call; observation replaces a tool step's result"
                )
            if entry.kind in ("action", "context") and not isinstance(event, LlmEvent):
                raise ValueError(
                    f"{job.path}: interventions: '{entry.kind}' at step {k}, which is "
                    f"tool {event.name!r}; it needs a model-call step"
                )
            arm = Arm(entry.kind, k, entry.intervention())
            if any(a.key == arm.key for a in arms):
                raise ValueError(
                    f"{job.path}: interventions: '{entry.kind}' at step {k} is given "
                    "twice; give each kind one value a step"
                )
            arms.append(arm)
    return arms


def coalition_of(spec: ForkSpec) -> frozenset[int]:
    """The steps a fork intervenes on, its probes aside (`replay.Probe`)."""
    return frozenset(k for k, iv in spec.interventions.items() if not isinstance(iv, Probe))


def probes_of(spec: ForkSpec) -> list[int]:
    """The steps a fork probes."""
    return sorted(k for k, iv in spec.interventions.items() if isinstance(iv, Probe))


def arm_key_of(stage: str, spec: ForkSpec) -> ArmKey:
    """The arm a fork belongs to, from its spec alone (so resumed rows find their arm)."""
    if stage in ("shapley", "groups"):
        return tuple(sorted(coalition_of(spec)))
    if stage == "controls":
        return "held" if spec.tail == "held" else "pinned"
    if stage == "screen":
        return "block"
    ((step, iv),) = spec.interventions.items()
    return f"{iv.kind}@{step}"


# The stages whose held forks keep a choosing step's decision off the coupled simulator
# (`Seeds.couple`): those whose outcomes are the estimates.
COUPLED_STAGES = frozenset({"shapley", "groups", "arms"})


class Seeds:
    """The fork-spec factory: each stage's forks draw their seeds from a counter, so a fixed
    stage's j-th fork of an arm is seed j and an adaptive stage counts on from the last seed
    it (or an earlier run of the job) used. The Shapley stage and the held control count
    over the whole stage (they name their seeds), every other stage per arm."""

    def __init__(
        self,
        tape_id: str,
        base: int,
        couple: Callable[[], dict[int, tuple[float, int]]] | None = None,
    ) -> None:
        self.tape_id = tape_id
        self.base = base
        self.next: dict[tuple[str, ArmKey], int] = defaultdict(int)
        # What a held fork needs to keep a choosing step's decision where the provider cannot
        # replay a draw (`DecisionShares.coupling`); None: the provider couples draws. Fixed
        # at a seed's first fork (or row, on resume): every fork of a seed plays one game.
        self.couple = couple
        self._couple_of: dict[tuple[tuple[str, ArmKey], int], dict[int, tuple[float, int]]] = {}

    @staticmethod
    def counter(stage: str, key: ArmKey) -> tuple[str, ArmKey]:
        return (stage, "all" if stage in ("shapley", "groups", "controls") else key)

    def fork(
        self,
        stage: str,
        key: ArmKey,
        plan: dict[int, Intervention],
        tail: Tail,
        seed: int | None = None,
    ) -> ForkSpec:
        """The next fork of an arm: seed `seed` (of the attribution's), or the counter's."""
        counter = self.counter(stage, key)
        if seed is None:
            seed = self.next[counter]
        self.next[counter] = max(self.next[counter], seed + 1)
        couple = None
        if self.couple is not None and tail == "held":
            # The screen and the draws probe read only where a fork left the tape and what
            # it answered: a coupled step's extra draws would tell them nothing. (A step the
            # fork intervenes on is not held: its entry is never read.)
            couple = {}
            if stage in COUPLED_STAGES:
                if (counter, seed) not in self._couple_of:
                    self._couple_of[(counter, seed)] = self.couple()
                couple = self._couple_of[(counter, seed)]
        return ForkSpec(
            tape_id=self.tape_id,
            interventions=plan,
            tail=tail,
            seed=self.base + seed,
            couple=couple,
        )

    def saw(self, stage: str, key: ArmKey, spec: ForkSpec) -> None:
        """A row of the counter's: it counts on past the row's seed."""
        counter = self.counter(stage, key)
        self.next[counter] = max(self.next[counter], spec.seed - self.base + 1)
        if spec.couple is not None and stage in COUPLED_STAGES:
            self._couple_of.setdefault((counter, spec.seed - self.base), spec.couple)


@dataclass
class Rows:
    """A job's rows: by task id, and by (stage, arm) in the order they arrived."""

    by_task: dict[str, Row] = field(default_factory=dict)
    by_arm: dict[tuple[str, ArmKey], list[Row]] = field(default_factory=lambda: defaultdict(list))

    def of(self, stage: str, tail: Tail) -> Iterator[tuple[ForkSpec, Row]]:
        """Every row of `stage` whose fork had `tail`, with its spec."""
        for (st, _), rows in list(self.by_arm.items()):
            if st != stage:
                continue
            for row in rows:
                spec = ForkSpec.model_validate_json(row["spec"])
                if spec.tail == tail:
                    yield spec, row

    def arm(self, stage: str, key: ArmKey) -> list[Row]:
        return self.by_arm.get((stage, key), [])


@dataclass(frozen=True)
class ShapleyRules:
    """The rules the Shapley stage is given: when its top is separated (`stop`), how many of
    its forks are in flight (`window`), which game answers when the budget ends after it
    started over (`answering`), and whether, under a cap, a seed is begun only when the
    forks left could finish it (`finish_seeds`)."""

    stop: StopRule
    window: ShapleyWindow
    answering: Answering
    finish_seeds: bool = True


@dataclass
class JobContext:
    """What the stages of one job share: read-only facts of the job, and the few services a
    stage asks for (a fork spec, the forks its caps leave, the options to go on)."""

    spec: JobSpec
    tape: Tape
    arms: list[Arm]
    seeds: Seeds
    rows: Rows
    rules: ShapleyRules
    # The forks the job's caps let it begin beside those in flight (None without a cap).
    forks_left: Callable[[], float | None]
    # The options that let the job go on for N more forks, and a cap to raise besides.
    go_on: Callable[[int], tuple[str, str]]
    # The simulated provider honours seeds: a held fork with no fresh draw is then exact.
    honours_seed: bool = True
    # `--more`: a separated top does not end the Shapley stage; intervals within the target do.
    precise_only: bool = False
    # How often each step re-drawn at its recorded request made its recorded decision (the
    # estimated coupling's shares, off the coupled provider; None: not kept).
    shares: DecisionShares | None = None

    @property
    def alpha(self) -> float:
        return 1 - self.spec.confidence

    @property
    def steps(self) -> list[LlmEvent | ToolEvent]:
        return self.tape.steps

    @property
    def clean_enough(self) -> int:
        """Clean forks that re-draw every step before the job says no step matters: enough
        that their bound on how often such a fork leaves the tape or changes the outcome
        (`DeviationScreen.bound_after`: an upper bound on all steps' blame together, one-sided
        at the job's confidence) is at most twice the target half-width, so that blame's
        interval [0, bound] is as narrow as the job asks of any interval; and never fewer
        than SCREEN_CLEAN, which a weak cause must come through clean to be missed."""
        bound = 2.0 * self.spec.target_half_width
        return max(SCREEN_CLEAN, DeviationScreen.clean_for(bound, self.alpha))

    @property
    def resampled(self) -> list[int]:
        """The steps the job re-draws (its resample arms)."""
        return [a.step for a in self.arms if a.kind == "resample"]
