"""A ForkWorker SIGKILLed under a stream of forks, on the embedded Ray: the executor loses only
the forks the dead worker was running, sends nothing to it while Ray restarts it, and routes
to it again once it answers."""

from __future__ import annotations

import itertools
import json
import os
import signal
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from car_ray.execute import BatchLost, Item, NoWorkers, RayExecutor, WorkerConfig
from car_ray.job import Job
from car_ray.replay import BaseUrls, ForkSpec, Resample
from car_ray.sim import SimServer
from car_ray.tape import Tape

from .conftest import ROOT

pytestmark = pytest.mark.usefixtures("ray_local")

# How much longer a restarted worker takes to come up: long enough that a driver which kept
# sending to it would see its batches fail for seconds.
RESTART_S = 3.0
# How long a `gated_restart_agent_*` worker Ray restarted waits for its gate file at most.
GATE_S = 60.0
LATENCY_S = 0.05
DEADLINE_S = 120.0


def _gate(token: str) -> Path:
    return Path(tempfile.gettempdir()) / f"car-ray-test-restart-gate-{token}"


def __getattr__(name: str) -> Any:
    """The demo's agent, as a ForkWorker's constructor imports it. In a worker Ray restarted,
    `slow_restart_agent` takes RESTART_S longer to import, `no_restart_agent` raises, and
    `gated_restart_agent_TOKEN` waits until the test creates `_gate(TOKEN)` (at most GATE_S):
    the worker stays restarting for as long as the test needs it to."""
    gated = name.startswith("gated_restart_agent_")
    if not gated and name not in ("slow_restart_agent", "no_restart_agent"):
        raise AttributeError(name)
    import ray

    if ray.get_runtime_context().was_current_actor_reconstructed:
        if name == "no_restart_agent":
            raise RuntimeError("this agent cannot be imported twice")
        if gated:
            gate = _gate(name.removeprefix("gated_restart_agent_"))
            until = time.monotonic() + GATE_S
            while not gate.exists() and time.monotonic() < until:
                time.sleep(0.05)
        else:
            time.sleep(RESTART_S)
    from support_refund.agent import support_agent

    return support_agent


@pytest.fixture
def sim(support_job: Job) -> Iterator[SimServer]:
    with SimServer(support_job.load("policy"), latency_s=LATENCY_S) as server:
        yield server


def _executor(
    job: Job, tape: Tape, sim: SimServer, workers: int, agent: str = "slow_restart_agent"
) -> RayExecutor:
    executor = RayExecutor(
        WorkerConfig(
            agent_ref=f"{__name__}:{agent}",
            scorer_ref=job.spec.scorer,
            search_path=(str(ROOT), *(str(p) for p in job.code_path())),
            base_urls=BaseUrls.for_server(sim.url).as_dict(),
        ),
        workers=workers,
        per_worker_in_flight=16,
    )
    executor.add_tape(tape.tape_id, tape.path.read_bytes())
    return executor


def _forks(tape: Tape) -> Iterator[Item]:
    """Resample forks of step 2 with a live tail (1-3 model calls each), seeds 0, 1, 2, ..."""
    for seed in itertools.count():
        spec = ForkSpec(tape_id=tape.tape_id, interventions={2: Resample()}, tail="live", seed=seed)
        yield Item(spec, stage="kill")


def _pid(row: dict[str, Any]) -> int:
    return int(str(row["worker"]).rsplit(":", 1)[1])


def test_a_killed_worker_loses_only_the_forks_it_was_running(
    support_job: Job, support_tape: Tape, sim: SimServer
) -> None:
    executor = _executor(support_job, support_tape, sim, workers=2)
    forks = _forks(support_tape)
    window = 32
    rows: list[dict[str, Any]] = []
    lost: list[Item] = []
    # Forks the dead worker had, or was sent before the executor could know it was dead.
    on_dead_worker = 0
    # Forks (by task and attempt) sent after the executor reported the first loss.
    sent_after_first_loss: set[tuple[str, int]] = set()
    pids = executor.worker_pids()
    deadline = time.monotonic() + DEADLINE_S

    def submit(items: list[Item]) -> None:
        nonlocal on_dead_worker
        executor.submit(items)
        if lost:
            sent_after_first_loss.update((i.spec.task_id, i.attempt) for i in items)
        elif on_dead_worker:
            on_dead_worker = max(on_dead_worker, executor.in_flight_by_worker()[0])

    try:
        submit([next(forks) for _ in range(window)])
        fresh = window
        # Stream forks as the scheduler does (a lost fork runs again as its next attempt)
        # until the restarted worker has answered with rows, then let the window drain.
        while executor.in_flight:
            assert time.monotonic() < deadline, f"stuck with {executor.in_flight} in flight"
            for result in executor.wait(0.25):
                if isinstance(result, BatchLost):
                    assert not {(i.spec.task_id, i.attempt) for i in result.items}.intersection(
                        sent_after_first_loss
                    ), "a batch sent after the worker was known dead was lost"
                    lost += result.items
                    submit([replace(i, attempt=i.attempt + 1) for i in result.items])
                else:
                    rows += result
            if not on_dead_worker and len(rows) >= 64:
                # Nothing is submitted between reading the count and the kill.
                on_dead_worker = executor.in_flight_by_worker()[0]
                os.kill(pids[0], signal.SIGKILL)
            if not any(_pid(r) not in pids for r in rows):
                room = window - executor.in_flight
                submit([next(forks) for _ in range(room)])
                fresh += room
        new_pids = executor.worker_pids()
    finally:
        executor.shutdown()
    assert on_dead_worker > 0, "the worker was killed while it had nothing to run"
    # What the dead worker was running is lost (it may have spent); nothing sent after.
    assert 0 < len(lost) <= on_dead_worker, (len(lost), on_dead_worker)
    # Every fork has its row, once.
    ids = [r["task_id"] for r in rows]
    assert len(ids) == len(set(ids)) == fresh
    assert {r["status"] for r in rows} <= {"ok", "blocked_effect"}
    assert {i.spec.task_id for i in lost} <= set(ids)
    # Ray restarted the worker and it ran forks again.
    assert new_pids[0] != pids[0] and new_pids[1] == pids[1]
    assert any(_pid(r) == new_pids[0] for r in rows)


def test_a_batch_sent_while_its_worker_restarts_runs_later_and_is_not_lost(
    support_job: Job, support_tape: Tape, sim: SimServer
) -> None:
    import ray

    # The restarted worker comes up only once the test has seen the late batch come back
    # unsent: how long Ray takes to say "restarting" varies (about 2 s a call in Ray 2.60).
    token = uuid.uuid4().hex
    gate = _gate(token)
    executor = _executor(
        support_job, support_tape, sim, workers=1, agent=f"gated_restart_agent_{token}"
    )
    forks = _forks(support_tape)
    rows: list[dict[str, Any]] = []
    lost: list[Item] = []
    (pid,) = executor.worker_pids()
    deadline = time.monotonic() + DEADLINE_S
    try:
        executor.submit([next(forks) for _ in range(8)])
        os.kill(pid, signal.SIGKILL)
        # Until Ray fails a call at once because the worker is restarting; the executor has
        # not heard of the death yet (it learns in `wait`).
        while True:
            assert time.monotonic() < deadline, "Ray never said the worker was restarting"
            try:
                ray.get(executor.workers[0].pid.remote())
            except ray.exceptions.ActorUnavailableError as exc:
                if "restarting" in str(exc):
                    break
            time.sleep(0.05)
        late = [next(forks) for _ in range(4)]
        executor.submit(late)
        while executor.in_flight:
            assert time.monotonic() < deadline, f"stuck with {executor.in_flight} in flight"
            for result in executor.wait(0.25):
                if isinstance(result, BatchLost):
                    lost += result.items
                else:
                    rows += result
            if executor.rerouted_batches and not gate.exists():
                gate.touch()
    finally:
        gate.touch()  # a worker still waiting for it comes up and is killed
        executor.shutdown()
        gate.unlink()
    # The batches that were running are lost; the one Ray never sent ran on the new worker.
    assert lost and {i.spec.task_id for i in lost}.isdisjoint(i.spec.task_id for i in late)
    assert executor.rerouted_batches >= 1
    assert {r["task_id"] for r in rows} == {i.spec.task_id for i in late}
    assert len({_pid(r) for r in rows} - {pid}) == 1


def test_a_job_whose_every_worker_is_dead_for_good_stops_with_a_readable_error(
    support_job: Job, support_tape: Tape, sim: SimServer
) -> None:
    executor = _executor(support_job, support_tape, sim, workers=1, agent="no_restart_agent")
    forks = _forks(support_tape)
    lost: list[Item] = []
    (pid,) = executor.worker_pids()
    deadline = time.monotonic() + DEADLINE_S
    try:
        executor.submit([next(forks) for _ in range(8)])
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(NoWorkers, match="this agent cannot be imported twice"):
            while time.monotonic() < deadline:
                for result in executor.wait(0.25):
                    assert isinstance(result, BatchLost)
                    lost += result.items
                    # As the scheduler does: the lost forks run again, somewhere.
                    executor.submit([replace(i, attempt=i.attempt + 1) for i in result.items])
    finally:
        executor.shutdown()
    assert len(lost) == 8


def test_the_forks_of_a_seed_go_to_one_worker_and_share_its_draws(
    support_job: Job, support_tape: Tape
) -> None:
    """Two workers, a provider that takes no seed: forks of eight seeds, then again forks of
    the same seeds in a later submit (in another order, after two new seeds), each
    re-drawing step 2 with the rest held. A seed's
    later fork runs where its first did and is answered with the draws it made there: the
    same outcome, and no token paid."""
    with SimServer(support_job.load("policy"), draws="unseeded") as sim:
        executor = RayExecutor(
            WorkerConfig(
                agent_ref=support_job.spec.agent,
                scorer_ref=support_job.spec.scorer,
                search_path=(str(ROOT), *(str(p) for p in support_job.code_path())),
                base_urls=BaseUrls.for_server(sim.url).as_dict(),
            ),
            workers=2,
            per_worker_in_flight=16,
        )
        executor.add_tape(support_tape.tape_id, support_tape.path.read_bytes())
        specs = [
            ForkSpec(
                tape_id=support_tape.tape_id,
                interventions={2: Resample()},
                tail="held",
                seed=seed,
                couple={},
            )
            for seed in range(10)
        ]
        rounds: list[dict[int, dict[str, Any]]] = []
        for attempt in range(2):
            # The second submit holds the seeds in another order, after two new ones.
            order = specs[:8] if attempt == 0 else specs[8:] + specs[7::-1]
            executor.submit([Item(spec, stage="shared", attempt=attempt) for spec in order])
            rows: list[dict[str, Any]] = []
            deadline = time.monotonic() + DEADLINE_S
            while executor.in_flight:
                assert time.monotonic() < deadline
                for result in executor.wait(0.25):
                    assert not isinstance(result, BatchLost)
                    rows += result
            rounds.append({json.loads(r["spec"])["seed"]: r for r in rows})
    first, second = rounds
    assert sorted(first) == list(range(8)) and sorted(second) == list(range(10))
    assert len({_pid(r) for r in first.values()}) == 2  # both workers ran forks
    for seed in range(8):
        assert _pid(second[seed]) == _pid(first[seed]), seed
        assert second[seed]["outcome"] == first[seed]["outcome"], seed
        assert first[seed]["tokens_in"] > 0 and second[seed]["tokens_in"] == 0, seed
