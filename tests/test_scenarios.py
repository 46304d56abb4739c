"""The scenario suite under jobs/: each job records its planted failure with its own seed,
its tape has the steps its agent's docstring lists, the steps its policy's SCENARIO plants
exist with the right type, and a replay of the tape is faithful and offline."""

from __future__ import annotations

import inspect
import re
import sys
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import pytest

from car_ray.job import Job, load_job
from car_ray.providers import codec_for_path
from car_ray.replay import BaseUrls, ForkRunner, is_bad, recorded_trajectory
from car_ray.sim import SimServer, distribution_of
from car_ray.tape import LlmEvent, Tape, ToolEvent

from .conftest import ROOT, record_job, run

SCENARIOS = [
    "obs_root",
    "late_commit",
    "echo",
    "relay",
    "and_conj",
    "overdetermined",
    "policy_fix",
    "null_control",
    "long_tape",
    "nightly",
]
# The noisy suite (tests/test_noisy.py): each scenario above with every model step worded
# several ways (`sim.Worded`), and the checklist reviews of 11, 31, 101 and 301 steps.
NOISY = [f"{name}_noisy" for name in SCENARIOS] + [
    "research_async_noisy",
    "support_refund_noisy",
    "checklist_sparse_10",
    "checklist_sparse_30",
    "checklist_sparse_100",
    "checklist_sparse_300",
    "checklist_dense",
]
STEP_COUNT = re.compile(r"the tape has (\d+) steps")
LISTED_STEP = re.compile(r"(?<![\w.+])(\d+) (llm|tool)\b")


@dataclass(frozen=True)
class Recorded:
    job: Job
    tape: Tape
    served: int  # requests the simulated provider answered while recording

    @property
    def agent_module(self) -> ModuleType:
        return sys.modules[self.job.load("agent").__module__]

    @property
    def policy_module(self) -> ModuleType:
        return sys.modules[type(self.job.load("policy")).__module__]

    @property
    def scenario(self) -> dict[str, Any]:
        scenario: dict[str, Any] = self.policy_module.SCENARIO
        return scenario


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Recorded]:
    """Each scenario recorded once for the module, with its job's input and seed."""
    cache: dict[str, Recorded] = {}

    def get(name: str) -> Recorded:
        if name not in cache:
            job = load_job(ROOT / "jobs" / name / "job.toml")
            with SimServer(job.load("policy")) as sim:
                tape = record_job(job, sim, tmp_path_factory.mktemp(name) / f"{name}.tape")
                served = sim.requests_served
            cache[name] = Recorded(job, tape, served)
        return cache[name]

    return get


def test_every_scenario_folder_is_listed() -> None:
    found = {
        p.parent.name for p in (ROOT / "jobs").glob("*/policy.py") if "SCENARIO =" in p.read_text()
    }
    assert found == set(SCENARIOS) | set(NOISY)


@pytest.mark.parametrize("name", SCENARIOS)
def test_the_recorded_run_shows_the_failure(name: str, recorded: Callable[[str], Recorded]) -> None:
    rec = recorded(name)
    assert rec.tape.seal is not None
    score = rec.job.load("scorer")(rec.tape.seal.result, recorded_trajectory(rec.tape))
    assert 0.0 <= score <= 1.0
    assert score >= 0.5, f"{name}: seed {rec.job.spec.seed} records a good run"
    llm = [e for e in rec.tape.steps if isinstance(e, LlmEvent)]
    assert rec.served == len(llm), "one provider request per model call"


@pytest.mark.parametrize("name", SCENARIOS)
def test_the_tape_has_the_steps_the_docstring_lists(
    name: str, recorded: Callable[[str], Recorded]
) -> None:
    rec = recorded(name)
    doc = " ".join((inspect.getdoc(rec.agent_module) or "").split())
    counts = STEP_COUNT.findall(doc)
    assert len(counts) == 1, f"{name}: the agent's docstring says 'the tape has N steps' once"
    assert len(rec.tape.steps) == int(counts[0])
    listed = {int(k): kind for k, kind in LISTED_STEP.findall(doc)}
    assert {0, len(rec.tape.steps) - 1} <= set(listed), "the listing covers first and last"
    for k, kind in listed.items():
        assert rec.tape.steps[k].type == kind, f"{name}: step {k} is not a {kind} step"


@pytest.mark.parametrize("name", SCENARIOS)
def test_the_planted_steps_exist_with_the_right_type(
    name: str, recorded: Callable[[str], Recorded]
) -> None:
    rec = recorded(name)
    scenario = rec.scenario
    assert scenario["kind"] == name
    assert isinstance(scenario["description"], str) and scenario["description"]
    planted = scenario["planted"]
    assert set(planted) == {"resample", "observation", "policy"}
    steps = rec.tape.steps
    for key, want in (("resample", LlmEvent), ("policy", LlmEvent), ("observation", ToolEvent)):
        for k in planted[key]:
            assert 0 <= k < len(steps), f"{name}: planted {key} step {k} is not on the tape"
            assert isinstance(steps[k], want), f"{name}: planted {key} step {k} is {steps[k].type}"
    # The job's interventions: resample of every step, and the planted observation and
    # policy steps among those the job intervenes on.
    entries = rec.job.spec.interventions
    assert any(e.kind == "resample" and e.steps is None for e in entries)
    for key in ("observation", "policy"):
        covered = {k for e in entries if e.kind == key for k in e.steps or []}
        assert set(planted[key]) <= covered, f"{name}: no {key} intervention at {planted[key]}"
        for k in covered:
            assert isinstance(steps[k], LlmEvent if key == "policy" else ToolEvent)
    raw = tomllib.loads(rec.job.path.read_text())
    assert "budget" not in raw and "provider" not in raw


def _distribution(rec: Recorded, event: LlmEvent) -> list[float]:
    codec = codec_for_path(event.request.path)
    assert codec is not None
    request = codec.parse_request(event.request.body)
    return [p for p, _ in distribution_of(rec.job.load("policy"), request)]


@pytest.mark.parametrize("name", SCENARIOS)
def test_planted_steps_are_real_draws(name: str, recorded: Callable[[str], Recorded]) -> None:
    """A planted re-draw is stochastic where it was recorded; the negative control has no
    stochastic step at all; and no scenario has more than six stochastic model calls."""
    rec = recorded(name)
    stochastic = [
        e.step
        for e in rec.tape.steps
        if isinstance(e, LlmEvent) and sum(p > 0 for p in _distribution(rec, e)) > 1
    ]
    assert set(rec.scenario["planted"]["resample"]) <= set(stochastic)
    assert len(stochastic) <= 6
    if name == "null_control":
        assert stochastic == []


@pytest.mark.parametrize("name", SCENARIOS)
def test_a_replay_is_faithful_and_offline(name: str, recorded: Callable[[str], Recorded]) -> None:
    rec = recorded(name)
    runner = ForkRunner(
        rec.job.load("agent"),
        rec.job.load("scorer"),
        base_urls=BaseUrls.for_server("http://127.0.0.1:9"),  # nothing listens: no network
    )
    runner.add_tape(rec.tape)

    async def go() -> Any:
        try:
            return await runner.replay(rec.tape.tape_id)
        finally:
            await runner.aclose()

    outcome = run(go())
    assert outcome.error is None
    assert rec.tape.seal is not None
    assert outcome.result == rec.tape.seal.result
    assert [s["source"] for s in outcome.trajectory] == ["replay"] * len(rec.tape.steps)
    assert is_bad(runner.recorded_outcome(rec.tape.tape_id))


def test_the_suite_spans_both_sdks_sync_and_async_streaming_and_lengths(
    recorded: Callable[[str], Recorded],
) -> None:
    by_provider: dict[str, list[str]] = {"openai": [], "anthropic": []}
    asynchronous, streaming, lengths, model_calls = [], [], {}, {}
    for name in SCENARIOS:
        rec = recorded(name)
        llm = [e for e in rec.tape.steps if isinstance(e, LlmEvent)]
        (provider,) = {e.provider for e in llm}
        by_provider[provider].append(name)
        if inspect.iscoroutinefunction(rec.job.load("agent")):
            asynchronous.append(name)
        if all(e.response.stream for e in llm):
            streaming.append(name)
        lengths[name] = len(rec.tape.steps)
        model_calls[name] = len(llm)
    assert len(by_provider["openai"]) >= 3 and len(by_provider["anthropic"]) >= 3, by_provider
    assert asynchronous and streaming
    assert min(lengths.values()) <= 4 and max(model_calls.values()) >= 30, lengths


def test_every_recorded_and_swapped_model_is_priced(recorded: Callable[[str], Recorded]) -> None:
    priced = set(tomllib.loads((ROOT / "configs" / "pricing.toml").read_text())["models"])
    models = {
        e.model for name in SCENARIOS for e in recorded(name).tape.steps if isinstance(e, LlmEvent)
    }
    swapped = {
        str((e.model_extra or {})["model"])
        for name in SCENARIOS
        for e in recorded(name).job.spec.interventions
        if e.kind == "policy"
    }
    assert swapped and models | swapped <= priced
