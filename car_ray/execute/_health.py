"""Which `ForkWorker` actors may take new batches.

A worker whose call failed with an actor error is quarantined and pinged until it answers
again, as Ray advises for `ActorUnavailableError` (docs.ray.io, Actor Fault Tolerance,
"Unavailable actors"): while Ray restarts it, every call sent to it fails, and each such
failure would otherwise come back to the scheduler as a lost batch."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import ray
import structlog
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

log = structlog.get_logger("car_ray.execute")

# Ray fails a call to a restarting actor at once, without sending it, when the call has no
# retries (max_task_retries=0), with an IOError saying so (ActorTaskSubmitter, Ray core). The
# message is the only mark of it: were it to change, such calls count as lost, as before.
_RESTARTING = "The actor is restarting"


def never_sent(exc: BaseException) -> bool:
    """Whether Ray failed an actor call without sending it (its actor was restarting): nothing
    of it ran, so it may go to another worker as it is. Any other actor error may have
    reached the worker, and the call may have run there."""
    return isinstance(exc, ActorUnavailableError) and _RESTARTING in str(exc)


class NoWorkers(RuntimeError):
    """Every worker died for good: Ray restarts none of them (its constructor failed)."""


@dataclass
class _Down:
    since: float
    cause: str
    ping_at: float
    ping: Any = None  # the ping in flight, an ObjectRef


class WorkerHealth:
    """The workers' health: `pick` names the live worker with the least work, `failed` puts
    one in quarantine, `pings` asks each quarantined worker (one ping at a time, every
    `ping_every_s`) whether it is back, and `answered` takes the answer."""

    def __init__(self, workers: Sequence[Any], ping_every_s: float = 0.25) -> None:
        self._workers = workers
        self.ping_every_s = ping_every_s
        self._down: dict[int, _Down] = {}
        self._pings: dict[Any, int] = {}
        self._dead: set[int] = set()
        self._turn = 0

    @property
    def live(self) -> list[int]:
        return [i for i in range(len(self._workers)) if i not in self._down and i not in self._dead]

    def pick(self, load: Sequence[int], prefer: int | None = None, slack: int = 0) -> int | None:
        """The live worker with the fewest forks in flight (`load`, by worker; ties taken in
        turn), or None while none is live; `prefer` instead, if it is live and has at most
        `slack` forks more than that one. A worker that died unseen answers nothing and
        keeps its load, so new batches mostly go to the others before Ray reports the death."""
        live = self.live
        if not live:
            return None
        count = len(self._workers)
        index = min(live, key=lambda i: (load[i], (i - self._turn) % count))
        if prefer is not None and prefer in live and load[prefer] <= load[index] + slack:
            index = prefer
        self._turn = index + 1
        return index

    def failed(self, index: int, exc: BaseException) -> None:
        """A call to worker `index` failed with an actor error: no new batch goes to it until
        it answers a ping."""
        if index in self._down or index in self._dead:
            return
        now = time.monotonic()
        self._down[index] = _Down(since=now, cause=type(exc).__name__, ping_at=now)
        log.warning("worker_unavailable", worker=index, error=type(exc).__name__)

    def pings(self) -> list[Any]:
        """Send the pings that are due; returns every ping in flight (for `ray.wait`)."""
        now = time.monotonic()
        for index, down in self._down.items():
            if down.ping is None and now >= down.ping_at:
                down.ping = self._workers[index].pid.remote()
                self._pings[down.ping] = index
        return list(self._pings)

    def answered(self, ref: Any) -> bool:
        """Take the answer to a ping that `ray.wait` found ready; False if `ref` is no ping.
        Raises `NoWorkers` once every worker is dead for good."""
        index = self._pings.pop(ref, None)
        if index is None:
            return False
        down = self._down[index]
        down.ping = None
        try:
            pid = ray.get(ref)
        except ActorDiedError as exc:
            # Ray restarts a worker that crashed; a dead one stays dead (its constructor
            # raised, or it was killed for good).
            del self._down[index]
            self._dead.add(index)
            log.error("worker_dead", worker=index, error=str(exc).splitlines()[0])
            if len(self._dead) == len(self._workers):
                raise NoWorkers(
                    f"every fork worker died and Ray restarts none of them; the last: {exc}\n"
                    "The Ray logs on its node say why (/tmp/ray/session_latest/logs/worker-*.err)"
                ) from None
        except RayActorError:
            down.ping_at = time.monotonic() + self.ping_every_s
        else:
            del self._down[index]
            log.info(
                "worker_back",
                worker=index,
                pid=pid,
                down_s=round(time.monotonic() - down.since, 2),
                after=down.cause,
            )
        return True

    def next_ping_s(self) -> float:
        """Seconds until the next ping is due (0 if one is in flight or none is down)."""
        now = time.monotonic()
        return min(
            (0.0 if d.ping is not None else max(0.0, d.ping_at - now) for d in self._down.values()),
            default=0.0,
        )
