"""Agents as they really are: every model step varies its wording. The noisy suite's policies
(`car_ray.sim.Worded`) keep each scenario's decisions and vary the words; a job that holds
decisions (`hold = "decisions"`) reads through the words; the truth solver enumerates
decisions, checked against a brute force over every wording."""

from __future__ import annotations

import pytest

from car_ray._aio import run
from car_ray.bench import _job_and_tape
from car_ray.job import Job
from car_ray.providers import Action, ChatRequest, Message, ToolCall
from car_ray.replay import Decisions
from car_ray.schedule import Budget
from car_ray.sim import DECISION_TEXT, Worded
from car_ray.truth import Game, run_local, solve


class _Coin:
    """One step: tool a or b, half each; then a text answer."""

    def distribution(self, request: ChatRequest) -> list[tuple[float, Action]]:
        if not any(m.tool_calls for m in request.messages):
            return [
                (0.5, Action(tool_calls=(ToolCall("a", {"x": 1}),))),
                (0.5, Action(tool_calls=(ToolCall("b", {}),))),
            ]
        return [(1.0, Action(text="done"))]


def _request(*messages: Message) -> ChatRequest:
    return ChatRequest(provider="openai", model="m", messages=messages)


def test_a_worded_policy_keeps_the_decisions_and_varies_the_words() -> None:
    worded = Worded(_Coin(), wordings=3)
    first = list(worded.distribution(_request(Message("user", "go"))))
    assert [p for p, _ in first] == pytest.approx([1 / 6] * 6)
    texts = {a.text for _, a in first}
    assert len(texts) == 3 and all(a.tool_calls for _, a in first)
    # The inner policy never sees the words: an assistant turn in any wording asks the same.
    for _, action in first[:3]:
        asked = Message("assistant", action.text or "", tool_calls=action.tool_calls)
        (answer,) = {a.text.split("\n\n-- ")[0] for _, a in worded.distribution(_request(asked))}
        assert answer == "done"
    # Its wordings are one decision to the solver, and to a job that holds decisions.
    assert len({worded.interchangeable(a) for _, a in first}) == 2
    decisions = Decisions.of("decisions", [DECISION_TEXT])
    assert len({str(decisions.decision(a.to_json())) for _, a in first}) == 2
    asked = Message("assistant", "x", tool_calls=first[0][1].tool_calls)
    answers = worded.distribution(_request(asked))
    assert len({a.text for _, a in answers}) == 3
    assert all(decisions.decision(a.to_json()) == ["done"] for _, a in answers)
    # Holding actions, the words are part of the action.
    assert len({str(Decisions().decision(a.to_json())) for _, a in first}) == 6


@pytest.mark.parametrize("game", ["held", "maximal"])
def test_the_solver_merges_wordings_exactly_as_a_brute_force_over_every_wording(
    game: Game,
) -> None:
    """jobs/and_conj_noisy: the exact values of the noisy scenario (decisions enumerated,
    wordings merged) equal jobs/and_conj's, and equal a brute-force enumeration of every
    wording of every step (`BRUTE`: two wordings, none declared alike), to 1e-12, in the held
    game and in the maximal one (where a held step keeps its decision, whatever its words)."""
    base, base_tape = _job_and_tape("jobs/and_conj/job.toml")
    noisy, tape = _job_and_tape("jobs/and_conj_noisy/job.toml")
    brute = Job(noisy.path, noisy.spec.model_copy(update={"policy": "and_conj_noisy.policy:BRUTE"}))
    exact = run(solve(base, base_tape, game=game))
    merged = run(solve(noisy, tape, game=game))
    forced = run(solve(brute, tape, game=game))
    assert merged.players == exact.players and merged.top == exact.top
    # The brute force takes every model step for a player (its wordings are options), and
    # every step that only varies its words comes out with no blame.
    assert set(exact.players) < set(forced.players)
    for a, b, c in zip(exact.steps, merged.steps, forced.steps, strict=True):
        assert a.phi == pytest.approx(b.phi, abs=1e-12) == pytest.approx(c.phi, abs=1e-12)
        assert b.necessity == pytest.approx(c.necessity, abs=1e-12)
        assert b.sufficiency == pytest.approx(c.sufficiency, abs=1e-12)
    assert merged.runs < forced.runs


@pytest.mark.parametrize("hold", ["decisions", "actions"])
def test_holding_decisions_screens_on_what_the_steps_decide(hold: str) -> None:
    """jobs/checklist_sparse_30: 31 steps, every model step worded four ways, one planted
    decision (step 14). Holding decisions, the screen finds step 14 alone and the default job
    separates it in a few dozen forks; holding actions (whole texts), the screen takes the
    first steps whose words changed for choices, and the job is far from an answer at the
    same spend."""
    job, tape = _job_and_tape("jobs/checklist_sparse_30/job.toml")
    spec = job.spec.model_copy(update={"hold": hold})
    outcome, _ = run_local(Job(job.path, spec), tape, Budget(max_forks=60))
    (screen,) = [n for n in outcome.notes if n.kind == "screen"]
    assert outcome.answer is not None
    if hold == "decisions":
        assert screen.figures["candidates"] == [14]
        assert outcome.answer.kind == "separated" and outcome.answer.top == [14]
        assert outcome.progress.spent.forks <= 60
    else:
        assert 14 not in screen.figures["candidates"] and len(screen.figures["candidates"]) > 1
        assert outcome.answer.kind != "separated"
