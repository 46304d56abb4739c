"""The held-game estimators against exact values of synthetic games, with fixed seeds."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from scipy.special import betaln
from scipy.stats import binom

from car_ray.replay import ForkSpec, Resample
from car_ray.schedule import DeviationScreen, SeedShapley, exact_shapley
from car_ray.schedule._tuning import SIGN_PRIOR
from car_ray.schedule.rules import mean_interval, signs_after, signs_agree

P_BAD = {2: 0.3, 5: 0.3, 7: 0.9}  # a fresh draw at the step keeps its harmful action


def _flips(coalition: frozenset[int], u: dict[int, float]) -> float:
    """An AND of steps 2 and 5 plus a step 7 that only matters after 2 left the tape: the
    failure needs 5 harmful and either 2 harmful or 7 harmful (7 restores what 2 dropped). As
    in a run, a step re-drawn to its recorded action changes nothing: 7 re-drawn while 2 kept
    its action leaves the tape and the failure stands."""
    bad2 = 2 not in coalition or u[2] < P_BAD[2]
    bad5 = 5 not in coalition or u[5] < P_BAD[5]
    bad7 = 7 not in coalition or u[7] < P_BAD[7]
    return 0.0 if (bad5 and (bad2 or bad7)) else 1.0


def _exact() -> dict[int, float]:
    """Exact phi by integrating the per-seed game over a fine grid of u's."""
    players = sorted(P_BAD)
    grid = (np.arange(20) + 0.5) / 20
    values: dict[frozenset[int], float] = {}
    for mask in range(1 << len(players)):
        s = frozenset(p for i, p in enumerate(players) if mask >> i & 1)
        values[s] = float(
            np.mean([_flips(s, {2: a, 5: b, 7: c}) for a in grid for b in grid for c in grid])
        )
    return exact_shapley(values, players)


def _estimate(seeds: int, rng: random.Random, alpha: float = 0.05) -> SeedShapley:
    shap = SeedShapley(sorted(P_BAD), alpha, salt="t")
    for seed in range(seeds):
        u = {k: rng.random() for k in P_BAD}
        for coalition in shap.coalitions(seed):
            shap.observe(seed, coalition, bool(_flips(coalition, u)))
    return shap


def test_seed_shapley_is_unbiased_and_its_intervals_cover() -> None:
    exact = _exact()
    # The grid (u at 0.025, 0.075, ...) splits 0.3 and 0.9 exactly: these are exact values.
    assert abs(sum(exact.values()) - (1 - 0.3 * (1 - 0.7 * 0.1))) < 1e-12
    rng = random.Random(7)
    big = _estimate(6000, rng).estimates()
    for k, (phi, _, _) in big.items():
        assert phi.value is not None and abs(phi.value - exact[k]) < 0.02, (k, phi, exact[k])
    # 95% intervals over 24 seeds (12 antithetic pairs: two whole cycles of the 6 orders)
    # cover the exact values at least 93% of the time over 300 repetitions.
    covered = total = 0
    for _ in range(300):
        for k, (phi, _, _) in _estimate(24, rng).estimates().items():
            total += 1
            covered += phi.low is not None and phi.low <= exact[k] <= (phi.high or 0)
    assert covered / total >= 0.93, covered / total


def test_identical_draws_never_give_a_zero_width_interval() -> None:
    ones = mean_interval(np.ones(10), 0.05, low=-1.0, high=1.0)
    assert ones.low is not None and ones.high == 1.0 and 0.6 < ones.low < 0.8


def test_the_screen_finds_the_choice_makers_in_few_forks() -> None:
    """A 40-step run where steps 3 and 30 leave the tape half the time and the rest never:
    each fork re-draws every uncleared step, so the screen costs about 20 forks, not 40 x 20."""
    rng = random.Random(3)
    screen = DeviationScreen(list(range(40)), clean_needed=20)
    while not screen.done():
        block = screen.block()
        first = next((k for k in block if k in (3, 30) and rng.random() < 0.5), None)
        screen.observe(block, first)
    assert screen.candidates == [3, 30]
    assert screen.forks <= 30
    assert screen.deviation_bound(10, 0.05) < 0.15


def test_probes_are_screen_draws_counted_once_a_seed() -> None:
    """A Shapley fork that probed steps 0, 1, 3 and 6 and left the tape at 4 (a candidate it
    re-drew) shows 0, 1 and 3 drew their recorded actions, and nothing of 6. The same fork
    seed probing them again draws the same: no new observation. A probe that is the first
    deviation is a step found; a deviation at a step it did not probe is not a stray."""
    screen = DeviationScreen([0, 1, 2, 3, 4, 6], clean_needed=8)
    screen.hits[4] = 1
    screen.probed(5, [0, 1, 3, 6], 4)
    assert screen.clean == {0: 1, 1: 1, 3: 1}
    screen.probed(5, [0, 1, 3, 6], None)
    assert screen.clean == {0: 1, 1: 1, 3: 1, 6: 1}
    screen.probed(7, [0, 1, 3, 6], 3)
    assert screen.clean == {0: 2, 1: 2, 3: 1, 6: 1} and screen.candidates == [3, 4]
    assert screen.strays == 0 and screen.forks == 0 and screen.probe_forks == 3


def test_clean_for_is_the_fewest_draws_under_a_bound() -> None:
    """`clean_for(b)` clean draws bound a step's deviation below b, one fewer do not."""
    screen = DeviationScreen([1], clean_needed=1)
    for bound in (0.6, 0.3, 0.2, 0.139, 0.05):
        n = DeviationScreen.clean_for(bound, 0.05)
        screen.clean[1] = n
        assert screen.deviation_bound(1, 0.05) < bound
        screen.clean[1] = n - 1
        assert n == 1 or screen.deviation_bound(1, 0.05) >= bound
    # A bound within float noise of 0 (a verdict's phi_lo of 2.8e-17, seen under provider
    # faults) needs more draws than any screen makes, not a ZeroDivisionError.
    assert DeviationScreen.clean_for(2.8e-17, 0.05) > 10**15


def test_a_separated_top_on_the_echo_scenario_is_the_root() -> None:
    """jobs/echo: a goodwill credit over the cap (step 2, phi 0.45) and a reply that restates
    it (step 4, phi 0). When a job says the top separated, the top is step 2 alone, and
    every step the screen cleared shows phi 0 with its deviation bound around it (the
    clearance itself is a joint test with the top's seeds: `clean_to_clear`)."""
    from car_ray.bench import _job_and_tape
    from car_ray.job import Job
    from car_ray.schedule import Budget
    from car_ray.truth import run_local

    job, tape = _job_and_tape("jobs/echo/job.toml")
    stopped = 0
    for seed in range(4):
        spec = job.spec.model_copy(update={"attribution_seed": seed, "method": "auto"})
        outcome, _ = run_local(Job(job.path, spec), tape, Budget())
        if outcome.answer is None or outcome.answer.kind != "separated":
            continue
        stopped += 1
        rows = [r for r in outcome.attribution if r["intervention"] == "resample"]
        assert [r["step"] for r in rows if r["rank"] == 1] == [2]
        for r in rows:
            if r["rank"] is None and r["phi_hi"] is not None:
                assert r["phi"] == 0.0 and r["phi_lo"] < 0.0 < r["phi_hi"], r
    assert stopped >= 2


@pytest.mark.parametrize(("target", "draws", "most"), [(0.1, 20, 14), (0.05, 29, 10)])
def test_a_job_that_finds_no_choice_says_how_far_its_draws_show_it(
    target: float, draws: int, most: int
) -> None:
    """jobs/null_control: no step ever draws anything but its recorded action. The job says
    so, and says what that rests on: the fewest re-draws any step had and the bound they put
    on how often a step could still leave its recorded action. The screen goes on until that
    bound is within the job's target (an interval [0, b] with b at most twice the target
    half-width), and never stops before SCREEN_CLEAN = 20 (a step that leaves its action 20%
    of the time is missed 1.2% of the time): at the default ±0.1, 20 draws (1 - 0.05^(1/20)
    = 14%); at ±0.05, 29 (9.8%)."""
    from car_ray.bench import _job_and_tape
    from car_ray.job import Job
    from car_ray.results import verdict
    from car_ray.schedule import Budget
    from car_ray.truth import run_local

    base, tape = _job_and_tape("jobs/null_control/job.toml")
    job = Job(base.path, base.spec.model_copy(update={"target_half_width": target}))
    outcome, rows = run_local(job, tape, Budget())
    assert len(rows) == draws + 1  # and the control
    (note,) = [n.text for n in outcome.notes if n.kind == "shapley"]
    assert note == (
        f"shapley: no step makes a choice that could change the outcome, as far as {draws} "
        f"re-draw(s) of each step show: at 95%, none leaves its recorded action more than "
        f"{most}% of the time"
    )
    assert outcome.answer is not None and outcome.answer.kind == "nothing"
    assert outcome.answer.cleared == outcome.answer.steps and not outcome.answer.unexamined
    line = verdict(outcome.attribution, tape, outcome.status, outcome.notes, outcome.answer)
    assert line.startswith("verdict: no step to blame")


def test_a_noisy_negative_control_held_by_actions_is_answered_by_re_drawing_every_step() -> None:
    """jobs/null_control_noisy held by actions: every model step comes back in other words, so
    the screen finds a choice at the first fork, but no re-draw can change the outcome. The
    job re-draws every step at once until SCREEN_CLEAN = 20 forks kept the outcome and says
    no step is to blame, bounding all steps' blame together by 1 - 0.05^(1/20) = 14%: 21
    forks with the control, inside the default cap of 10 a step (40)."""
    from car_ray.bench import _job_and_tape
    from car_ray.job import Job
    from car_ray.results import verdict
    from car_ray.schedule import Budget
    from car_ray.truth import run_local

    base, tape = _job_and_tape("jobs/null_control_noisy/job.toml")
    job = Job(base.path, base.spec.model_copy(update={"hold": "actions"}))
    outcome, rows = run_local(job, tape, Budget(max_forks=10 * len(tape.steps)))
    assert len(rows) == 21 and outcome.status == "complete"
    (note,) = [n.text for n in outcome.notes if n.kind == "shapley"]
    assert "re-drawing every step at once in 20 forks" in note and "at most 14%" in note
    assert outcome.answer is not None and outcome.answer.kind == "nothing"
    assert outcome.answer.cleared == outcome.answer.steps and not outcome.answer.unexamined
    line = verdict(outcome.attribution, tape, outcome.status, outcome.notes, outcome.answer)
    assert line.startswith("verdict: no step to blame")


def test_a_screen_that_gave_up_early_does_not_claim_no_step_chooses() -> None:
    """A screen that stopped on stray forks (nondeterminism outside the seams) before every
    step had its 20 re-draws has seen no choice, and says how little that means, not the
    bound 20 draws would give."""
    from types import SimpleNamespace

    from car_ray.schedule import Results
    from car_ray.schedule._table import held_notes
    from car_ray.schedule.stages._screening import screen_result

    screen = DeviationScreen([0, 1, 2, 3], clean_needed=20)
    screen.observe([0, 1, 2, 3], None)  # one clean draw of each
    for _ in range(3):
        screen.observe([2, 3], 0)  # left the tape at step 0, which it did not re-draw
    ctx = SimpleNamespace(spec=SimpleNamespace(confidence=0.95), alpha=0.05, clean_enough=20)

    def last_note() -> str:
        results = Results(screened=screen_result(screen, ("separated", ())))
        return held_notes(ctx, results)[-1].text  # type: ignore[arg-type]

    note = last_note()
    assert note.startswith("shapley: no step was seen to make a choice, but the screen stopped")
    assert "as few as 1 re-draw(s)" in note and "%" not in note
    for _ in range(19):
        screen.observe([0, 1, 2, 3], None)
    assert last_note().endswith("more than 14% of the time")


def test_the_joint_clearance_errs_at_most_alpha() -> None:
    """`clean_to_clear` decides that a step not found (deviating with probability q at its
    recorded request, so |phi| <= q) is below the top (one candidate: each seed a flip with
    probability phi). The screen draws the step until it has as many clean draws as the
    top's flips ask for, so the number of draws depends on the top's data. At the edge q =
    phi, the chance that the step comes through those draws clean and is declared below is
    at most alpha for every phi and number of seeds, and so is the chance at any number of
    draws fixed beforehand: computed exactly over the binomial distribution of the flips,
    not sampled. (A threshold of alpha on the product, valid for draws fixed beforehand,
    erred 0.044 at alpha = 0.025 once the draws follow the flips.) At alpha 5% and 2.5%."""
    from scipy.stats import binom

    from car_ray.schedule._interval import exact_lower
    from car_ray.schedule.rules import clean_to_clear

    for alpha in (0.05, 0.025):
        topped_up = fixed = 0.0
        for seeds in (4, 8, 15, 30, 60, 80):
            need = [
                clean_to_clear(lambda g, h=h, n=seeds: exact_lower(h, n, g), alpha)
                for h in range(seeds + 1)
            ]
            for i in range(1, 96, 2):
                phi = i / 100
                flips = [float(binom.pmf(h, seeds, phi)) for h in range(seeds + 1)]
                topped_up = max(
                    topped_up,
                    sum(
                        f * (1 - phi) ** n for f, n in zip(flips, need, strict=True) if n < math.inf
                    ),
                )
                for draws in (3, 10, 20, 40, 60):
                    cleared = sum(f for f, n in zip(flips, need, strict=True) if n <= draws)
                    fixed = max(fixed, cleared * (1 - phi) ** draws)
        assert 0.0 < topped_up <= alpha and 0.0 < fixed <= alpha, (alpha, topped_up, fixed)
    alpha = 0.05
    # And it asks fewer draws than a bound on q below the top's own lower bound, at the
    # same alpha split between the two: 6 flips in 30 seeds.
    split = DeviationScreen.clean_for(float(exact_lower(6, 30, np.array(alpha / 2))), alpha / 2)
    assert clean_to_clear(lambda g: exact_lower(6, 30, g), alpha) < split / 1.5


def test_the_weight_that_reaches_a_later_step_is_bounded_from_the_seeds() -> None:
    """A step not found after the candidates meets its recorded request only in orders where
    it comes before every candidate that left the tape in the seed: 1 / (1 + d) of them with
    d such candidates. Candidates 2 and 4 each leave the tape in half the seeds: for step 6
    the mean share is 1/4 + 1/2 * 1/2 + 1/4 * 1/3 = 7/12, for step 3 (after 2 only) 3/4, for
    step 1 (before both) 1. The forks of a seed's chain show which candidates left the tape
    (a draw no fork of the seed showed counts as staying on it). Over 400 jobs of 30
    seeds, `reach` at 1.25% lies above the true share at least 98% of the time, and below 1
    for the later steps most of the time (it is what lets their clearance take fewer
    draws)."""
    rng = random.Random(7)
    truths = {6: 7 / 12, 3: 3 / 4}
    above = {6: 0, 3: 0}
    tighter = 0
    for _ in range(400):
        shap = SeedShapley([2, 4], 0.05, salt="reach")
        for seed in range(30):
            dirty = {k for k in (2, 4) if rng.random() < 0.5}
            for coalition in shap.coalitions(seed):
                first = min(dirty & coalition, default=None)
                shap.observe(seed, coalition, first is not None, first)
            seen = shap.dirty.get(seed, set())
            assert seen <= dirty and bool(seen) == bool(dirty), (seen, dirty)
        assert shap.reach(1, 0.0125) == 1.0
        for step, share in truths.items():
            above[step] += shap.reach(step, 0.0125) >= share
        tighter += shap.reach(6, 0.0125) < 1.0
    assert all(count / 400 >= 0.98 for count in above.values()), above
    assert tighter / 400 >= 0.9, tighter


def test_a_job_stopped_just_after_a_probe_found_a_step_resumes_knowing_it() -> None:
    """A Shapley fork's probe that leaves the tape finds a step the screen had not; the
    job starts Shapley over with it. A job stopped right after that row (its budget ended,
    the driver died) must resume knowing the step from its rows: Shapley over the new
    candidates at once, the found step never probed again, no fork run twice, and the
    verdict the job gives when nothing stops it, within the same caps (the resumed job
    carries what the stopped one spent). (support_refund, the first attribution seed whose
    screen's first pass misses a step that a probe then finds, and whose job separates its
    top within the default cap: the seeds' draws follow the tape's run, so the test looks
    for one rather than naming it.)"""
    from car_ray.bench import _job_and_tape
    from car_ray.job import Job
    from car_ray.schedule import Budget, effective_budget
    from car_ray.schedule._context import probes_of
    from car_ray.truth import run_local_scheduler

    def found_by_probe(row: dict[str, object]) -> bool:
        spec = ForkSpec.model_validate_json(str(row["spec"]))
        return row["stage"] == "shapley" and row["first_deviation"] in probes_of(spec)

    base, tape = _job_and_tape("jobs/support_refund/job.toml")
    for seed in range(20):
        job = Job(base.path, base.spec.model_copy(update={"attribution_seed": seed}))
        whole, whole_rows, whole_job = run_local_scheduler(job, tape, Budget())
        hits = [i for i, row in enumerate(whole_rows) if found_by_probe(row)]
        if hits and whole_job.results.verdict == ("separated", (4,)):
            break
    else:
        pytest.fail("no attribution seed of 20 has a probe find a step and separates")
    first_hit = hits[0]
    found = whole_rows[first_hit]["first_deviation"]
    assert isinstance(found, int)
    stopped, rows, _ = run_local_scheduler(job, tape, Budget(max_forks=first_hit + 1))
    assert stopped.status == "budget_exhausted"
    assert found_by_probe(rows[-1]), "the stopped job's last row is the probe's find"

    resumed, new_rows, resumed_job = run_local_scheduler(job, tape, Budget(), already=rows)
    ids = [r["task_id"] for r in rows + new_rows]
    assert len(ids) == len(set(ids)), "a fork ran twice"
    resumed_screen, resumed_shapley = resumed_job.results.screen, resumed_job.results.shapley
    assert resumed_screen is not None and found in resumed_screen.candidates
    assert resumed_shapley is not None and found in resumed_shapley.candidates
    for row in new_rows:
        spec = ForkSpec.model_validate_json(row["spec"])
        assert found not in probes_of(spec), f"{row['task_id']} probes step {found} again"
    cap = effective_budget(Budget(), len(tape.steps)).max_forks
    assert cap is not None and len(rows) + len(new_rows) <= cap, "the resume broke the cap"
    assert resumed.status == whole.status == "complete"
    assert resumed_job.results.verdict == whole_job.results.verdict == ("separated", (4,))


def test_a_capped_job_begins_only_the_seeds_it_can_finish() -> None:
    """The estimates count complete seeds only, so a Shapley fork of a seed the budget cuts
    off half way is paid for and tells nothing. Under a cap, a seed is begun only when the
    forks left could finish it after the seeds begun. jobs/and_conj at 14 forks (three
    candidates: a seed costs about 2.5 forks), 10 attribution seeds, side by side with the
    same runs that begin seeds regardless of the cap: more of the Shapley forks count, and
    a job that stopped beginning seeds says its budget ended."""
    from dataclasses import replace

    from car_ray.bench import _job_and_tape
    from car_ray.job import Job
    from car_ray.schedule import SHIPPED_RULES, Budget, ShapleyRules
    from car_ray.schedule.rules import NarrowingWindow
    from car_ray.schedule.stages import SHAPLEY_SEEDS
    from car_ray.truth import run_local_scheduler

    base, tape = _job_and_tape("jobs/and_conj/job.toml")

    def share_counted(rules: ShapleyRules) -> float:
        forks = counted = 0
        for seed in range(10):
            job = Job(base.path, base.spec.model_copy(update={"attribution_seed": seed}))
            budget = Budget(max_forks=14)
            outcome, rows, scheduler = run_local_scheduler(job, tape, budget, rules=rules)
            assert outcome.status == "budget_exhausted", (seed, outcome.status)
            shapley = scheduler.results.shapley
            assert shapley is not None
            complete = set(shapley.seeds)
            for row in rows:
                if row["stage"] == "shapley":
                    spec = ForkSpec.model_validate_json(row["spec"])
                    forks += 1
                    counted += spec.seed - scheduler.seed_base - SHAPLEY_SEEDS in complete
        return counted / forks

    with_rule = share_counted(SHIPPED_RULES)
    # Seeds begun regardless of the cap: not held to what the forks left could finish, nor
    # to the window's share of them.
    regardless = replace(SHIPPED_RULES, finish_seeds=False, window=NarrowingWindow(of_left=None))
    without = share_counted(regardless)
    assert with_rule > without + 0.1, (with_rule, without)


def test_a_small_budget_keeps_forks_back_for_the_steps_its_first_forks_find() -> None:
    """At a budget of about one fork a step, the first Shapley forks often find another
    step (Shapley starts over). With every fork the cap leaves sent at once, nothing was
    left for the game over the steps found, and the first row named a step the forks had
    barely measured. Half of what is left goes at a time: jobs/and_conj at 7 forks and
    jobs/research_async at 8, attribution seeds 0-9, side by side with all at once. The
    first row is an exact top step, above every other (`bench.top1`, against the exact
    values), in at least 9 of 10 (measured: 10 and 9; all at once: 7 and 4)."""
    from dataclasses import replace

    from car_ray import _aio
    from car_ray.bench import _job_and_tape, top1, top_exact
    from car_ray.job import Job
    from car_ray.schedule import SHIPPED_RULES, Budget, ShapleyRules
    from car_ray.schedule.rules import NarrowingWindow
    from car_ray.truth import run_local, solve

    tops = {}
    for name in ("and_conj", "research_async"):
        base, tape = _job_and_tape(f"jobs/{name}/job.toml")
        tops[name] = top_exact(_aio.run(solve(base, tape)))

    def right(name: str, cap: int, rules: ShapleyRules) -> int:
        base, tape = _job_and_tape(f"jobs/{name}/job.toml")
        got = 0
        for seed in range(10):
            job = Job(base.path, base.spec.model_copy(update={"attribution_seed": seed}))
            outcome, _ = run_local(job, tape, Budget(max_forks=cap), rules)
            got += top1("auto", outcome.attribution, tops[name])[1]
        return got

    caps = (("and_conj", 7), ("research_async", 8))
    halves = {name: right(name, cap, SHIPPED_RULES) for name, cap in caps}
    every = replace(SHIPPED_RULES, window=NarrowingWindow(of_left=1.0))
    at_once = {name: right(name, cap, every) for name, cap in caps}
    assert all(n >= 9 for n in halves.values()), (halves, at_once)
    assert sum(halves.values()) >= sum(at_once.values()) + 4, (halves, at_once)


def test_a_step_found_as_the_budget_ends_leaves_the_blame_measured_before_it() -> None:
    """jobs/and_conj at 28 forks: a probe may find the last of its three candidates (step 4)
    when too little budget is left to complete one seed of the Shapley over all three. The
    job then shows the blame it measured over the steps found before (2 ranked first, an
    exact top step), says step 4 was found and not measured, and claims no verdict; before,
    it showed no ranked step at all."""
    from car_ray.bench import _job_and_tape
    from car_ray.job import Job
    from car_ray.schedule import Budget
    from car_ray.truth import run_local

    base, tape = _job_and_tape("jobs/and_conj/job.toml")
    late = 0
    for seed in range(40):
        job = Job(base.path, base.spec.model_copy(update={"attribution_seed": seed}))
        outcome, _ = run_local(job, tape, Budget(max_forks=28))
        if not any("were not measured" in n.text for n in outcome.notes):
            continue
        late += 1
        rows = {r["step"]: r for r in outcome.attribution if r["intervention"] == "resample"}
        assert outcome.status == "budget_exhausted"
        first = [k for k, r in rows.items() if r["rank"] == 1]
        assert first and all(k in (2, 4) for k in first), (seed, first)
        unmeasured = [k for k, r in rows.items() if r["phi"] is None]
        assert unmeasured, seed
        if late == 2:
            break
    assert late >= 1, "no seed of 40 found a step as the budget ended"


def test_a_shapley_with_too_few_seeds_as_the_budget_ends_leaves_the_blame_before_it() -> None:
    """jobs/research_async at 16 forks: probes find steps 2, 4 and 6 one after another, and
    the Shapley over all three often ends with one or two complete seeds, those that stayed
    on the tape and blame nothing (every candidate tied at phi 0). The game before it, with
    more seeds, answers then (`rules.earlier_if_blameless`): over attribution seeds 0-19 the first
    row is an exact top step, above every other (`bench.top1`), in at least 18 (measured
    19), and more than with the last game always shown (measured 17); each job it answered
    says which steps were measured in too few seeds, ranks none of them and claims no
    verdict.
    A last game whose few seeds blame something still answers (jobs/overdetermined at 18
    forks: the tuning record)."""
    from dataclasses import replace

    from car_ray import _aio
    from car_ray.bench import _job_and_tape, top1, top_exact
    from car_ray.job import Job
    from car_ray.schedule import SHIPPED_RULES, Budget, ShapleyRules
    from car_ray.schedule.rules import later_always
    from car_ray.truth import run_local, solve

    base, tape = _job_and_tape("jobs/research_async/job.toml")
    top = top_exact(_aio.run(solve(base, tape)))

    def right(rules: ShapleyRules) -> tuple[int, int]:
        got = answered = 0
        for seed in range(20):
            job = Job(base.path, base.spec.model_copy(update={"attribution_seed": seed}))
            outcome, _ = run_local(job, tape, Budget(max_forks=16), rules)
            got += top1("auto", outcome.attribution, top)[1]
            late_notes = [n.text for n in outcome.notes if n.kind == "shapley_late"]
            note = next((n for n in late_notes if "a verdict looks at" in n), None)
            if note is None:
                continue
            answered += 1
            rows = {r["step"]: r for r in outcome.attribution if r["intervention"] == "resample"}
            unmeasured = [k for k, r in rows.items() if r["phi"] is None and k in (2, 4, 6)]
            late = f"step(s) {unmeasured} make choices but were measured in only"
            assert unmeasured and late in note, (seed, note)
            assert all(rows[k]["rank"] is None for k in unmeasured), seed
            assert outcome.status == "budget_exhausted", seed
        return got, answered

    got, answered = right(SHIPPED_RULES)
    before, _ = right(replace(SHIPPED_RULES, answering=later_always))
    assert answered >= 1 and got >= 18 and got > before, (got, answered, before)


def test_a_step_found_by_the_last_fork_the_budget_allows_is_named_as_not_measured() -> None:
    """jobs/relay at 18 forks: a probe in the last Shapley forks may find step 6 when no
    fork is left, so no Shapley over it begins. The table keeps the blame over step 2, and
    a note names step 6 as making choices and not measured (before, it only showed an empty
    row); every step the screen found and the table has no blame for is named so."""
    from car_ray.bench import _job_and_tape
    from car_ray.job import Job
    from car_ray.schedule import Budget
    from car_ray.truth import run_local

    base, tape = _job_and_tape("jobs/relay/job.toml")
    named = 0
    for seed in range(10):
        job = Job(base.path, base.spec.model_copy(update={"attribution_seed": seed}))
        outcome, _ = run_local(job, tape, Budget(max_forks=18))
        (found,) = [n for n in outcome.notes if n.kind == "screen"]
        candidates = found.figures["candidates"]
        rows = {r["step"]: r for r in outcome.attribution if r["intervention"] == "resample"}
        unmeasured = [k for k in candidates if rows[k]["phi"] is None]
        if not unmeasured:
            continue
        named += 1
        note = next(n.text for n in outcome.notes if n.kind == "shapley_late")
        assert f"step(s) {unmeasured} make choices but were not measured" in note, note
        assert outcome.status == "budget_exhausted" and rows[2]["rank"] == 1, seed
    assert named >= 1, "no seed of 10 found a step with the last forks"


def test_a_default_job_that_ends_before_its_top_separates_says_why_and_how_to_go_on() -> None:
    """jobs/relay as a default job (no caps: 10 forks a step): step 6 seldom differs from
    step 2, and some attribution seeds end on the budget before the sign test passes. Such a
    job's note gives the wins and losses its seeds show, about how many more forks would
    separate the top, and a cap of half as many again above what it spent; its verdict line
    names step 2 as the most likely step, not one to fix. Going on from its rows at that cap
    (as a rerun with --max-forks does) spends no more than the cap."""
    from car_ray.bench import _job_and_tape
    from car_ray.job import Job
    from car_ray.results import verdict
    from car_ray.schedule import Budget
    from car_ray.truth import run_local_scheduler

    base, tape = _job_and_tape("jobs/relay/job.toml")
    for seed in range(20):
        job = Job(base.path, base.spec.model_copy(update={"attribution_seed": seed}))
        outcome, rows, first = run_local_scheduler(job, tape, Budget())
        if outcome.status == "budget_exhausted":
            break
    else:
        pytest.fail("every default relay job of seeds 0-19 stopped on its own")
    shapley = first.results.shapley
    assert shapley is not None and shapley.verdict is None
    phi, candidates = shapley.per_seed_phi, list(shapley.candidates)
    diff = phi[:, candidates.index(2)] - phi[:, candidates.index(6)]
    wins, losses = int((diff > 0).sum()), int((diff < 0).sum())
    shapley_note = next(n for n in outcome.notes if n.kind == "shapley")
    note = shapley_note.text
    assert "the budget ended before the top separated" in note
    assert f"step 2 came out ahead of step 6 in {wins} seed(s) and behind in {losses}" in note
    spent = outcome.progress.spent.forks
    more = shapley_note.figures["projected_forks"]
    cap = spent + shapley_note.figures["suggested_more"]
    assert f"about {more} more would separate it" in note and f"--max-forks {cap} " in note
    assert more > 0 and cap == spent + math.ceil(1.5 * more), note
    line = verdict(outcome.attribution, tape, outcome.status, outcome.notes, outcome.answer)
    assert line.startswith("verdict: most likely step 2, where") and "fix" not in line, line

    on, _, _ = run_local_scheduler(job, tape, Budget(max_forks=cap), already=rows)
    assert on.progress.resumed == len(rows)
    assert on.progress.done > 0 and len(rows) + on.progress.done <= cap


def test_a_screen_that_gave_up_on_strays_asks_for_no_more_forks() -> None:
    """Forks that leave the tape at steps they did not re-draw (nondeterminism outside the
    seams) make the screen give up after three; it then asks for no fork, so a verdict
    waiting on its clearance goes on with seeds, not with screen forks that cannot clear."""
    from types import SimpleNamespace

    from car_ray.schedule.stages._screening import screen_forks

    screen = DeviationScreen([0, 1, 2, 3], clean_needed=4)
    for _ in range(3):
        screen.observe([2, 3], 0)  # left the tape at step 0, which it did not re-draw
    assert screen.strays == 3 and screen.block()
    ctx = SimpleNamespace(fork=lambda *a: pytest.fail("a fork was asked for"))
    assert screen_forks(ctx, screen, room=8, pending=0) == []  # type: ignore[arg-type]


def test_one_candidate_gets_wilson_intervals_that_cover() -> None:
    """One candidate: each seed's phi is a 0/1 flip with probability 0.3 (its exact phi).
    Over 400 jobs of 24 seeds each, the interval covers 0.3 at least 93% of the time, and its
    lower end sits above the t interval's (so a separated top needs less screening)."""
    rng = random.Random(11)
    covered = higher = 0
    for _ in range(400):
        shap = SeedShapley([4], 0.05, salt="w")
        for seed in range(24):
            shap.observe(seed, frozenset({4}), rng.random() < 0.3)
        phi = shap.estimates()[4][0]
        assert phi.low is not None and phi.high is not None
        covered += phi.low <= 0.3 <= phi.high
        flips = np.array([shap.values[s][frozenset({4})] for s in range(24)])
        t_low = mean_interval(flips, 0.05, low=-1.0, high=1.0).low
        higher += t_low is not None and phi.low > t_low
    assert covered / 400 >= 0.93, covered / 400
    assert higher / 400 >= 0.9, higher / 400


def test_a_precise_verdict_names_no_step_whose_phi_may_be_zero() -> None:
    """Every interval within the target half-width ends the stage, but it is not an answer:
    a step whose phi interval reaches 0 is not named the top cause. One candidate that never
    flips in 16 seeds (a step with phi 0.3 does that 0.3% of the time): the verdict is
    precise and names nothing. One flip in 16 is a phi above 0: separated, the step named."""
    never = SeedShapley([2], 0.05, salt="p")
    once = SeedShapley([2], 0.05, salt="p")
    for seed in range(16):
        never.observe(seed, frozenset({2}), False)
        once.observe(seed, frozenset({2}), seed == 5)
    phi = never.estimates()[2][0]
    assert phi.value == 0.0 and phi.half_width <= 0.1
    assert never.verdict(target_half_width=0.1) == ("precise", [])
    assert once.verdict(target_half_width=0.1) == ("separated", [2])


def test_coalitions_that_stay_on_the_tape_are_known_without_a_fork() -> None:
    """A seed's largest coalition runs first; its first deviation shows which steps drew their
    recorded (harmful) action, and coalitions of those alone are then known not to flip. The
    estimates are exactly those of running every coalition, for fewer forks."""
    rng = random.Random(11)
    lazy, full = SeedShapley(sorted(P_BAD), 0.05, salt="t"), SeedShapley(sorted(P_BAD), 0.05)
    full.salt = lazy.salt
    forks = 0
    for seed in range(200):
        u = {k: rng.random() for k in P_BAD}

        def run(coalition: frozenset[int], u: dict[int, float] = u) -> tuple[bool, int | None]:
            left = [k for k in sorted(coalition) if u[k] >= P_BAD[k]]
            return bool(_flips(coalition, u)), min(left, default=None)

        assert lazy.first(seed) == frozenset(P_BAD)
        ran = 0
        for coalition in [lazy.first(seed), *lazy.coalitions(seed)]:
            if not lazy.known(seed, coalition):
                ran += 1
                lazy.observe(seed, coalition, *run(coalition))
        for coalition in full.coalitions(seed):
            full.observe(seed, coalition, run(coalition)[0])
        if all(u[k] < P_BAD[k] for k in P_BAD):  # every re-draw kept the harmful action
            assert ran == 1
        forks += ran
    assert lazy.complete_seeds() == full.complete_seeds() == list(range(200))
    assert lazy.values == full.values
    assert forks < 3 * 200
    assert lazy.forks_per_seed() == forks / 200


def test_a_coalition_runs_as_itself_without_its_leading_clean_steps() -> None:
    """The seed's largest coalition {2, 5} left the tape at 5, so 2 drew its recorded action:
    {5} runs the same fork as {2, 5} (2 meets its recorded request and keeps its action) and
    {2} the recorded run. One fork completes the seed whichever chain it walks. A seed that
    left the tape at 2 shows nothing about 5: its {5} needs a fork. A clean step after one
    that may leave the tape is kept (its request may have changed)."""
    shap = SeedShapley([2, 5], 0.05, salt="lead")
    assert {frozenset({5})} < set(shap.coalitions(1))  # the odd seed's chain starts with 5
    assert {frozenset({2})} < set(shap.coalitions(0))
    for seed in (0, 1):
        shap.observe(seed, frozenset({2, 5}), True, 5)
        assert all(shap.known(seed, c) for c in shap.coalitions(seed)), seed
    assert shap.values[1][frozenset({5})] == 1.0 and shap.values[0][frozenset({2})] == 0.0
    shap.observe(3, frozenset({2, 5}), True, 2)
    assert not shap.known(3, frozenset({5}))
    three = SeedShapley([2, 5, 7], 0.05)
    three.clean[0] = {2, 7}
    assert three._acting(0, frozenset({2, 5, 7})) == frozenset({5, 7})
    assert three._acting(0, frozenset({2, 7})) == frozenset()


def test_a_shapley_that_starts_over_keeps_every_seed_before_it() -> None:
    """Shapley over [5] probes step 2 in every fork; at the first seed whose probe leaves the
    tape, 2 is found and Shapley starts over with [2, 5]. Every earlier seed is then known
    without a fork: its {5} ran with 2 drawing its recorded action, which is the fork of
    {2, 5} (and {2} is the recorded run); the finding fork is {2, 5} of its seed. The values
    so known are the game's own (`_flips`). (Before, each earlier seed ran again.)"""
    from car_ray.replay import Probe
    from car_ray.schedule.stages._shapley import _observe

    rng = random.Random(5)
    draws = [{k: rng.random() for k in P_BAD} for _ in range(8)]
    for seed, u in enumerate(draws):  # 2 keeps its harmful action in seeds 0-6, not in 7
        u[2] = 0.9 if seed == 7 else 0.3 * u[2]
    first = SeedShapley([5], 0.05, salt="r")
    screen = DeviationScreen([0, 2, 5, 7], clean_needed=4)
    rows: list[tuple[int, ForkSpec, dict[str, object]]] = []
    for seed, u in enumerate(draws):
        spec = ForkSpec(tape_id="t", interventions={5: Resample(), 2: Probe()}, seed=seed)
        left = [k for k in (2, 5) if u[k] >= P_BAD[k]]
        deviation = min(left, default=None)
        coalition = frozenset({5} | ({2} if deviation == 2 else set()))
        row = {"outcome": 1.0, "first_deviation": deviation, "flipped": bool(_flips(coalition, u))}
        rows.append((seed, spec, row))
        screen.probed(seed, [2], deviation)
        _observe(first, seed, spec, row)
        if 2 in screen.hits:
            break
    found = len(rows) - 1
    assert found == 7
    again = SeedShapley([2, 5], 0.05, salt="r")
    for fork_seed, k in sorted(screen.probes):
        again.learn_clean(fork_seed, [k])
    for seed, spec, row in rows:
        _observe(again, seed, spec, row)
    for seed in range(found):
        assert all(again.known(seed, c) for c in again.coalitions(seed)), seed
        for c in again.coalitions(seed):
            assert again.values[seed][c] == _flips(c, draws[seed]), (seed, c)
    assert again.known(found, frozenset({2, 5}))
    assert again.values[found][frozenset({2, 5})] == _flips(frozenset({2, 5}), draws[found])
    assert again.complete_seeds()[:found] == list(range(found))


def test_a_handful_of_agreeing_seeds_is_not_yet_a_separated_top() -> None:
    """Step 6 alone flips the outcome in every seed: phi_s is 1 for it and 0 for 2 and 4. At
    95% with two rivals each pair is tested at 0.025, its signs by a test martingale that
    holds at every look: after n agreeing seeds of n it stands at 2^n (a / (n + a) + B(n +
    1, a) / B(1, a)) / 2 (`SIGN_PRIOR`'s mixture, a = 12), 21.3 at 6 and 40.4 at 7, against
    1 / 0.025 = 40: the verdict waits for the seventh seed (the Jeffreys mixture took the
    eighth, the uniform the ninth, a fixed-n test at each look the seventh). With one rival
    (step 2 alone, at 0.05: 20) the sixth is enough."""
    a = SIGN_PRIOR
    for n, expected in ((6, 21.3), (7, 40.4)):
        ratio = 2**n * (a / (n + a) + math.exp(betaln(n + 1, a) - betaln(1, a))) / 2
        assert ratio == pytest.approx(expected, abs=0.05)
    for candidates, seeds in (([2, 4, 6], 7), ([2, 6], 6)):
        shap = SeedShapley(candidates, 0.05, salt="s")
        for seed in range(seeds):
            assert shap.verdict(0.01) is None, (candidates, seed)
            for coalition in shap.coalitions(seed):
                shap.observe(seed, coalition, 6 in coalition)
        assert shap.verdict(0.01) == ("separated", [6]), candidates


@pytest.mark.parametrize("alpha", [0.05, 0.025])
def test_the_sign_test_looked_at_after_every_seed_errs_at_most_its_level(alpha: float) -> None:
    """The exact chance that a fair coin (a tie: each differing seed as likely to favour
    either step) ever passes the sign test, in either direction, within 200 differing seeds,
    looked at after each: by Ville's inequality at most alpha whatever the prior. Computed
    by carrying the probability of every (wins, losses) not yet passed from one seed to the
    next. `SIGN_PRIOR`'s mixture uses most of it (4.4% within 60 seeds at 5%, the Jeffreys
    mixture 2.9%); a fixed-n test looked at after every seed would not stay below it."""

    def signs(w: int, lost: int) -> bool:
        diff = np.array([1.0] * w + [-1.0] * lost)
        return signs_agree(diff, alpha) or signs_agree(-diff, alpha)

    erred = _ever_passes(signs, 200)
    assert 0.5 * alpha < erred <= alpha, erred

    # The fixed-n test (the binomial tail at alpha / 2 at each look) errs far above alpha.
    def fixed_n(w: int, lost: int) -> bool:
        cut = binom.ppf(1 - alpha / 2, w + lost, 0.5)
        return bool(max(w, lost) > cut)

    fixed = _ever_passes(fixed_n, 60)
    assert fixed > 1.5 * alpha, fixed


@pytest.mark.parametrize(("wins", "losses", "n"), [(17, 5, 59), (9, 3, 58), (3, 0, 20)])
def test_the_seeds_a_sign_test_still_needs_are_the_fewest_at_the_rates_so_far(
    wins: int, losses: int, n: int
) -> None:
    """A job whose budget ended before the sign test passed says how many more seeds would
    pass it if wins and losses went on at their rates: the fewest such seeds, checked
    against the test itself one seed at a time."""

    def passes(more: int) -> bool:
        grown = (n + more) / n
        diff = np.array([1.0] * int(wins * grown) + [-1.0] * int(losses * grown))
        return signs_agree(diff, 0.05)

    more = signs_after(wins, losses, n, 0.05)
    assert 0 < more < math.inf
    assert passes(int(more)) and not any(passes(k) for k in range(int(more))), more
    assert signs_after(6, 0, 10, 0.05) == 0  # passes already
    assert signs_after(5, 5, 40, 0.05) == math.inf  # as often behind as ahead: never


def test_a_top_not_yet_separated_says_which_test_it_lacks() -> None:
    """Over 40 seeds step 6 clears the failure in 18 and step 2 in 6 (never both): the t
    interval of their difference is above 0, but 18 wins to 6 losses are short of the 21
    the sign test needs at 95% at every look. That is the reason given, and the projection
    is the sign test's at those rates."""
    shap = SeedShapley([2, 6], 0.05, salt="s")
    for seed in range(40):
        for coalition in shap.coalitions(seed):
            flips = (6 in coalition and seed < 18) or (2 in coalition and 18 <= seed < 24)
            shap.observe(seed, coalition, flips)
    assert shap.verdict(0.01) is None
    reasons, more, top = shap.lacks()
    assert top == [6]
    assert reasons == [
        "step 6 came out ahead of step 2 in 18 seed(s) and behind in 6: not yet enough for "
        "the sign test at 95%, valid at every look"
    ]
    assert more == signs_after(18, 6, 40, 0.05) > 0


def _ever_passes(passes: Callable[[int, int], bool], most: int) -> float:
    """The chance that a fair coin's (wins, losses) ever satisfy `passes`, looked at after
    each of up to `most` tosses: the probability of every count not yet passed is carried
    from one toss to the next, and what passes leaves it."""
    alive = {(0, 0): 1.0}
    passed = 0.0
    for _ in range(most):
        after: dict[tuple[int, int], float] = {}
        for (w, lost), mass in alive.items():
            for nxt in ((w + 1, lost), (w, lost + 1)):
                after[nxt] = after.get(nxt, 0.0) + mass / 2
        alive = {}
        for (w, lost), mass in after.items():
            if passes(w, lost):
                passed += mass
            else:
                alive[(w, lost)] = mass
    return passed


def test_a_verdict_looked_at_after_every_seed_errs_at_most_its_level_on_a_tie() -> None:
    """Steps 2 and 5 each clear the failure, independently, with probability 0.2 when
    re-drawn: their exact phi are equal (0.18 each). A verdict that names one of them alone
    is wrong. It is looked at after every seed, up to 60. The sign test alone errs at most
    alpha (computed exactly above: 4.4% within 60 differing seeds at 5%); the whole verdict
    over 600 runs may err at most 7%, the level plus two standard errors of 600 runs (the
    fixed-n sign test erred 8.9% over 1,000 such runs, the Jeffreys mixture 2.3%,
    `SIGN_PRIOR`'s mixture 4.7%; here 4.5%), and still separates the pair as a tied top in
    most runs."""
    rng = random.Random(11)
    wrong = tied = 0
    runs = 600
    for r in range(runs):
        shap = SeedShapley([2, 5], 0.05, salt=f"tie{r}")
        for seed in range(60):
            u = {k: rng.random() for k in (2, 5)}
            for coalition in shap.coalitions(seed):
                shap.observe(seed, coalition, any(u[k] < 0.2 for k in coalition))
            verdict = shap.verdict(0.0)
            if verdict is not None:
                wrong += verdict[1] != [2, 5]
                tied += verdict[1] == [2, 5]
                break
    assert wrong / runs <= 0.07, wrong / runs
    assert tied / runs >= 0.9, tied / runs


def test_seeds_count_in_order_so_quick_seeds_do_not_pull_phi_to_zero() -> None:
    """A seed whose largest coalition stays on the tape completes in one fork; a seed after an
    incomplete one does not count yet, or the estimates at a look would over-weight seeds
    where nothing deviated. A seed the budget cut ends the count."""
    shap = SeedShapley([2, 4], 0.05, salt="p")
    everyone = frozenset({2, 4})
    shap.observe(0, everyone, True, 2)  # left the tape at 2: seed 0 needs its other coalition
    shap.observe(1, everyone, False, None)  # stayed on the tape: seed 1 is complete at once
    assert shap.known(1, shap.coalitions(1)[0]) and shap.complete_seeds() == []
    (rest,) = [c for c in shap.coalitions(0) if c != everyone]
    shap.observe(0, rest, False, None)
    assert shap.complete_seeds() == [0, 1]
    shap.observe(3, everyone, False, None)
    shap.cut.add(2)
    assert shap.complete_seeds() == [0, 1]


def test_a_provider_that_ignores_seeds_teaches_only_what_later_forks_repeat() -> None:
    """Without seeds honoured, another fork of the seed draws afresh: a step's draw in this
    fork tells the seed's other coalitions something only where their forks hold or force
    it as this one drew it (`SeedShapley.learnable`: model steps). A tool step's clean run
    is not known in another fork."""
    from car_ray.schedule.stages._shapley import _observe

    row = {"outcome": 1.0, "flipped": False, "first_deviation": None}
    learned = SeedShapley([2, 4], 0.05, salt="q", learnable=frozenset({2, 4}))
    unlearned = SeedShapley([2, 4], 0.05, salt="q", learnable=frozenset())
    spec = ForkSpec(tape_id="t", interventions={2: Resample(), 4: Resample()}, tail="held")
    _observe(learned, 0, spec, row)
    _observe(unlearned, 0, spec, row)
    assert learned.complete_seeds() == [0]
    assert unlearned.complete_seeds() == [] and len(unlearned.values[0]) == 1


def test_off_a_coupling_provider_a_probe_that_left_the_tape_is_a_draw_of_its_seed() -> None:
    """A fork of {2, 6} whose probe of step 4 (a candidate by now) left the tape, with 2
    clean: the fork is {2, 4, 6} with 4 re-drawn, 2 is clean and 4 dirty with the action it
    drew, which later forks of the seed force (`SeedShapley.standing`). Dropped, the fork
    would take 2's clean draw with it, and 2 would be drawn again. A deviating answer that
    could not be read (drawn "") leaves the seed out: it cannot be given again."""
    from car_ray.replay import Probe
    from car_ray.schedule.stages._shapley import _observe

    action = json.dumps({"text": "b", "tool_calls": []})
    shap = SeedShapley([2, 4, 6], 0.05, salt="q", learnable=frozenset({2, 4, 6}))
    spec = ForkSpec(
        tape_id="t", interventions={2: Resample(), 4: Probe(), 6: Resample()}, tail="held"
    )
    row = {"outcome": 0.0, "flipped": True, "first_deviation": 4, "drawn": action}
    _observe(shap, 0, spec, row)
    assert shap.values[0][frozenset({2, 4, 6})] == 1.0
    assert shap.standing(0, 2) == "clean" and shap.standing(0, 4) == action
    assert shap.standing(0, 6) == "fresh" and 0 not in shap.failed
    unread = {"outcome": 1.0, "flipped": False, "first_deviation": 2, "drawn": ""}
    _observe(shap, 1, ForkSpec(tape_id="t", interventions={2: Resample()}, tail="held"), unread)
    assert 1 in shap.failed


@pytest.mark.parametrize(
    "sample",
    [[1.0] * 2 + [0.0] * 18, [1.0] * 4 + [0.5] * 2 + [0.0] * 12 + [-1.0] * 2],
    ids=["flips", "differences"],
)
def test_the_seeds_a_test_needs_are_where_its_interval_passes_zero(sample: list[float]) -> None:
    """`_seeds_needed` projects when `mean_interval`'s lower end passes 0 if the mean and
    spread of the seeds so far hold. The sample repeated (same mean, same spread) is shown
    above 0 once it is a fifth past the projection, and not while it is a fifth short of it
    (the slack is the t quantile against the normal one). A mean at or below 0 projects no
    verdict."""
    from car_ray.schedule.rules import seeds_needed as _seeds_needed

    alpha, base = 0.05, np.array(sample)
    need = _seeds_needed(base, alpha)
    assert 30 < need < 80, need

    def low(copies: int) -> float:
        interval = mean_interval(np.tile(base, copies), alpha, low=-1, high=1)
        assert interval.low is not None
        return interval.low

    past = math.ceil(1.2 * need / base.size)
    short = math.floor(0.8 * need / base.size)
    assert low(past) > 0 and low(short) <= 0, (need, low(past), low(short))
    assert _seeds_needed(-base, alpha) == math.inf
    assert _seeds_needed(np.zeros(8), alpha) == math.inf


def test_decision_shares_count_each_seeds_draw_once_and_size_the_coupling() -> None:
    """A step's draws at its recorded request: counted from forks that re-drew or probed it
    at or before their first deviation, once per fork seed (the forks of a Shapley seed share
    a step's draw); a step seen to choose, whose recorded decision COUPLE_MOST draws would
    expect to see (its share with one draw each way added), is coupled at its share read
    low (the `lower` quantile of Beta(kept + 1/2, left + 1/2), at least 1 / most), with
    COUPLE_SPAN / that share draws of a changed request, at most COUPLE_MOST."""
    from scipy.stats import beta

    from car_ray.replay import Probe
    from car_ray.schedule.estimators import DecisionShares

    shares = DecisionShares(most=8, span=2.0, lower=0.2)

    def spec(seed: int, redrawn: list[int], probed: tuple[int, ...] = ()) -> ForkSpec:
        plan: dict[int, Any] = {k: Resample() for k in redrawn} | {k: Probe() for k in probed}
        return ForkSpec(tape_id="t", interventions=plan, tail="held", seed=seed)

    shares.observe(spec(1, [2, 4]), 4)  # 2 kept, 4 left
    shares.observe(spec(1, [4]), 4)  # seed 1's draw of 4 again: not counted twice
    shares.observe(spec(2, [2], probed=(4, 6)), 2)  # 2 left; 4 and 6 after it: not seen
    shares.observe(spec(3, [0], probed=(2,)), None)  # 0 and 2 kept
    assert dict(shares.kept) == {2: 2, 0: 1} and dict(shares.left) == {4: 1, 2: 1}
    assert shares.share(2) == 3 / 5 and shares.share(4) == 1 / 3
    low2 = float(beta.ppf(0.2, 2.5, 1.5))
    assert 0.4 < low2 < shares.share(2)
    # Step 4 never kept its decision: read low, its share is at the floor 1 / 8.
    assert shares.low_share(4) == 1 / 8
    assert shares.coupling() == {2: (round(low2, 6), 5), 4: (0.125, 8)}
    for seed in range(100, 104):  # seldom kept, and never: at most 8 draws
        shares.observe(spec(seed, [4]), 4)
    assert shares.share(4) == 1 / 7 and shares.coupling()[4] == (0.125, 8)
    # Rarer still (its words, say, of a model that never repeats them): 8 draws could not
    # tell its share, and it draws live.
    shares.observe(spec(104, [4]), 4)
    shares.observe(spec(105, [4]), 4)
    assert shares.share(4) == 1 / 9
    assert 4 not in shares.coupling() and 2 in shares.coupling()


def test_a_share_read_low_keeps_a_decision_its_changed_request_left_alone() -> None:
    """Where a change of request left a decision's share p alone, the maximal coupling keeps
    it always. Averaged over the 8 observations of p a job may have had (exactly, over
    their binomial), the estimated coupling at the share read low keeps it at least 0.88 of
    the time at p 0.3 and 0.5, and 0.05 more often than at the plain estimate (0.82 and
    0.88); where the change halved p it keeps it at most 0.75 of the time (the coupling:
    0.5)."""
    from scipy.stats import binom

    from car_ray.replay._coupling import keep_chances
    from car_ray.schedule.estimators import DecisionShares

    def kept(p: float, p_new: float, low: bool) -> float:
        total = weight = 0.0
        for k in range(8):  # k of 8 kept; 8 of 8: not seen to choose, not coupled
            shares = DecisionShares(most=8, span=2.0, lower=0.2)
            shares.kept[0], shares.left[0] = k, 8 - k
            if 0 not in shares.coupling():
                continue
            share, draws = shares.coupling()[0]
            if not low:  # the recorded share as estimated, and its draws
                share = shares.share(0)
                draws = min(8, math.ceil(2.0 / share))
            f = keep_chances(draws, round(share, 6))
            chance = sum(binom.pmf(x, draws, p_new) * f[x] for x in range(draws + 1))
            total += float(binom.pmf(k, 8, p)) * chance
            weight += float(binom.pmf(k, 8, p))
        return total / weight

    for p in (0.3, 0.5):
        assert kept(p, p, low=True) >= max(0.88, kept(p, p, low=False) + 0.05), p
        assert 0.5 < kept(p, p / 2, low=True) <= 0.75, p


def test_a_forks_coupling_is_not_part_of_its_identity() -> None:
    plan: dict[int, Any] = {0: Resample()}
    bare = ForkSpec(tape_id="t", interventions=plan, tail="held", seed=3)
    coupled = ForkSpec(tape_id="t", interventions=plan, tail="held", seed=3, couple={2: (0.5, 4)})
    assert bare.task_id == coupled.task_id
    assert ForkSpec.model_validate_json(coupled.model_dump_json()).couple == {2: (0.5, 4)}
    with pytest.raises(ValueError, match="couple: steps \\[2\\] need a share in"):
        ForkSpec(tape_id="t", couple={2: (0.0, 4)})


def test_a_seeds_forks_play_one_coupling_and_a_resume_restores_it() -> None:
    """Off the coupled simulator every fork of a Shapley seed carries the coupling fixed at
    the seed's first fork (one game a seed), a resumed job takes it from the seed's rows, and
    the screen's forks carry none (their extra draws would tell the screen nothing)."""
    from car_ray.schedule._context import Seeds

    estimates = iter([{}, {2: (0.5, 4)}])
    seeds = Seeds("t", 0, lambda: next(estimates))
    first = seeds.fork("shapley", (2,), {2: Resample()}, "held", 0)
    second = seeds.fork("shapley", (4,), {4: Resample()}, "held", 0)
    assert first.couple == second.couple == {}
    assert seeds.fork("shapley", (4,), {4: Resample()}, "held", 1).couple == {2: (0.5, 4)}
    resumed = Seeds("t", 0, lambda: {9: (0.5, 4)})
    resumed.saw("shapley", (2,), first)
    assert resumed.fork("shapley", (4,), {4: Resample()}, "held", 0).couple == {}
    assert resumed.fork("shapley", (4,), {4: Resample()}, "held", 1).couple == {9: (0.5, 4)}
    assert resumed.fork("screen", "block", {4: Resample()}, "held").couple == {}
    assert Seeds("t", 0).fork("shapley", (4,), {4: Resample()}, "held", 0).couple is None
