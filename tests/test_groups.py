"""The group game (`car_ray.schedule.estimators.GroupGame`): which groups of steps can change
the outcome, asked of the outcome itself. Checked on games whose exact Owen values are known:
each step, re-drawn in a seed, draws its good action with its own probability (one draw a
seed and step, whatever the coalition: common random numbers, as the held game's fork seed
gives), every step not re-drawn keeps its recorded (bad) action, and the failure is a
function of which steps are bad."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from car_ray.bench import _job_and_tape
from car_ray.job import Job
from car_ray.schedule import Budget, JobOutcome
from car_ray.schedule._tuning import MIN_SEEDS, SCREEN_CLEAN, SPLIT_AFTER
from car_ray.schedule.estimators import DeviationScreen, GroupGame, _group_game, split
from car_ray.schedule.stages._groups import _span
from car_ray.tape import Tape
from car_ray.truth import run_local
from car_ray.truth._local import run_local_scheduler

from .conftest import ROOT

Fails = Callable[[frozenset[int]], bool]  # the failure, from the steps still bad


def _play(
    game: GroupGame,
    good: dict[int, float],
    fails: Fails,
    seeds: int,
    *,
    rng_seed: int = 0,
    shuffle: bool = False,
) -> None:
    """Run `seeds` seeds' chains of `game` on the simulated game, feeding their outcomes in
    chain order or shuffled."""
    rng = random.Random(rng_seed)
    steps = sorted({k for g in game.groups for k in g})
    rows = []
    for seed in range(seeds):
        draw = {k: rng.random() < good.get(k, 0.0) for k in steps}
        for coalition in game.coalitions(seed):
            bad = frozenset(k for k in steps if not (k in coalition and draw[k]))
            rows.append((seed, coalition, not fails(bad)))
    if shuffle:
        random.Random(rng_seed + 1).shuffle(rows)
    for seed, coalition, flipped in rows:
        game.observe(seed, coalition, flipped)


def _owen_two(v_a: float, v_b: float, v_ab: float) -> tuple[float, float]:
    """Exact values of a game of two players (groups A and B) with v(empty) = 0."""
    return (v_a + v_ab - v_b) / 2, (v_b + v_ab - v_a) / 2


def test_split_makes_contiguous_groups_of_near_equal_size() -> None:
    assert split([5, 1, 3, 7, 9], 2) == [(1, 3, 5), (7, 9)]
    assert split(list(range(10)), 4) == [(0, 1, 2), (3, 4, 5), (6, 7), (8, 9)]
    assert split([4, 2], 4) == [(2,), (4,)]


@pytest.mark.parametrize(
    ("name", "fails", "exact"),
    [
        # AND: the failure needs both bad; re-drawing either good clears it.
        (
            "and",
            lambda bad: {1, 6} <= bad,
            _owen_two(0.5, 0.4, 1 - 0.5 * 0.6),
        ),
        # Over-determined: either bad keeps the failure; neither group alone clears it.
        ("or", lambda bad: bool({1, 6} & bad), _owen_two(0.0, 0.0, 0.5 * 0.4)),
    ],
)
def test_a_groups_mean_marginal_is_its_exact_owen_value(
    name: str, fails: Fails, exact: tuple[float, float]
) -> None:
    """Two groups, {0..3} holding cause 1 (good with probability 0.5) and {4..7} holding
    cause 6 (0.4); the other steps never matter. Over 3,000 seeds each group's mean marginal
    is within 4 standard errors of its exact value (fixed seed)."""
    game = GroupGame(split(range(8), 2), alpha=0.05, salt=name)
    _play(game, {1: 0.5, 6: 0.4, 0: 0.9, 7: 0.3}, fails, 3000)
    m = game.matrix(game.seeds())
    assert m.shape == (3000, 2)
    for g in range(2):
        se = m[:, g].std(ddof=1) / np.sqrt(len(m))
        assert abs(m[:, g].mean() - exact[g]) <= 4 * se, (name, g, m[:, g].mean(), exact[g])


@pytest.mark.parametrize("fails", [lambda bad: {1, 4} <= bad, lambda bad: bool({1, 4} & bad)])
def test_both_halves_of_an_and_and_of_an_over_determined_pair_survive(fails: Fails) -> None:
    """An AND and an over-determined pair split over two of four groups, each half good with
    probability 0.8 when re-drawn. In 40 runs of the round (each its own draws and orders)
    the two groups that hold neither are cleared every time, and a half's group is missed
    in at most 1: a half changes the outcome in a seed with probability at least 0.32 (the
    over-determined pair's: second in the order, both good), so SCREEN_CLEAN seeds miss it
    with chance 0.68^20 < 0.0005, a run with chance below 0.001, and two runs of 40 with
    chance below 0.001. A round may end before SCREEN_CLEAN (the other half strong) with a
    half's group settled: gone on to SCREEN_CLEAN counted seeds, as a verdict's clearance
    asks of it, that group is found not clear (`broken`)."""
    missed = 0
    for run in range(40):
        game = GroupGame(split(range(12), 4), alpha=0.05, salt=f"pair/{run}")
        _play(game, {1: 0.8, 4: 0.8}, fails, SCREEN_CLEAN, rng_seed=run)
        assert game.decided() and game.decided_at is not None
        assert set(game.active()) <= {0, 1}, (run, game.active())
        game.extended = SCREEN_CLEAN - game.decided_at
        assert len(game.counted()) == SCREEN_CLEAN and not game.waiting()
        found = set(game.active()) | set(game.broken())
        assert found <= {0, 1}, (run, found)
        missed += found != {0, 1}
    assert missed <= 1


def test_a_round_clears_what_never_changed_the_outcome_and_ends_early_when_nothing_can_be() -> None:
    """One cause (step 14, clearing the failure 70% of the time it is re-drawn) among 30
    steps in 4 groups: in each of 40 runs the cause's group alone is left, and the round
    ends once the other groups' clean seeds bound them below half the cause group's exact
    lower bound. Its marginal is a fresh 0.7 coin each seed, so by enumerating that chain
    the round ends by seed 14 with probability 0.781: the median of 40 runs is above 14
    with chance below 0.0001. Gone on to SCREEN_CLEAN seeds (the clean draws "no step to blame"
    rests on), no settled group changes the outcome. A cause in every group (any one bad
    keeps the failure, so a group changes it only when last in a seed's order): the round
    ends at the first seed, MIN_SEEDS or after, by which each has changed it (nothing could
    be cleared), well before SCREEN_CLEAN."""
    ends = []
    for run in range(40):
        game = GroupGame(split(range(30), 4), alpha=0.05, salt=f"sparse/{run}")
        _play(game, {14: 0.7}, lambda bad: 14 in bad, SCREEN_CLEAN + 5, rng_seed=run)
        assert game.decided() and game.decided_at is not None
        assert game.active() == [1]  # steps 8..14
        assert game.settled() == [0, 2, 3]
        ends.append(game.decided_at)
        game.extended = SCREEN_CLEAN - game.decided_at
        assert len(game.counted()) == SCREEN_CLEAN and game.broken() == []
    assert min(ends) >= MIN_SEEDS and max(ends) <= SCREEN_CLEAN
    assert float(np.median(ends)) <= 14, ends
    causes = {1: 1.0, 9: 1.0, 17: 1.0, 25: 1.0}
    dense = GroupGame(split(range(30), 4), alpha=0.05, salt="dense")
    _play(dense, causes, lambda bad: len(bad & set(causes)) >= 1, SCREEN_CLEAN)
    assert dense.decided() and dense.active() == [0, 1, 2, 3]
    n = len(dense.seeds())
    assert MIN_SEEDS <= n < SCREEN_CLEAN
    last = [dense.order(s)[-1] for s in range(n)]
    assert len(set(last)) == 4 and (n == MIN_SEEDS or len(set(last[:-1])) == 3)


def test_a_round_that_splits_ends_as_soon_as_it_knows_what_to_split() -> None:
    """One cause (step 14, clearing the failure 70% of the time) among 30 steps in 4 groups,
    in a round that may end to split (`splits`, not a last round): in each of 40 runs the
    round ends at the first count of seeds, SPLIT_AFTER or more, at which the cause's group
    has changed the outcome (another group has not), with that group alone left. A round
    whose every group changed the outcome does not end to split (splitting them would play
    it again); one whose quiet group did ends at once (its steps were not clear: they are
    split with what is left), though its own groups never changed the outcome."""
    for run in range(40):
        game = GroupGame(split(range(30), 4), alpha=0.05, salt=f"split/{run}", splits=True)
        _play(game, {14: 0.7}, lambda bad: 14 in bad, SCREEN_CLEAN, rng_seed=run)
        assert game.decided() and game.decided_at is not None
        m = game.matrix(game.seeds())
        first = next(n for n in range(1, SCREEN_CLEAN + 1) if m[:n, 1].any())
        assert game.decided_at == max(SPLIT_AFTER, first), (run, game.decided_at, first)
        assert game.ended_to_split and game.active() == [1]
    # A parity: each cause re-drawn (always good) changes the outcome, so every group does in
    # every seed.
    causes = {1, 9, 17, 25}
    every = GroupGame(split(range(30), 4), alpha=0.05, salt="every", splits=True)
    _play(every, dict.fromkeys(causes, 1.0), lambda bad: len(causes - bad) % 2 == 0, SCREEN_CLEAN)
    assert every.decided() and not every.ended_to_split and every.active() == [0, 1, 2, 3]
    groups = [*split(range(8), 2), tuple(range(8, 30))]
    quiet = GroupGame(groups, alpha=0.05, salt="quiet", quiet=2, splits=True)
    _play(quiet, {20: 1.0}, lambda bad: 20 in bad, SCREEN_CLEAN)
    assert quiet.decided() and quiet.ended_to_split and quiet.decided_at == SPLIT_AFTER
    assert quiet.active() == [2]


def test_the_quiet_steps_bring_their_clean_seeds_into_the_round() -> None:
    """A round of two steps left (14, clearing the failure 70% of the time, and 15, which
    never matters), each its own group, beside the 28 steps earlier rounds settled as the
    quiet group. Steps that bring 10 clean seeds each are cleared in fewer seeds than steps
    that bring none, in each of 20 runs (the same draws both ways)."""
    quiet = tuple(k for k in range(30) if k not in (14, 15))
    for run in range(20):
        ends = []
        for carry in (0, 10):
            game = GroupGame(
                [(14,), (15,), quiet],
                alpha=0.05,
                salt=f"carry/{run}",
                quiet=2,
                carry=dict.fromkeys((15, *quiet), carry),
            )
            _play(game, {14: 0.7}, lambda bad: 14 in bad, SCREEN_CLEAN, rng_seed=run)
            assert game.decided() and game.decided_at is not None
            assert game.settled() == [1, 2]
            ends.append(game.decided_at)
        assert ends[1] < ends[0], (run, ends)


def test_a_last_round_ends_once_its_group_moved_and_the_quiet_group_did_not() -> None:
    """The last round: the steps left (14, 70%, and 15) as one group beside the quiet group.
    In each of 20 runs it ends at the first count of seeds, MIN_SEEDS or more, by which its
    group has changed the outcome (the verdict asks it to go on for more); one whose quiet
    group changes the outcome too ends with nothing settled (the quiet steps are measured
    again)."""
    quiet = tuple(k for k in range(30) if k not in (14, 15))
    for run in range(20):
        game = GroupGame([(14, 15), quiet], alpha=0.05, salt=f"last/{run}", quiet=1)
        _play(game, {14: 0.7}, lambda bad: 14 in bad, SCREEN_CLEAN, rng_seed=run)
        assert game.decided()
        m = game.matrix(game.seeds())
        first = next(n for n in range(1, SCREEN_CLEAN + 1) if m[:n, 0].any())
        assert game.decided_at == max(MIN_SEEDS, first), (run, game.decided_at, first)
        assert game.settled() == [1]
    both = GroupGame([(14, 15), quiet], alpha=0.05, salt="last/both", quiet=1)
    _play(both, {14: 1.0, 3: 1.0}, lambda bad: len({3, 14} - bad) % 2 == 0, SCREEN_CLEAN)
    assert both.decided() and both.active() == [0, 1] and both.decided_at == MIN_SEEDS


def test_with_nothing_to_blame_every_group_is_cleared_at_screen_clean() -> None:
    game = GroupGame(split(range(10), 4), alpha=0.05)
    _play(game, {}, lambda bad: True, SCREEN_CLEAN + 5)
    assert game.decided() and game.active() == []
    assert len(game.seeds()) == SCREEN_CLEAN
    assert DeviationScreen.bound_after(SCREEN_CLEAN, 0.05) < 0.14


def test_where_a_round_ends_does_not_depend_on_the_order_rows_came_in() -> None:
    """A job that resumes feeds its rows in another order than they came: each round must
    end at the same seed, with the same groups left, and seeds past a gap or a failed seed
    must not count before it."""
    for run in range(20):
        ordered = GroupGame(split(range(16), 4), alpha=0.05, salt=f"o/{run}")
        shuffled = GroupGame(split(range(16), 4), alpha=0.05, salt=f"o/{run}")
        for game, shuffle in ((ordered, False), (shuffled, True)):
            _play(
                game,
                {3: 0.3, 9: 0.5},
                lambda bad: bool({3, 9} & bad),
                30,
                rng_seed=run,
                shuffle=shuffle,
            )
        assert ordered.decided() == shuffled.decided()
        assert ordered.decided_at == shuffled.decided_at
        assert ordered.active() == shuffled.active()
    gap = GroupGame(split(range(8), 2), alpha=0.05)
    _play(gap, {1: 1.0}, lambda bad: 1 in bad, 6)
    gap.outcomes.pop(2)  # seed 2 not back yet: seeds 3.. wait for it
    assert gap.seeds() == [0, 1]
    gap.observe(2, gap.coalitions(2)[0], None)  # seed 2 failed: left out
    assert gap.seeds() == [0, 1, 3, 4, 5]


def _coalitions(game: GroupGame, seeds: Sequence[int]) -> set[frozenset[int]]:
    return {c for s in seeds for c in game.coalitions(s)}


def test_a_seeds_chain_re_draws_one_more_group_at_each_fork() -> None:
    game = GroupGame(split(range(6), 3), alpha=0.05, salt="chain")
    for seed in range(10):
        chain = game.coalitions(seed)
        assert [len(c) for c in chain] == [2, 4, 6]
        assert all(a < b for a, b in itertools.pairwise(chain))
    # Orders differ across seeds (a fixed order would give the first group no chance to be
    # second).
    assert len({tuple(game.order(s)) for s in range(10)}) > 1
    assert len(_coalitions(game, range(10))) > 3


# -- a job on a tape whose every step changes its words ------------------------------------------

WORDY = ROOT / "tests" / "scenarios" / "wordy" / "job.toml"
DECISION = 11  # tests/scenarios/wordy: the one step that matters, exact phi 0.3


@pytest.fixture(scope="module")
def wordy() -> tuple[Job, Tape]:
    return _job_and_tape(str(WORDY))


@pytest.fixture(scope="module")
def answered(wordy: tuple[Job, Tape]) -> tuple[JobOutcome, list[dict[str, Any]]]:
    """The default job of tests/scenarios/wordy under 300 forks, run in one go."""
    job, tape = wordy
    return run_local(job, tape, Budget(max_forks=300))


def test_a_tape_whose_every_step_changes_its_words_is_answered_on_the_outcome(
    answered: tuple[JobOutcome, list[dict[str, Any]]],
) -> None:
    """tests/scenarios/wordy holding whole actions: every note's re-draw changes its words, so
    the screen finds every step it re-draws and Shapley over them never sees a flip. The
    job asks the outcome instead: rounds of groups clear the notes before the decision (the
    later ones re-drawing those cleared before as one quiet group), Shapley measures what is
    left, and the verdict is step 11, separated, its phi interval
    holding the exact 0.3 and every cleared step's bound at most SCREEN_CLEAN seeds' 14%."""
    outcome, rows = answered
    answer = outcome.answer
    assert answer is not None and answer.kind == "separated" and answer.top == [DECISION]
    (first,) = [r for r in outcome.attribution if r["rank"] == 1]
    assert first["step"] == DECISION and first["phi_lo"] <= 0.3 <= first["phi_hi"]
    groups = [n for n in outcome.notes if n.kind == "groups"]
    assert groups and set(range(DECISION)) <= {k for n in groups for k in n.figures["cleared"]}
    assert DECISION in groups[-1].figures["left"]
    # A round that ended to split: the steps it cleared were re-drawn, as one quiet group,
    # in the round after it (their clean seeds add up there).
    assert any(n.figures["quiet"] for n in groups[1:]), [n.text for n in groups]
    assert any(r["stage"] == "groups" for r in rows)
    cleared = [r for r in outcome.attribution if r["step"] < DECISION]
    assert all(r["phi_hi"] is not None and r["phi_hi"] <= 0.14 for r in cleared)
    assert set(answer.cleared) >= set(range(DECISION))


def test_a_job_stopped_in_its_group_rounds_resumes_to_the_same_forks(
    wordy: tuple[Job, Tape], answered: tuple[JobOutcome, list[dict[str, Any]]]
) -> None:
    """Stopped by its cap in the middle of the group game and run again with the rows it
    wrote (as a rerun of `car-ray attribute` is), the job asks for the forks the job run in
    one go asks for, and answers the same."""
    base, tape = wordy
    whole, whole_rows = answered
    first, first_rows, _ = run_local_scheduler(base, tape, Budget(max_forks=40))
    assert first.status == "budget_exhausted"
    assert first_rows[-1]["stage"] == "groups"  # stopped in the rounds
    rest, rest_rows, _ = run_local_scheduler(base, tape, Budget(max_forks=300), already=first_rows)
    assert sorted(r["task_id"] for r in first_rows + rest_rows) == sorted(
        r["task_id"] for r in whole_rows
    )
    assert rest.answer == whole.answer


# -- a round that ended early goes on ------------------------------------------------------------

AND_POLICY = """from checklist.policy import Checklist

from car_ray.sim import Worded

POLICY = Worded(Checklist(items=15, planted={7: 0.3, 8: 0.3}), wordings=1000)
"""

AND_JOB = """agent = "checklist.agent:review_agent"
scorer = "checklist.agent:payout_released"
policy = "wordy_and.policy:POLICY"
tape = "wordy_and.tape"
seed = 20

[input]
payout = "P-7731"
items = 15
threshold = 2

[[interventions]]
kind = "resample"
"""


@pytest.fixture(scope="module")
def and_job(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Job, Tape, JobOutcome, list[dict[str, Any]]]]:
    """The AND job (below) with rounds made to end at EARLY_SHARE 1, run in one go: the job,
    its tape, its outcome and its rows."""
    folder = tmp_path_factory.mktemp("and") / "wordy_and"
    (folder.parent / "checklist").symlink_to(ROOT / "jobs" / "checklist")
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    (folder / "policy.py").write_text(AND_POLICY)
    (folder / "job.toml").write_text(AND_JOB)
    base, tape = _job_and_tape(str(folder / "job.toml"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_group_game, "EARLY_SHARE", 1.0)
        job = Job(base.path, base.spec.model_copy(update={"attribution_seed": 1}))
        outcome, rows = run_local(job, tape, Budget(**base.spec.budget.model_dump()))
        yield job, tape, outcome, rows


def test_a_round_that_ended_early_goes_on_when_the_verdict_asks_and_an_and_keeps_both_halves(
    and_job: tuple[Job, Tape, JobOutcome, list[dict[str, Any]]],
) -> None:
    """A 15-item checklist worded a thousand ways (jobs/checklist under `sim.Worded`), held by
    actions, whose payout goes out wrongly when two items are waived: items 7 and 8 (steps 14
    and 16) each waived with probability 0.3, both waived in the recording (its seed 20).
    Exact held-game values: each half's phi is (0.7 + 0.91 - 0.7) / 2 = 0.455, every other
    step's 0. With rounds made to end as soon as their settled groups are bound below the
    strongest group's lower bound itself (EARLY_SHARE 1, twice the default), the groups
    they settled are short of what the AND's halves need of them: the verdict's clearance
    makes their rounds go on (a `groups_on` note), and the job names both halves, each
    interval holding 0.455."""
    _, _, outcome, _ = and_job
    going_on = [n for n in outcome.notes if n.kind == "groups_on"]
    assert going_on, "no round went on: this job no longer exercises it"
    assert all(n.figures["forks"] > 0 for n in going_on)
    answer = outcome.answer
    assert answer is not None and answer.kind == "separated"
    assert set(answer.top) == {14, 16}
    for row in outcome.attribution:
        if row["intervention"] == "resample" and row["step"] in (14, 16):
            assert row["phi_lo"] <= 0.455 <= row["phi_hi"], row


def test_a_job_stopped_while_a_round_goes_on_resumes_to_the_same_forks(
    and_job: tuple[Job, Tape, JobOutcome, list[dict[str, Any]]],
) -> None:
    """The AND job stopped one fork into a round's going on (its rows written so far are
    those of the job run in one go, up to the first fork of the group game after Shapley's
    first: a crash there) and run again under the same caps asks for the rest of the forks the job
    run in one go asks for, and answers and notes the same."""
    job, tape, whole, whole_rows = and_job
    shapley = next(i for i, r in enumerate(whole_rows) if r["stage"] == "shapley")
    going_on = [i for i, r in enumerate(whole_rows) if r["stage"] == "groups" and i > shapley]
    assert going_on, "no round went on"
    crash = going_on[0] + 1
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_group_game, "EARLY_SHARE", 1.0)
        budget = Budget(**job.spec.budget.model_dump())  # the whole run's
        rest, rest_rows, _ = run_local_scheduler(job, tape, budget, already=whole_rows[:crash])
    assert sorted(r["task_id"] for r in whole_rows[:crash] + rest_rows) == sorted(
        r["task_id"] for r in whole_rows
    )
    assert rest.answer == whole.answer
    kinds = ("groups", "groups_on")
    assert [n.text for n in rest.notes if n.kind in kinds] == [
        n.text for n in whole.notes if n.kind in kinds
    ]


def test_steps_cleared_on_few_seeds_that_change_the_outcome_later_are_measured_again(
    tmp_path: Path,
) -> None:
    """A 5-item checklist (11 steps) worded a thousand ways, held by actions, whose payout
    goes out wrongly when items 2 and 3 (steps 4 and 6) are both waived, each with
    probability 0.3: each half's exact phi is 0.455, every other step's 0. A round that ends
    to split can clear an AND's half on its few seeds (in its seeds the other half's group
    came first and cleared the failure alone): re-drawn in the next round as part of the
    quiet group, that half changes the outcome, the quiet steps are measured again (the
    round after splits them with what was left), and the job ranks both halves above every
    other step."""
    folder = tmp_path / "short_and"
    (tmp_path / "checklist").symlink_to(ROOT / "jobs" / "checklist")
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    (folder / "policy.py").write_text(
        AND_POLICY.replace(
            "items=15, planted={7: 0.3, 8: 0.3}", "items=5, planted={2: 0.3, 3: 0.3}"
        )
    )
    (folder / "job.toml").write_text(
        AND_JOB.replace("wordy_and", "short_and")
        .replace("seed = 20", "seed = 25")
        .replace("items = 15", "items = 5")
    )
    job, tape = _job_and_tape(str(folder / "job.toml"))
    job = Job(job.path, job.spec.model_copy(update={"attribution_seed": 0}))
    outcome, _ = run_local(job, tape, Budget(**job.spec.budget.model_dump()))
    rounds = [n for n in outcome.notes if n.kind == "groups"]
    moved = [
        i
        for i, n in enumerate(rounds)
        if n.figures["quiet"] and set(n.figures["quiet"]) <= set(n.figures["left"])
    ]
    assert moved, "no quiet group changed the outcome: this job no longer exercises it"
    i = moved[0]
    assert "the steps cleared before changed it" in rounds[i].text
    assert 6 in rounds[i].figures["quiet"]  # the half cleared early
    assert i + 1 < len(rounds)
    again = rounds[i + 1].figures
    quiet_after = set(again["quiet"])
    assert set(rounds[i].figures["quiet"]).isdisjoint(quiet_after), again
    ranked = sorted(
        (r for r in outcome.attribution if r["intervention"] == "resample"),
        key=lambda r: -(r["phi"] or 0.0),
    )
    assert {r["step"] for r in ranked[:2]} == {4, 6}, [(r["step"], r["phi"]) for r in ranked]
    assert (ranked[1]["phi"] or 0.0) > (ranked[2]["phi"] or 0.0)


def test_a_rounds_note_shows_steps_that_skip_as_ranges() -> None:
    """Cleared steps from both ends of a round (a tape's model steps every other step) read
    as two ranges, not as one from the first to the last."""
    cleared = list(range(0, 16, 2)) + list(range(48, 62, 2))
    assert _span(cleared) == "0..14, 48..60 (15 steps)"
    assert _span(list(range(14))) == "0..13 (14 steps)"
    assert _span([0, 2, 4, 6, 8, 10, 12, 30]) == "0..12, 30 (8 steps)"
