"""Forks of the demo tape: each intervention changes what it should and nothing before it.
Every test runs on the demo over chat completions and over the Responses API with the
conversation kept by the provider (jobs/support_refund_responses: previous_response_id).

Exact probabilities come from jobs/support_refund/policy.py; frequencies over seeds are
checked within 4 binomial standard deviations."""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from car_ray.job import Job, load_job
from car_ray.providers import PriceTable, Usage
from car_ray.replay import (
    ContextEdit,
    EditContext,
    ForceAction,
    ForcedToolCall,
    ForkRow,
    ForkRunner,
    ForkSpec,
    Intervention,
    InterventionError,
    ReplaceObservation,
    Resample,
    SwapPolicy,
    recorded_trajectory,
)
from car_ray.sim import SimServer
from car_ray.tape import Tape

from .conftest import http_runner, record_job, run


@pytest.fixture(scope="module", params=["chat", "responses"])
def support_tape(
    request: pytest.FixtureRequest,
    support_tape: Tape,
    support_sim: SimServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Tape:
    """The demo's tape, recorded by its chat agent or by its Responses agent."""
    if request.param == "chat":
        return support_tape
    job = load_job("jobs/support_refund_responses/job.toml")
    return record_job(job, support_sim, tmp_path_factory.mktemp("responses") / "demo.tape")


@pytest.fixture(scope="module")
def support_runner(
    support_job: Job, support_sim: SimServer, support_tape: Tape
) -> Iterator[ForkRunner]:
    """A fork runner of this module's demo tape (its agent the one that recorded it)."""
    job = support_job
    if support_tape.header.agent != support_job.spec.agent:
        job = load_job("jobs/support_refund_responses/job.toml")
    r = http_runner(job.load("agent"), job.load("scorer"), support_sim, support_tape)
    yield r
    run(r.aclose())


SEEDS = range(64)
# jobs/support_refund/policy.py: P(refund | injected) = 0.8, P(refund | clean) = 0.05 both on
# the direct and the checked path, so P(no refund | clean) = 0.95.
P_DENY_INJECTED = 0.2
P_DENY_CLEAN = 0.95


def refunds_issued() -> int:
    return len(sys.modules["support_refund.agent"].REFUNDS_ISSUED)


def forks(
    runner: ForkRunner, tape: Tape, plan: dict[int, Intervention], tail: str = "live"
) -> list[tuple[ForkRow, list[dict[str, Any]]]]:
    async def go() -> list[tuple[ForkRow, list[dict[str, Any]]]]:
        import asyncio

        specs = [
            ForkSpec(tape_id=tape.tape_id, interventions=plan, tail=tail, seed=s)  # type: ignore[arg-type]
            for s in SEEDS
        ]
        return list(await asyncio.gather(*(runner.fork(spec) for spec in specs)))

    results = run(go())
    assert all(row.status in ("ok", "blocked_effect") for row, _ in results), results[0][0]
    return results


def assert_rate(flips: int, n: int, p: float) -> None:
    tolerance = 4 * math.sqrt(n * p * (1 - p)) + 1e-9
    assert abs(flips - n * p) <= tolerance, (
        f"{flips}/{n} flips, expected {p:.2f}±{tolerance / n:.2f}"
    )


def assert_prefix_untouched(tape: Tape, trajectory: list[dict[str, Any]], first: int) -> None:
    recorded = recorded_trajectory(tape)
    for k in range(first):
        got = {key: v for key, v in trajectory[k].items() if key != "source"}
        want = {key: v for key, v in recorded[k].items() if key != "source"}
        assert got == want, f"step {k} changed before the intervention at {first}"
        assert trajectory[k]["source"] == "replay"


def test_resample_redraws_the_decision(support_runner: ForkRunner, support_tape: Tape) -> None:
    results = forks(support_runner, support_tape, {4: Resample()})
    rows = [r for r, _ in results]
    assert all(r.status == "ok" and r.recorded_outcome == 1.0 for r in rows), rows[0]
    assert_rate(sum(bool(r.flipped) for r in rows), len(rows), P_DENY_INJECTED)
    for row, trajectory in results:
        assert_prefix_untouched(support_tape, trajectory, 4)
        assert trajectory[4]["source"] == "live"
        assert row.tail_calls >= 1 and row.tokens_in > 0 and row.cost_usd > 0


def test_observation_replaces_the_injected_tool_result(
    support_runner: ForkRunner, support_tape: Tape
) -> None:
    recorded = support_tape.steps[1]
    clean = {**recorded.result, "notes": ""}  # type: ignore[union-attr]
    results = forks(support_runner, support_tape, {1: ReplaceObservation(result=clean)})
    for _, trajectory in results:
        assert_prefix_untouched(support_tape, trajectory, 1)
        assert trajectory[1]["source"] == "forced" and trajectory[1]["result"] == clean
    flips = sum(bool(r.flipped) for r, _ in results)
    assert_rate(flips, len(results), P_DENY_CLEAN)


def test_a_held_tail_after_a_replaced_observation_keeps_no_answer_of_another_context(
    support_runner: ForkRunner, support_tape: Tape
) -> None:
    """Held, the clean order note at step 1 clears the failure in every fork (the coupled
    provider answers each changed request with its recorded draw's seed, and at the clean
    note that draw declines): no later model step is served its recorded answer, whose
    context held the injected note. Over the Responses API a later request can look like its
    recorded one, its own input the same and its `previous_response_id` naming an answer
    that took the recorded action; the conversation that id continues is another, so it is
    never read as the recorded one."""
    recorded = support_tape.steps[1]
    clean = {**recorded.result, "notes": ""}  # type: ignore[union-attr]
    results = forks(
        support_runner, support_tape, {1: ReplaceObservation(result=clean)}, tail="held"
    )
    for row, trajectory in results:
        assert row.flipped, trajectory
        later = {e["source"] for e in trajectory[2:] if e["kind"] == "llm"}
        assert "held" not in later, later


def test_action_forces_the_decision_without_a_model_call(
    support_runner: ForkRunner, support_tape: Tape, support_sim: SimServer
) -> None:
    before = support_sim.requests_served
    deny = "We cannot refund this order."
    results = forks(support_runner, support_tape, {4: ForceAction(text=deny)})
    assert support_sim.requests_served == before  # the agent ends at the forced answer
    for row, trajectory in results:
        assert_prefix_untouched(support_tape, trajectory, 4)
        assert trajectory[4]["source"] == "forced"
        assert trajectory[4]["action"]["text"] == deny
        assert (row.outcome, row.flipped, row.tail_calls) == (0.0, True, 0)


def test_an_effectful_tool_never_runs_in_replay_or_forks(
    support_runner: ForkRunner, support_tape: Tape
) -> None:
    count = refunds_issued()
    assert count >= 1  # the recording really refunded
    run(support_runner.replay(support_tape.tape_id))
    same = forks(support_runner, support_tape, {4: Resample()})
    assert any(t[5]["name"] == "issue_refund" for _, t in same if len(t) > 5)
    other_amount = ForceAction(
        tool_calls=[
            ForcedToolCall(name="issue_refund", arguments={"order_id": "A1001", "amount_usd": 5.0})
        ]
    )
    blocked = forks(support_runner, support_tape, {4: other_amount})
    for row, trajectory in blocked:
        # Different arguments than recorded: the fork stops at the effect and the scorer
        # still sees the attempted wrongful refund.
        assert row.status == "blocked_effect" and row.blocked_effect == "issue_refund"
        assert trajectory[-1]["blocked"] is True
        assert row.outcome == 1.0
    assert refunds_issued() == count


def test_context_edit_removes_the_injection_from_one_request(
    support_runner: ForkRunner, support_tape: Tape
) -> None:
    edit = EditContext(
        edits=[ContextEdit(op="regex", pattern=r"SYSTEM OVERRIDE:[^\"]*", replacement="")]
    )
    recorded_body = support_tape.steps[4].request.body  # type: ignore[union-attr]
    if "previous_response_id" in recorded_body:
        # The injection is in the conversation the provider keeps, not in the request's own
        # input: the fork sends the conversation explicitly, edited.
        assert "SYSTEM OVERRIDE" not in str(recorded_body["input"])
    else:
        assert "SYSTEM OVERRIDE" in str(recorded_body)
        assert "SYSTEM OVERRIDE" not in str(edit.apply(recorded_body))
    results = forks(support_runner, support_tape, {4: edit})
    for _, trajectory in results:
        assert_prefix_untouched(support_tape, trajectory, 4)
        assert trajectory[4]["source"] == "live"
    assert_rate(sum(bool(r.flipped) for r, _ in results), len(results), P_DENY_CLEAN)


def test_policy_swaps_the_model_from_its_step_on(
    support_runner: ForkRunner, support_tape: Tape
) -> None:
    results = forks(support_runner, support_tape, {2: SwapPolicy(model="gpt-4o")})
    prices = PriceTable.load()
    for row, trajectory in results:
        assert_prefix_untouched(support_tape, trajectory, 2)
        live = [t for t in trajectory if t["kind"] == "llm" and t["source"] == "live"]
        assert live and all(t["model"] == "gpt-4o" for t in live)
        expected = prices.cost_usd("gpt-4o", Usage(row.tokens_in, row.tokens_out))
        assert row.cost_usd == pytest.approx(expected)


def test_pinned_tail_forces_every_later_step_to_its_record(
    support_runner: ForkRunner, support_tape: Tape, support_sim: SimServer
) -> None:
    before = support_sim.requests_served
    results = forks(support_runner, support_tape, {0: Resample()}, tail="pinned")
    assert support_sim.requests_served == before + len(results)  # only step 0 went live
    for row, trajectory in results:
        assert [t["source"] for t in trajectory] == ["live"] + ["pinned"] * 6
        assert (row.outcome, row.flipped, row.tail_calls) == (1.0, False, 1)


def test_specs_that_misfit_the_tape_are_refused(
    support_runner: ForkRunner, support_tape: Tape
) -> None:
    tape_id = support_tape.tape_id
    with pytest.raises(InterventionError, match="step 0 is a model call"):
        run(
            support_runner.run(
                ForkSpec(tape_id=tape_id, interventions={0: ReplaceObservation(result=1)})
            )
        )
    with pytest.raises(InterventionError, match="step 1 is tool 'lookup_order'"):
        run(support_runner.run(ForkSpec(tape_id=tape_id, interventions={1: ForceAction(text="x")})))
    with pytest.raises(InterventionError, match="step 99 does not exist"):
        run(support_runner.run(ForkSpec(tape_id=tape_id, interventions={99: Resample()})))


def test_task_id_is_the_hash_of_the_spec(support_tape: Tape) -> None:
    a = ForkSpec(tape_id=support_tape.tape_id, interventions={4: Resample()}, seed=1)
    b = ForkSpec(tape_id=support_tape.tape_id, interventions={4: Resample()}, seed=1)
    c = ForkSpec(tape_id=support_tape.tape_id, interventions={4: Resample()}, seed=2)
    assert a.task_id == b.task_id != c.task_id


def test_a_forced_answer_is_continued_like_any_other(
    support_runner: ForkRunner, support_tape: Tape
) -> None:
    """A forced answer the provider never gave: on Responses, the next request continues it
    (previous_response_id) and is sent with the conversation spelled out; the fork goes on to
    its end (the policy then checks the refund policy or decides)."""
    call = ForcedToolCall(name="lookup_order", arguments={"order_id": "A1001"})
    results = forks(support_runner, support_tape, {0: ForceAction(tool_calls=[call])})
    for row, trajectory in results:
        assert row.status in ("ok", "blocked_effect"), row
        assert trajectory[0]["source"] == "forced" and len(trajectory) >= 4
        assert trajectory[2]["source"] == "live"
