"""The exact solver against values derived by hand from the scenario policies' constants,
and the held tail it enumerates (the engine's coalition game)."""

from __future__ import annotations

import json
from itertools import combinations
from math import factorial
from pathlib import Path

import pytest
from typer.testing import CliRunner

from car_ray.cli import app
from car_ray.job import Job, load_job
from car_ray.replay import ForkRunner, ForkSpec, Probe, Resample
from car_ray.sim import SimServer
from car_ray.tape import Tape
from car_ray.truth import BranchingTooLarge, Solver, solve
from jobs.research_async import policy as research
from jobs.research_async.agent import BLOG
from jobs.support_refund import policy as support

from .conftest import RESEARCH_JOB, ROOT, record_job, run

EXACT = 1e-12


@pytest.fixture(scope="module")
def research_job() -> Job:
    return load_job(RESEARCH_JOB)


@pytest.fixture(scope="module")
def research_tape(research_job: Job, tmp_path_factory: pytest.TempPathFactory) -> Tape:
    with SimServer(research_job.load("policy")) as sim:
        return record_job(research_job, sim, tmp_path_factory.mktemp("t") / "r.tape")


def _first_fetch(tape: Tape) -> str:
    return str(tape.steps[2].action["tool_calls"][0]["arguments"]["url"])


def test_research_values_match_the_policy_by_hand(research_job: Job, research_tape: Tape) -> None:
    # The recorded run fetched a reliable page first, then the blog, then trusted it.
    first = _first_fetch(research_tape)
    assert first != BLOG
    truth = run(solve(research_job, research_tape))
    p_blog_second = research.P_SECOND[first][BLOG]
    trust = research.P_TRUST_BLOG_SECOND
    assert truth.players == [2, 4, 6]
    # Re-draw the second fetch, hold the answer's draw: bad iff the blog is fetched again.
    assert abs(truth.coalition([4]) - p_blog_second) < EXACT
    # Re-draw the answer alone: bad iff it trusts the blog read second.
    assert abs(truth.coalition([6]) - trust) < EXACT
    assert abs(truth.coalition([4, 6]) - p_blog_second * trust) < EXACT
    # Everything re-drawn: the policy's own total (its docstring's 0.314).
    total = sum(
        p1 * p2 * (research.P_TRUST_BLOG_FIRST if a == BLOG else research.P_TRUST_BLOG_SECOND)
        for a, p1 in research.P_FIRST.items()
        for b, p2 in research.P_SECOND[a].items()
        if BLOG in (a, b)
    )
    assert abs(truth.base_rate - total) < 1e-9
    assert abs(truth.base_rate - 0.314) < 1e-9
    # Efficiency: sum of blame = v(nothing re-drawn) - v(everything re-drawn).
    assert abs(sum(s.phi for s in truth.steps) - (1.0 - truth.base_rate)) < 1e-9
    # The root (the blog fetch) and the decision to trust it are the top two; the submit tool
    # that carries the answer's text is not blamed.
    ranked = sorted(truth.steps, key=lambda s: -s.phi)
    assert {ranked[0].step, ranked[1].step} == {4, 6}
    assert truth.step(7).phi == 0.0 and not truth.step(7).player
    assert abs(truth.step(4).necessity - (1 - p_blog_second)) < EXACT
    # A live tail re-draws everything after the step: the precursors tie with the cause.
    assert truth.step(3).live_flip == truth.step(4).live_flip


def test_support_values_match_the_policy_by_hand(support_job: Job, support_tape: Tape) -> None:
    truth = run(solve(support_job, support_tape))
    assert truth.players == [2, 4]
    assert abs(truth.coalition([4]) - support.P_REFUND_INJECTED) < EXACT
    direct = (1 - support.P_CHECK_POLICY) * support.P_REFUND_INJECTED
    assert abs(truth.coalition([2]) - (support.P_CHECK_POLICY + direct)) < EXACT
    assert truth.top == [4]
    # Replacing the injected order note fixes it with the recorded randomness held (the
    # decision's recorded draw refunds only with the note: its u lies above P_REFUND_CLEAN).
    observation = truth.arm("observation", 1)
    assert observation is not None and observation.flip == 1.0
    assert truth.arm("observation", 3) is not None


def test_too_many_players_is_a_clear_error(research_job: Job, research_tape: Tape) -> None:
    with pytest.raises(BranchingTooLarge, match=r"3 steps make choices \(\[2, 4, 6\]\)"):
        run(solve(research_job, research_tape, max_players=2))
    with pytest.raises(BranchingTooLarge, match="more than 5 runs"):
        run(solve(research_job, research_tape, max_runs=5))


def test_held_tail_serves_the_recorded_answer_while_the_request_is_unchanged(
    support_runner: ForkRunner, support_tape: Tape
) -> None:
    """Nothing intervened: the held fork is the replay (no live call, $0). The sampled
    fork's held answer after a changed decision is re-drawn with the recorded randomness."""
    out = []
    for plan in ({}, {6: Resample()}):
        spec = ForkSpec(tape_id=support_tape.tape_id, interventions=plan, tail="held")
        row = run(support_runner.run(spec))
        out.append((row.tail_calls, row.first_deviation, row.fresh_draws))
    (calls0, dev0, fresh0), (calls6, dev6, fresh6) = out
    assert (calls0, dev0, fresh0) == (0, None, 0)
    # Step 6 is a point mass: its fresh draw lands on the recorded action, byte for byte.
    assert (calls6, dev6, fresh6) == (1, None, 1)


def test_a_probe_redraws_a_step_at_its_recorded_request_and_is_held_elsewhere(
    support_runner: ForkRunner, support_tape: Tape
) -> None:
    """A probe re-draws the step while the run is on the tape (its request then the
    recorded one), and keeps its mechanism otherwise. Step 4 (the decision) probed after a
    re-drawn step 2 that kept its action is a fresh draw: the fork is the one re-drawing
    both. After a step 2 that left the tape, step 4's request changed: the fork is the one
    re-drawing 2 alone."""
    plans: list[dict[int, Resample | Probe]] = [
        {2: Resample(), 4: Probe()},
        {2: Resample(), 4: Resample()},
        {2: Resample()},
    ]

    async def go() -> list[list[tuple[object, ...]]]:
        out = []
        for seed in range(40):
            rows = []
            for p in plans:
                spec = ForkSpec(
                    tape_id=support_tape.tape_id, interventions=p, tail="held", seed=seed
                )
                row = await support_runner.run(spec)
                rows.append((row.outcome, row.first_deviation, row.interventions))
            out.append(rows)
        return out

    left = stayed = 0
    runs = run(go())
    for probed, both, alone in runs:
        assert probed[2] == ["resample", "probe"]
        if alone[1] == 2:  # step 2 left the tape: 4 is held
            left += 1
            assert probed[:2] == alone[:2]
        else:  # step 2 kept its action: 4 is drawn fresh at its recorded request
            stayed += 1
            assert probed[:2] == both[:2]
    assert left >= 1 and stayed >= 1
    # And the probe at the decision did leave the tape in some seed: a fresh draw.
    assert any(p[1] == 4 for p, _, _ in runs)


def test_a_probe_draws_only_while_the_run_is_on_the_tape() -> None:
    """After the run left the tape, a probed step met at its recorded request keeps its
    mechanism: in jobs/overdetermined, a fork whose re-drawn status post (step 2) left the
    tape still commits with the recorded arguments (step 7), and the commit tool is not run
    again (held, the recorded result), so the fork stays the fork of its coalition {2}. While
    the run is on the tape, the probe runs it again (live)."""
    from car_ray.bench import _job_and_tape
    from car_ray.truth import sim_runner

    job, tape = _job_and_tape("jobs/overdetermined/job.toml")
    runner = sim_runner(job, tape)
    recorded = tape.steps[7]
    assert recorded.type == "tool" and recorded.name == "git_commit"

    async def go() -> list[tuple[int | None, str, bool]]:
        out = []
        try:
            for seed in range(12):
                plan = {2: Resample(), 7: Probe()}
                spec = ForkSpec(tape_id=tape.tape_id, interventions=plan, tail="held", seed=seed)
                row, trajectory = await runner.fork(spec)
                (commit,) = [e for e in trajectory if e["step"] == 7]
                same = commit["arguments"] == recorded.arguments
                out.append((row.first_deviation, commit["source"], same))
        finally:
            await runner.aclose()
        return out

    forks = run(go())
    left = [source for first, source, same in forks if first == 2 and same]
    stayed = [source for first, source, _ in forks if first is None]
    assert left and stayed, forks
    assert set(left) == {"held"}, forks
    assert set(stayed) == {"live"}, forks


def test_truth_cli_prints_the_table_and_json() -> None:
    # Records jobs/research_async's tape on first use (a scenario job's tape is data).
    result = CliRunner().invoke(app, ["truth", str(RESEARCH_JOB.parent / "job.toml"), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["players"] == [2, 4, 6] and abs(data["base_rate"] - 0.314) < 1e-9
    result = CliRunner().invoke(app, ["truth", str(RESEARCH_JOB.parent / "job.toml")])
    assert result.exit_code == 0 and "top cause: step" in result.stdout
    assert "exact values of the held game" in result.stdout
    job = str(COUPLING_JOB)
    result = CliRunner().invoke(app, ["truth", job, "--game", "maximal", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["game"] == "maximal"
    result = CliRunner().invoke(app, ["truth", job, "--game", "live"])
    assert result.exit_code == 2 and "--game 'live': give held or maximal" in result.output


def test_solver_refuses_a_job_without_a_policy(research_job: Job, research_tape: Tape) -> None:
    job = Job(research_job.path, research_job.spec.model_copy(update={"policy": None}))
    with pytest.raises(BranchingTooLarge, match="set 'policy'"):
        Solver(job, research_tape)


COUPLING_JOB = ROOT / "tests" / "scenarios" / "coupling" / "job.toml"


def _maximal_game_by_hand() -> dict[frozenset[int], float]:
    """P(bad | S re-drawn, the rest held) in the maximal game of tests/scenarios/coupling,
    for every S of its three steps, straight from the module docstring of `truth._solver`
    and the policy's tables (no fork, no simulated provider)."""
    from tests.scenarios.coupling import policy

    def options(said: tuple[str, ...]) -> dict[str, float]:
        if not said:
            return {"Plan A.": policy.PLAN_A, "Plan B.": 1 - policy.PLAN_A}
        if len(said) == 1:
            return dict(policy.AFTER_A if said[0] == "Plan A." else policy.AFTER_B)
        return dict(policy.SUPERVISOR) if said[1] == "Escalate." else {"Closed.": 1.0}

    recorded = ("Plan A.", "Refund.", "Closed.")

    def held(said: tuple[str, ...]) -> dict[str, float]:
        k = len(said)
        if said == recorded[:k]:
            return {recorded[k]: 1.0}
        now, then, d = options(said), options(recorded[:k]), recorded[k]
        p, q = then[d], now.get(d, 0.0)
        keep = min(1.0, q / p)  # every p here is at least 1/8
        return {a: keep if a == d else (1 - keep) * w / (1 - q) for a, w in now.items()}

    def p_bad(redrawn: frozenset[int], said: tuple[str, ...] = ()) -> float:
        if len(said) == 3:
            return 1.0 if "Refund." in said else 0.0
        step = options(said) if len(said) in redrawn else held(said)
        return sum(w * p_bad(redrawn, (*said, a)) for a, w in step.items() if w > 0)

    return {
        frozenset(s): p_bad(frozenset(s)) for size in range(4) for s in combinations(range(3), size)
    }


def test_the_maximal_game_keeps_a_recorded_decision_as_a_maximal_coupling_would(
    tmp_path: Path,
) -> None:
    """tests/scenarios/coupling: every coalition value and phi of the maximal game equal a
    direct computation from the policy's tables; the held game differs where the recorded
    draw's uniform lands on another decision after a changed plan, and the two games name
    different steps first."""
    job = load_job(COUPLING_JOB)
    with SimServer(job.load("policy")) as sim:
        tape = record_job(job, sim, tmp_path / "coupling.tape")
    assert [e.action["text"] for e in tape.steps] == ["Plan A.", "Refund.", "Closed."]
    maximal = run(solve(job, tape, game="maximal"))
    held = run(solve(job, tape))
    assert (maximal.game, held.game) == ("maximal", "held")
    assert maximal.players == held.players == [0, 1, 2]
    by_hand = _maximal_game_by_hand()
    for s, value in by_hand.items():
        assert maximal.coalition(sorted(s)) == pytest.approx(value, abs=EXACT), sorted(s)
    # Shapley over f(S) = 1 - v(S), the chance re-drawing S clears the failure.
    for k in range(3):
        others = [j for j in range(3) if j != k]
        phi = sum(
            factorial(len(s))
            * factorial(2 - len(s))
            / 6
            * (by_hand[frozenset(s)] - by_hand[frozenset(s) | {k}])
            for size in range(3)
            for s in combinations(others, size)
        )
        assert maximal.step(k).phi == pytest.approx(phi, abs=EXACT)
    # Re-planning to B: the maximal coupling keeps the refund half the time (0.3 / 0.6); the
    # held game lands the recorded uniform (0.60) on Deny, clearing the failure every time.
    assert 1 - maximal.coalition([0]) == pytest.approx(0.5 * (1 - 0.5 - 0.25 * 0.5), abs=EXACT)
    assert 1 - held.coalition([0]) == pytest.approx(0.5, abs=EXACT)
    assert held.top == [0] and maximal.top == [1]
    # The rest agree: re-drawing the decision alone is the same draw in both games.
    assert maximal.coalition([1]) == pytest.approx(held.coalition([1]), abs=EXACT)
