"""The Ray executor: a pool of async `ForkWorker` actors fed in small batches.

Each worker holds its imported agent and scorer, a cache of tapes by id, one pooled live
upstream and its share of the provider's rate limit. The driver keeps a bounded window of
batches in flight, each sent to the live worker with the least work. A batch whose worker
died while it may have been running comes back as `BatchLost`, and the caller decides what
to retry (so the budget can count the lost attempt); the worker gets no new batch until it
answers a ping (`WorkerHealth`), and a batch Ray never sent to it goes to another."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import time
from collections import Counter, OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import ray
import structlog
from ray.exceptions import RayActorError, RayError

from .._usercode import UserCodeError
from ..providers import PriceTable
from ..replay import (
    AiohttpUpstream,
    BaseUrls,
    Decisions,
    DivergenceError,
    ForkRunner,
    ForkSpec,
    RateLimiter,
    RetryPolicy,
    SpendLimit,
    quiet_telemetry,
)
from ..tape import parse_tape
from ._health import NoWorkers, WorkerHealth, never_sent
from ._protocol import BatchLost, Item, Row, Verified, run_item

log = structlog.get_logger("car_ray.execute")


@dataclass(frozen=True)
class AgentCode:
    """Another agent the workers run forks of (a batch over several job files): its code,
    its provider's URLs and prices. Its tapes are added with `add_tape(..., agent=ref)`."""

    agent_ref: str
    scorer_ref: str
    search_path: tuple[str, ...]
    base_urls: dict[str, str]
    pricing: str | None = None
    hold: str = "actions"  # what its job compares a fork's steps by (`replay.Decisions`)
    decision_text: tuple[str, ...] = ()


@dataclass(frozen=True)
class WorkerConfig:
    """What every worker needs to run forks: plain data, so it crosses process lines. The
    agent here runs every tape not added for one of `more_agents`; the provider's limits
    are the pool's, over every agent."""

    agent_ref: str
    scorer_ref: str
    search_path: tuple[str, ...]
    base_urls: dict[str, str]
    pricing: str | None = None
    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None
    max_threads: int = 128
    max_attempts: int = 6  # of a call the provider fails (RetryPolicy)
    more_agents: tuple[AgentCode, ...] = ()
    hold: str = "actions"
    decision_text: tuple[str, ...] = ()


class ForkWorker:
    """A Ray actor (async): runs batches of forks concurrently on one event loop, each on
    the runner of its tape's agent."""

    def __init__(self, config: WorkerConfig) -> None:
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        quiet_telemetry()  # before the agent's module is imported: nothing traced off the machine
        limited = config.requests_per_minute or config.tokens_per_minute
        limiter = (
            RateLimiter(config.requests_per_minute, config.tokens_per_minute) if limited else None
        )
        # One upstream (connections, retries, the rate limit) for every agent's runner.
        upstream = AiohttpUpstream(
            retry=RetryPolicy(max_attempts=config.max_attempts), limiter=limiter
        )
        keys = {
            "openai": os.environ.get("OPENAI_API_KEY", ""),
            "anthropic": os.environ.get("ANTHROPIC_API_KEY", ""),
        }
        codes = [
            AgentCode(
                config.agent_ref,
                config.scorer_ref,
                config.search_path,
                config.base_urls,
                config.pricing,
                config.hold,
                config.decision_text,
            ),
            *config.more_agents,
        ]
        self.runners: dict[str | None, ForkRunner] = {}
        for index, code in enumerate(codes):
            self.runners[None if index == 0 else code.agent_ref] = _runner(
                code, upstream, {k: v for k, v in keys.items() if v}, config.max_threads
            )
        self.runner = self.runners[None]
        self._by_tape: dict[str, ForkRunner] = {}
        self.name = f"{os.uname().nodename}:{os.getpid()}"

    def pid(self) -> int:
        return os.getpid()

    async def _ensure(self, tapes: dict[str, tuple[str | None, Any]]) -> None:
        for tape_id, (agent, ref) in tapes.items():
            if tape_id not in self._by_tape:
                raw = await ref if isinstance(ref, ray.ObjectRef) else ref
                runner = self.runners[agent]
                runner.add_tape(parse_tape(raw, Path(f"<tape {tape_id[:12]}>")))
                self._by_tape[tape_id] = runner

    async def verify(
        self, tapes: dict[str, tuple[str | None, Any]], tape_id: str
    ) -> dict[str, Any]:
        """Replay the tape here ($0): what the scheduler's `verify` stage needs."""
        await self._ensure(tapes)
        runner = self._by_tape[tape_id]
        try:
            await runner.replay(tape_id)
            recorded_outcome = runner.recorded_outcome(tape_id)
        except DivergenceError as exc:
            return {"ok": False, "divergence": exc.render()}
        except UserCodeError as exc:
            # As data: raised through Ray it would reach the user as an actor's repr and a
            # remote stack; the driver raises it again (`RayExecutor.verify`).
            return {"ok": False, "user_code_error": exc.as_dict()}
        return {"ok": True, "recorded_outcome": recorded_outcome}

    async def run_batch(
        self, tapes: dict[str, tuple[str | None, Any]], items: list[tuple[str, str, int, str, str]]
    ) -> list[Row]:
        """Run forks concurrently; each row comes back with the worker's name and timing."""
        await self._ensure(tapes)

        def item(spec_json: str, stage: str, attempt: int, limit_json: str, job_id: str) -> Item:
            spec = ForkSpec.model_validate_json(spec_json)
            limit = SpendLimit.model_validate_json(limit_json)
            return Item(spec, stage, attempt, limit, job_id)

        forks = [item(*fork) for fork in items]
        return list(
            await asyncio.gather(
                *(
                    run_item(self._by_tape[i.spec.tape_id], i, self.name, fork[0])
                    for i, fork in zip(forks, items, strict=True)
                )
            )
        )


def _runner(
    code: AgentCode, upstream: AiohttpUpstream, api_keys: dict[str, str], max_threads: int
) -> ForkRunner:
    """A runner of `code`'s agent and scorer, imported from its own folders first."""
    from .._imports import import_ref

    for folder in reversed(code.search_path):
        if folder not in sys.path:
            sys.path.insert(0, folder)
    paths = tuple(Path(p) for p in code.search_path)
    return ForkRunner(
        import_ref(code.agent_ref, "agent", paths),
        import_ref(code.scorer_ref, "scorer", paths),
        base_urls=BaseUrls(**code.base_urls),
        upstream=upstream,
        prices=PriceTable.load(Path(code.pricing) if code.pricing else None),
        api_keys=api_keys,
        max_threads=max_threads,
        decisions=Decisions.of(code.hold, code.decision_text),
    )


class ClusterUnreachable(ValueError):
    """`--address` names a Ray cluster this driver cannot join."""


def _token_auth_if_available() -> None:
    """Send the token a cluster started with `ray start` expects. Ray >= 2.59 turns token
    authentication on for the clusters it starts, but a driver that joins one sends no
    token unless RAY_AUTH_MODE says so. Ray's own rule for a local start (token mode when a
    token is at hand: RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token) is private
    API and must also refresh Ray's cached config, so it is called rather than copied; a Ray
    without it has no token authentication to turn on."""
    if "RAY_AUTH_MODE" in os.environ:
        return
    try:
        from ray._private.authentication.authentication_token_setup import (
            maybe_enable_token_auth_if_token_available,
        )
    except ImportError:  # pragma: no cover - Ray before 2.59
        return
    maybe_enable_token_auth_if_token_available(warn_if_disabled=False)


def _resolve(address: str) -> str:
    """The `host:port` a driver would join: "auto" is RAY_ADDRESS, else the cluster the last
    `ray start` on this machine wrote down (as Ray reads it)."""
    if address != "auto":
        return address
    if os.environ.get("RAY_ADDRESS"):
        return os.environ["RAY_ADDRESS"]
    try:
        from ray._private.utils import read_ray_address

        found = read_ray_address()
    except ImportError:  # pragma: no cover - a Ray that moved it: Ray's own checks apply
        return address
    return found or address


def _probe(
    address: str, what: str = "join the Ray cluster", start: str = "ray start --head --port {port}"
) -> None:
    """Fail fast on a `host:port` nobody listens on: Ray itself retries it for minutes.
    `what` the error says could not be done, and `start` what starts a server there."""
    if "://" in address:
        return  # a ray:// client address: Ray's own checks apply
    where = urlsplit(f"//{address}")
    try:
        host, port = where.hostname, where.port
    except ValueError:
        host = port = None
    if not host or port is None:
        raise ClusterUnreachable(
            f"--address {address!r} is not host:port (e.g. 127.0.0.1:6379 or [::1]:6379)"
        )
    try:
        with socket.create_connection((host, port), timeout=5):
            pass
    except socket.gaierror as exc:
        raise ClusterUnreachable(
            f"could not {what} at {address}: the host {host!r} does not resolve ({exc})"
        ) from None
    except OSError as exc:
        raise ClusterUnreachable(
            f"could not {what} at {address}: nothing answers there ({exc}). "
            f"Start one (`{start.format(port=port)}`) or check the address"
        ) from None


def cluster_info(how: str) -> dict[str, Any]:
    """Where the job runs, for job.json: how this driver got its Ray (`init_ray`'s answer),
    the cluster's GCS address and its live nodes."""
    listed: list[dict[str, Any]] = ray.nodes()  # type: ignore[no-untyped-call]
    nodes = [n for n in listed if n.get("Alive")]
    return {
        "how": how,
        "address": ray.get_runtime_context().gcs_address,
        "nodes": len(nodes),
        "cpus": sum(float(n.get("Resources", {}).get("CPU", 0.0)) for n in nodes),
    }


def init_ray(address: str | None = None, num_cpus: int | None = None) -> str:
    """Join `address` ("auto": RAY_ADDRESS or the last `ray start` here), or start an
    embedded local Ray: no dashboard, quiet logs. RAY_ADDRESS alone does not make a job
    join a cluster: --address does. Returns what it did: "joined", "embedded", or "already"
    (Ray was initialized in this process before; nothing changed)."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # Ray runs workers at nice 15 by default: any busy process (the simulated provider,
    # the driver) would take the CPU from the forks first.
    os.environ.setdefault("RAY_worker_niceness", "0")
    if ray.is_initialized():
        return "already"
    import logging

    kwargs: dict[str, Any] = {
        "include_dashboard": False,
        "logging_level": logging.WARNING,
        "log_to_driver": False,
        "configure_logging": True,
    }
    if address:
        target = _resolve(address)
        _probe(target)
        _token_auth_if_available()
        try:
            ray.init(address=target, **kwargs)
        except (ConnectionError, RuntimeError, RayError) as exc:
            # RayError: AuthenticationError, a token missing or wrong.
            raise ClusterUnreachable(
                f"could not join the Ray cluster at {target}: {exc}\n"
                f"Check that it runs (`ray status --address {target}`) and, if it uses token "
                "authentication, that its token is in RAY_AUTH_TOKEN, in the file "
                "RAY_AUTH_TOKEN_PATH names, or in ~/.ray/auth_token"
            ) from None
        return "joined"
    # Ray >= 2.59 turns token authentication on for the clusters it starts and says so at
    # every start; car-ray keeps it on, and keeps the notice out of the user's table.
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(
        logging.ERROR
    )
    # "local": always a new instance. Without it, ray.init() joins whatever cluster
    # RAY_ADDRESS or /tmp/ray/ray_current_cluster names (a `ray start` left running), and
    # then refuses num_cpus.
    ray.init(address="local", num_cpus=num_cpus or os.cpu_count() or 2, **kwargs)
    return "embedded"


# Fork seeds whose worker the executor remembers.
_HOMES = 100_000


def _seed_of(item: Item) -> tuple[str, int]:
    """A fork's seed, with its tape: the forks that share their draws where they run on one
    worker."""
    return (item.spec.tape_id, item.spec.seed)


class RayExecutor:
    """A window of fork batches on a pool of `ForkWorker` actors."""

    def __init__(
        self,
        config: WorkerConfig,
        *,
        workers: int = 2,
        batch_size: int = 16,
        per_worker_in_flight: int = 64,
    ) -> None:
        # Each worker gets its share of the provider's limits.
        rpm, tpm = config.requests_per_minute, config.tokens_per_minute
        share = replace(
            config,
            requests_per_minute=rpm / workers if rpm else None,
            tokens_per_minute=tpm / workers if tpm else None,
        )
        # Batches shrink with the window: a batch returns when its slowest fork does, so a
        # worker needs several batches in flight to stay busy (benchmarks/throughput.py:
        # batches of 16 at 16 forks a worker gave 12.6x the sequential scheme, batches of 4
        # gave 18.6x).
        batch_size = max(1, min(batch_size, per_worker_in_flight // 4))
        # A sync agent holds a thread for the whole fork: as many threads as forks in flight.
        share = replace(share, max_threads=max(share.max_threads, per_worker_in_flight))
        actor = ray.remote(ForkWorker).options(
            num_cpus=0,
            max_concurrency=max(4, per_worker_in_flight // batch_size + 4),
            max_restarts=-1,
            # No call runs twice (a fork may have spent before its worker died); and Ray
            # fails a call to a restarting worker at once, unsent, for `wait` to send again.
            max_task_retries=0,
        )
        # Ray's stubs do not type actor handles' remote methods: handles are Any here.
        self.workers: list[Any] = [actor.remote(share) for _ in range(workers)]
        self.batch_size = batch_size
        self._agents = {None, *(a.agent_ref for a in config.more_agents)}
        self._tapes: dict[str, tuple[str | None, Any]] = {}  # (its agent, its object ref)
        self._tape_users: dict[str, int] = {}
        self._pending: dict[Any, tuple[int, list[Item]]] = {}
        self._health = WorkerHealth(self.workers)
        # Batches Ray never sent (their worker was restarting), waiting for a live worker.
        self._parked: list[list[Item]] = []
        self._no_workers: NoWorkers | None = None  # found while rows were being returned
        # The worker each fork seed's first batch went to, by (tape, seed): the oldest go
        # first past _HOMES.
        self._homes: OrderedDict[tuple[str, int], int] = OrderedDict()
        self.lost_batches = 0
        self.rerouted_batches = 0

    def add_tape(self, tape_id: str, raw: bytes, agent: str | None = None) -> None:
        """Hold a tape for forks, run by the config's agent or `agent` (the ref of one of its
        `more_agents`). Each `add_tape` is undone by one `drop_tape`."""
        if agent not in self._agents:
            raise ValueError(f"agent {agent!r} is not one of this pool's ({self._agents})")
        if tape_id not in self._tapes:
            self._tapes[tape_id] = (agent, ray.put(raw))
        self._tape_users[tape_id] = self._tape_users.get(tape_id, 0) + 1

    def drop_tape(self, tape_id: str) -> None:
        """A job that needed the tape has ended (a batch's trace, a sweep's cell): forget
        the tape once none needs it."""
        self._tape_users[tape_id] = self._tape_users.get(tape_id, 1) - 1
        if self._tape_users[tape_id] <= 0:
            self._tapes.pop(tape_id, None)
            del self._tape_users[tape_id]

    def _tapes_of(self, tape_ids: Iterable[str]) -> dict[str, tuple[str | None, Any]]:
        """The object refs of the tapes a call needs (not every tape a batch holds)."""
        return {t: self._tapes[t] for t in set(tape_ids)}

    def verify(self, tape_id: str) -> Verified:
        tapes = self._tapes_of([tape_id])
        result: dict[str, Any] = ray.get(self.workers[0].verify.remote(tapes, tape_id))
        if "user_code_error" in result:
            raise UserCodeError(**result["user_code_error"])
        if result["ok"]:
            return {"ok": True, "recorded_outcome": result["recorded_outcome"]}
        return {"ok": False, "divergence": result["divergence"]}

    def worker_pids(self) -> list[int]:
        return [int(p) for p in ray.get([w.pid.remote() for w in self.workers])]

    @property
    def in_flight(self) -> int:
        return sum(len(items) for _, items in self._pending.values()) + sum(
            len(items) for items in self._parked
        )

    def in_flight_by_worker(self) -> list[int]:
        """Forks sent to each worker (in `workers` order) and not yet answered."""
        load = [0] * len(self.workers)
        for index, items in self._pending.values():
            load[index] += len(items)
        return load

    def submit(self, items: Sequence[Item]) -> None:
        """Hand forks to the workers in batches, each to the live worker with the least work,
        or to the worker that ran forks of the same seed while it has at most a batch more:
        a worker shares a seed's draws among the forks it runs (`replay.SharedDraws`). The
        forks of one seed go in one batch where they can."""
        items = sorted(items, key=_seed_of)
        self._send(
            [
                list(items[start : start + self.batch_size])
                for start in range(0, len(items), self.batch_size)
            ]
        )

    def _send(self, batches: list[list[Item]]) -> None:
        load = self.in_flight_by_worker()
        for batch in batches:
            homes = Counter(self._homes[s] for s in map(_seed_of, batch) if s in self._homes)
            prefer = homes.most_common(1)[0][0] if homes else None
            index = self._health.pick(load, prefer, slack=self.batch_size)
            if index is None:  # every worker is restarting: the batch waits for one
                self._parked.append(batch)
                continue
            for seed in map(_seed_of, batch):
                if seed not in self._homes:
                    self._homes[seed] = index
                    if len(self._homes) > _HOMES:
                        self._homes.popitem(last=False)
            load[index] += len(batch)
            payload = [
                (i.spec.model_dump_json(), i.stage, i.attempt, i.limit.model_dump_json(), i.job_id)
                for i in batch
            ]
            tapes = self._tapes_of(i.spec.tape_id for i in batch)
            ref = self.workers[index].run_batch.remote(tapes, payload)
            self._pending[ref] = (index, batch)

    def wait(self, timeout_s: float = 0.5) -> Iterable[list[Row] | BatchLost]:
        """Finished batches: their rows, or `BatchLost` for a batch whose worker died while it
        may have been running. A batch that Ray never sent (its worker was restarting) goes
        to a live worker instead, unseen: nothing of it ran."""
        if self._no_workers is not None:
            raise self._no_workers
        pings = self._health.pings()
        waiting = [*self._pending, *pings]
        if not waiting:
            if self._parked:  # every worker is down and the next ping is not due yet
                time.sleep(min(timeout_s, self._health.next_ping_s()))
            return []
        ready, _ = ray.wait(waiting, num_returns=1, timeout=timeout_s)
        # Take everything else that is already done too, without waiting.
        if ready:
            more, _ = ray.wait(
                [r for r in waiting if r not in ready],
                num_returns=len(waiting) - len(ready),
                timeout=0,
            )
            ready = ready + more
        out: list[list[Row] | BatchLost] = []
        # Batches first: their rows are paid for and must reach the caller even when a ping
        # below finds the last worker dead (NoWorkers is then raised at the next wait).
        for ref in [r for r in ready if r in self._pending] + [
            r for r in ready if r not in self._pending
        ]:
            if ref not in self._pending:
                try:
                    self._health.answered(ref)
                except NoWorkers as exc:
                    if not out:
                        raise
                    self._no_workers = exc
                continue
            index, batch = self._pending.pop(ref)
            try:
                out.append(ray.get(ref))
            except RayActorError as exc:
                self._health.failed(index, exc)
                if never_sent(exc):
                    self.rerouted_batches += 1
                    log.info("batch_rerouted", forks=len(batch), worker=index)
                    self._parked.append(batch)
                    continue
                self.lost_batches += 1
                log.warning("batch_lost", forks=len(batch), error=type(exc).__name__)
                out.append(BatchLost(batch, exc))
        if self._parked:
            parked, self._parked = self._parked, []
            self._send(parked)
        return out

    def shutdown(self) -> None:
        for worker in self.workers:
            ray.kill(worker)
        self.workers = []
        self._pending.clear()
        self._parked.clear()
