"""Forks per second and CPU per fork: car-ray's Ray executor, one asyncio process, one at a time.

Resample forks of the demo tape (jobs/support_refund, step 2, live tail of 1-3 calls) run
against the simulated provider (its own process) at 0 ms (pure overhead), 50 ms and 500 ms of
simulated latency per model call, with 1, 8, 32, 128 and 512 forks in flight, three ways:

  (a) ray         car-ray's executor: `RayExecutor` on an embedded local Ray, forks handed to
                  `ForkWorker` actors in batches, the driver keeping the window full with
                  `submit` / `wait` (a fresh executor per cell, warmed up off the clock);
  (b) asyncio     the same forks in this process: `ForkRunner.run` with W lanes on one loop;
  (c) sequential  one fork after another in this process (what the existing tools do); the
                  window does not apply, so it runs once per latency and repeat.

All three run on the same kind of event loop (uvloop where installed: Ray's workers pick
it up by themselves, (b) and (c) through car_ray._aio). Every cell is measured --repeats
times (3), the schemes taking turns within a repeat; the table shows each cell's median and
range, and a target holds when the median of its per-repeat ratios ((a) over (c) of the same
repeat) does. Each cell streams forks: the window is filled, the first W completions (at
least 2) are a warm-up, and the clock runs from there over the next N completions while the
window stays full (N a whole number of windows, about 3 s of work, 1 s with --quick); forks
still in flight then are drained ((b)) or dropped with their workers ((a)) off the clock. CPU
per fork is the CPU of the processes that run forks: this process, plus for (a) the Ray
workers, read as utime + stime from /proc/<pid>/stat (every thread of the process). Ray's own
daemons (raylet, GCS, ...) and the simulated provider are shown apart, as is the CPU that
other processes on the machine used meanwhile (from /proc/stat): a busy machine depresses
every figure.

    .venv/bin/python benchmarks/throughput.py [--quick] [--out benchmarks/results]

(a) runs as `car-ray attribute` does by default (2 workers, per_worker_in_flight = W / 2,
batches of at most 16 that `RayExecutor` shrinks to a quarter of a worker's share) unless
--workers, --batch-size (a number, or `auto`) or --per-worker-in-flight say otherwise. On a
shared machine, --settle-s waits for quiet before each cell; --worker-niceness changes the nice
value of Ray's workers (car-ray's `init_ray` sets 0; Ray's own default is 15).

Prints a table, the issue's targets as PASS / FAIL lines and where the provider or other
processes limited a cell, and writes `throughput.parquet` and `throughput.csv` to `--out`.
Exits 1 only if a fork ended other than "ok" (a missed target is reported, not an error).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from statistics import median
from typing import Any, Literal

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
from _common import (
    DEFAULT_OUT,
    DEFAULT_STEP,
    JOB_FILE,
    ROOT,
    descendants,
    fork_specs,
    machine,
    machine_busy_cpu_s,
    make_console,
    not_all_ok,
    process_cpu_s,
    record_demo_tape,
    sim_pid,
    total_cpu_s,
    wait_exited,
    warn_if_loaded,
)
from rich.console import Console
from rich.table import Table

from car_ray._aio import run as run_loop
from car_ray.execute import BatchLost, Item, RayExecutor, WorkerConfig, init_ray
from car_ray.job import Job, load_job
from car_ray.replay import AiohttpUpstream, BaseUrls, ForkRunner, ForkSpec
from car_ray.sim import SimProcess
from car_ray.tape import Tape

Scheme = Literal["ray", "asyncio", "sequential"]
LABELS: dict[Scheme, str] = {
    "ray": "(a) ray",
    "asyncio": "(b) asyncio",
    "sequential": "(c) sequential",
}
LATENCIES_MS = (0.0, 50.0, 500.0)
WINDOWS = (1, 8, 32, 128, 512)
# A window of 512 costs three waves of 512 forks a cell (warm-up, clock, drain): --quick
# leaves it out unless --windows asks for it.
QUICK_WINDOWS = (1, 8, 32, 128)
# ForkRunner's and WorkerConfig's default agent thread pools: a sync agent holds a thread for
# its whole run, so a pool smaller than the window would silently shrink the window.
RUNNER_THREADS = 256
WORKER_THREADS = 128
# Ray starts its workers at nice 15 unless this says otherwise (Ray's config, lower case).
WORKER_NICENESS_ENV = "RAY_worker_niceness"
# With --batch-size auto: batches in flight per worker, so one straggler does not idle it.
BATCHES_PER_WORKER = 4


@dataclass(frozen=True)
class Target:
    """One of the issue's acceptance lines: (a) over (c) at one latency and window."""

    latency_ms: float
    in_flight: int
    at_least: float


TARGETS_OVER_SEQUENTIAL = (Target(500.0, 128, 80.0), Target(50.0, 32, 15.0))
# At every window, Ray's overhead may cost at most a third of one process's throughput.
RAY_OVER_ASYNCIO_AT_LEAST = 2 / 3
# A provider busier than this (cores) is close to the one core uvicorn can use.
PROVIDER_BOUND_CORES = 0.8
# Other processes' CPU (cores) above which a cell's figures are marked as disturbed.
DISTURBED_CORES = 0.25
# With --settle-s, a cell starts once the whole machine uses less than this (cores).
QUIET_CORES = 0.15


@dataclass(frozen=True)
class RaySettings:
    """How (a) is configured. `per_worker_in_flight` None: the window split evenly over the
    workers; `batch_size` None: small enough that each worker has at least
    `BATCHES_PER_WORKER` batches in flight (at most 16 forks a batch)."""

    workers: int = 2
    batch_size: int | None = 16
    per_worker_in_flight: int | None = None

    def in_flight_per_worker(self, window: int) -> int:
        if self.per_worker_in_flight is not None:
            return self.per_worker_in_flight
        return max(1, window // self.workers)

    def batch_for(self, window: int) -> int:
        if self.batch_size is not None:
            return self.batch_size
        return max(1, min(16, self.in_flight_per_worker(window) // BATCHES_PER_WORKER))

    @property
    def label(self) -> str:
        batches = "auto" if self.batch_size is None else str(self.batch_size)
        return f"{self.workers} workers, batch size {batches}"

    def threads_per_worker(self, window: int) -> int:
        return max(WORKER_THREADS, math.ceil(window / self.workers))


@dataclass(frozen=True)
class Usage:
    """CPU seconds per group of processes and the provider's request count, at one instant."""

    at_s: float
    driver_cpu_s: float
    workers_cpu_s: float
    ray_system_cpu_s: dict[int, float]
    provider_cpu_s: float | None
    machine_busy_s: float | None
    provider_requests: int


class Meter:
    """Reads `Usage`: this process, the given workers, Ray's other processes, the provider."""

    def __init__(self, sim: SimProcess, workers: Sequence[int] = ()) -> None:
        self.sim = sim
        self.provider_pid = sim_pid(sim)
        self.workers = tuple(workers)
        self._ours = {*self.workers, *([self.provider_pid] if self.provider_pid else [])}

    def read(self) -> Usage:
        provider = None if self.provider_pid is None else process_cpu_s(self.provider_pid)
        # Everything else under this process is Ray's: raylet, GCS, agents, idle workers, and
        # the last cell's workers on their way out. Read afresh: they come and go.
        system = {
            pid: cpu
            for pid in descendants(os.getpid()) - self._ours
            if (cpu := process_cpu_s(pid)) is not None
        }
        return Usage(
            at_s=time.perf_counter(),
            driver_cpu_s=time.process_time(),
            workers_cpu_s=total_cpu_s(self.workers),
            ray_system_cpu_s=system,
            provider_cpu_s=provider,
            machine_busy_s=machine_busy_cpu_s(),
            provider_requests=self.sim.requests_served,
        )


@dataclass
class Forks:
    """What the measured forks did: statuses, live tail calls and flips."""

    statuses: Counter[str] = field(default_factory=Counter)
    tail_calls: int = 0
    flipped: int = 0

    def add(self, status: str, tail_calls: int, flipped: bool | None) -> None:
        self.statuses[status] += 1
        self.tail_calls += tail_calls
        self.flipped += bool(flipped)

    @property
    def count(self) -> int:
        return sum(self.statuses.values())


@dataclass(frozen=True)
class Cell:
    """One measurement: `forks` forks of one scheme at one latency with `in_flight` kept busy."""

    scheme: Scheme
    latency_ms: float
    in_flight: int
    forks: int
    warm_forks: int
    wall_s: float
    driver_cpu_s: float
    workers_cpu_s: float
    ray_system_cpu_s: float
    provider_cpu_s: float | None
    machine_busy_s: float | None
    provider_requests: int
    tail_calls: int
    not_ok: int
    statuses: dict[str, int]
    flipped: int
    max_threads: int
    ray_workers: int | None = None
    batch_size: int | None = None
    per_worker_in_flight: int | None = None
    repeat: int = 0

    @classmethod
    def between(
        cls,
        start: Usage,
        end: Usage,
        forks: Forks,
        *,
        scheme: Scheme,
        latency_ms: float,
        in_flight: int,
        warm_forks: int,
        max_threads: int,
        ray: tuple[RaySettings, int] | None = None,
        repeat: int = 0,
    ) -> Cell:
        def delta(a: float | None, b: float | None) -> float | None:
            return None if a is None or b is None else b - a

        return cls(
            scheme=scheme,
            latency_ms=latency_ms,
            in_flight=in_flight,
            forks=forks.count,
            warm_forks=warm_forks,
            wall_s=end.at_s - start.at_s,
            driver_cpu_s=end.driver_cpu_s - start.driver_cpu_s,
            workers_cpu_s=end.workers_cpu_s - start.workers_cpu_s,
            # A process born in between counts from 0; one that died is lost (it was idle).
            ray_system_cpu_s=sum(
                cpu - start.ray_system_cpu_s.get(pid, 0.0)
                for pid, cpu in end.ray_system_cpu_s.items()
            ),
            provider_cpu_s=delta(start.provider_cpu_s, end.provider_cpu_s),
            machine_busy_s=delta(start.machine_busy_s, end.machine_busy_s),
            provider_requests=end.provider_requests - start.provider_requests,
            tail_calls=forks.tail_calls,
            not_ok=forks.count - forks.statuses.get("ok", 0),
            statuses=dict(forks.statuses),
            flipped=forks.flipped,
            max_threads=max_threads,
            ray_workers=None if ray is None else ray[0].workers,
            batch_size=None if ray is None else ray[0].batch_for(in_flight),
            per_worker_in_flight=None if ray is None else ray[1],
            repeat=repeat,
        )

    @property
    def forks_per_s(self) -> float:
        return self.forks / self.wall_s

    @property
    def cpu_s(self) -> float:
        """The CPU of the processes that run forks: this one, plus Ray's workers for (a)."""
        return self.driver_cpu_s + self.workers_cpu_s

    @property
    def cpu_ms_per_fork(self) -> float:
        return 1000 * self.cpu_s / self.forks

    @property
    def ray_system_ms_per_fork(self) -> float:
        return 1000 * self.ray_system_cpu_s / self.forks

    @property
    def provider_cpu_ms_per_fork(self) -> float | None:
        return None if self.provider_cpu_s is None else 1000 * self.provider_cpu_s / self.forks

    @property
    def provider_busy_cores(self) -> float | None:
        return None if self.provider_cpu_s is None else self.provider_cpu_s / self.wall_s

    @property
    def provider_requests_per_s(self) -> float:
        return self.provider_requests / self.wall_s

    @property
    def tail_calls_per_fork(self) -> float:
        return self.tail_calls / self.forks

    @property
    def tail_calls_per_s(self) -> float:
        return self.tail_calls / self.wall_s

    @property
    def other_cpu_cores(self) -> float | None:
        """CPU that processes outside this benchmark used during the cell (cores)."""
        if self.machine_busy_s is None:
            return None
        ours = self.cpu_s + self.ray_system_cpu_s + (self.provider_cpu_s or 0.0)
        return max(0.0, self.machine_busy_s - ours) / self.wall_s


def fork_count(rate_per_s: float, window: int, target_s: float) -> int:
    """Measured forks: about `target_s` of work at the warm-up's rate, in whole windows.

    A window's forks start together and, latency-bound, end together too: completions come in
    waves. The warm-up is one wave, so the clock starts at a wave's end; a whole number of
    windows ends it at a wave's end as well (ending inside a wave would count its time but
    not its forks)."""
    wanted = max(4, math.ceil(rate_per_s * target_s))
    return window * math.ceil(wanted / window)


def warm_count(window: int) -> int:
    return max(2, window)


@dataclass
class Run:
    """What every cell of one latency shares."""

    job: Job
    sim: SimProcess
    base_urls: BaseUrls
    tape: Tape
    raw: bytes
    step: int
    latency_ms: float
    target_s: float
    settle_s: float
    console: Console


def settle(run: Run) -> None:
    """With --settle-s, wait (up to that long) until the machine is quiet before a cell."""
    deadline = time.monotonic() + run.settle_s
    while time.monotonic() < deadline:
        before = machine_busy_cpu_s()
        time.sleep(0.5)
        after = machine_busy_cpu_s()
        if before is None or after is None or (after - before) / 0.5 < QUIET_CORES:
            return
    if run.settle_s:
        run.console.print(f"[yellow]the machine stayed busy for {run.settle_s:g} s; measuring")


async def stream_local(
    runner: ForkRunner,
    meter: Meter,
    forks: Iterator[ForkSpec],
    *,
    window: int,
    target_s: float,
) -> tuple[Usage, Usage, Forks]:
    """Keep `window` forks in flight on this loop; measure between two completion counts."""
    warm = warm_count(window)
    limit: int | None = None
    done = 0
    measured = Forks()
    started = time.perf_counter()
    marks: list[Usage] = []

    async def lane() -> None:
        nonlocal done, limit
        # Every lane takes the next fork as soon as its last ends, until the last measured
        # fork has ended: the window stays full up to the second mark.
        while limit is None or done < limit:
            row = await runner.run(next(forks))
            done += 1
            if done == warm:
                rate = warm / (time.perf_counter() - started)
                limit = warm + fork_count(rate, window, target_s)
                marks.append(meter.read())
            elif limit is not None and done <= limit:
                measured.add(row.status, row.tail_calls, row.flipped)
                if done == limit:
                    marks.append(meter.read())

    await asyncio.gather(*(lane() for _ in range(window)))
    return marks[0], marks[1], measured


def stream_ray(
    executor: RayExecutor,
    meter: Meter,
    forks: Iterator[ForkSpec],
    *,
    window: int,
    target_s: float,
) -> tuple[Usage, Usage, Forks]:
    """Keep `window` forks in flight on the executor; measure between two completion counts.

    The executor hands back whole batches, so the marks fall on the first batch boundary at or
    past each count, and the forks measured are exactly those finished between the marks."""

    def items(n: int) -> list[Item]:
        return [Item(next(forks), stage="bench") for _ in range(n)]

    warm = warm_count(window)
    limit: int | None = None
    done = 0
    measured = Forks()
    start: Usage | None = None
    started = time.perf_counter()
    executor.submit(items(window))
    while True:
        finished = Forks()
        for result in executor.wait(0.5):
            if isinstance(result, BatchLost):
                for _ in result.items:
                    finished.add("lost", 0, None)
                continue
            for row in result:
                finished.add(str(row["status"]), int(row["tail_calls"]), row["flipped"])
        done += finished.count
        if limit is None:
            if done >= warm:
                rate = done / (time.perf_counter() - started)
                limit = done + fork_count(rate, window, target_s)
                start = meter.read()
        else:
            measured.statuses.update(finished.statuses)
            measured.tail_calls += finished.tail_calls
            measured.flipped += finished.flipped
            if done >= limit:
                assert start is not None
                return start, meter.read(), measured
        executor.submit(items(window - executor.in_flight))


def ray_executor(run: Run, settings: RaySettings, window: int) -> tuple[RayExecutor, int]:
    """A fresh executor sized for `window`, its workers up and warm; and its per-worker share."""
    job, tape = run.job, run.tape
    per_worker = settings.in_flight_per_worker(window)
    executor = RayExecutor(
        WorkerConfig(
            agent_ref=job.spec.agent,
            scorer_ref=job.spec.scorer,
            search_path=tuple(str(p) for p in job.search_path),
            base_urls=run.base_urls.as_dict(),
            max_threads=settings.threads_per_worker(window),
        ),
        workers=settings.workers,
        batch_size=settings.batch_for(window),
        per_worker_in_flight=per_worker,
    )
    executor.add_tape(tape.tape_id, run.raw)
    executor.worker_pids()
    # Two one-fork batches per worker (batches go round robin): the tape reaches every
    # worker's cache and the lazy imports happen before the clock starts.
    for spec in fork_specs(tape.tape_id, run.step, 2 * settings.workers):
        executor.submit([Item(spec, stage="warm")])
    while executor.in_flight:
        executor.wait(1.0)
    return executor, per_worker


def report(console: Console, cell: Cell) -> None:
    console.print(
        f"#{cell.repeat + 1} {LABELS[cell.scheme]:>15} {cell.latency_ms:>4g} ms  "
        f"W={cell.in_flight:<3} "
        f"{cell.forks:>5} forks {cell.wall_s:6.2f} s {cell.forks_per_s:7.1f} forks/s "
        f"{cell.cpu_ms_per_fork:6.2f} CPU ms/fork  not ok {cell.not_ok}",
        highlight=False,
    )


async def bench_latency(
    run: Run,
    windows: Sequence[int],
    schemes: Sequence[Scheme],
    ray: RaySettings,
    repeats: int,
) -> list[Cell]:
    """Every scheme and window at one latency, `repeats` times over; (c), (b) and (a) take
    turns within each repeat, so that a change in the machine's speed or other load falls on
    the schemes a ratio compares alike."""
    cells: list[Cell] = []
    threads = max(RUNNER_THREADS, *windows)
    runner = ForkRunner(
        run.job.load("agent"),
        run.job.load("scorer"),
        base_urls=run.base_urls,
        upstream=AiohttpUpstream(),
        max_threads=threads,
    )
    meter = Meter(run.sim)

    async def local_cell(scheme: Scheme, window: int, repeat: int) -> Cell:
        settle(run)
        start, end, measured = await stream_local(
            runner,
            meter,
            fork_specs(run.tape.tape_id, run.step),
            window=window,
            target_s=run.target_s,
        )
        return Cell.between(
            start,
            end,
            measured,
            scheme=scheme,
            latency_ms=run.latency_ms,
            in_flight=window,
            warm_forks=warm_count(window),
            max_threads=threads,
            repeat=repeat,
        )

    try:
        runner.add_tape(run.tape)
        for repeat in range(repeats):
            if "sequential" in schemes:
                cells.append(await local_cell("sequential", 1, repeat))
                report(run.console, cells[-1])
            for window in windows:
                if "asyncio" in schemes:
                    cells.append(await local_cell("asyncio", window, repeat))
                    report(run.console, cells[-1])
                if "ray" in schemes:
                    # Blocking calls on this loop are fine: nothing else runs on it meanwhile.
                    cells.append(bench_ray_cell(run, window, ray, repeat))
                    report(run.console, cells[-1])
    finally:
        await runner.aclose()
    return cells


def bench_ray_cell(run: Run, window: int, settings: RaySettings, repeat: int) -> Cell:
    executor, per_worker = ray_executor(run, settings, window)
    pids = executor.worker_pids()
    try:
        meter = Meter(run.sim, pids)
        settle(run)
        start, end, measured = stream_ray(
            executor,
            meter,
            fork_specs(run.tape.tape_id, run.step),
            window=window,
            target_s=run.target_s,
        )
    finally:
        # The forks still in flight are dropped with their workers, off the clock; the next
        # cell starts once they are gone, so their exit does not load it.
        executor.shutdown()
        wait_exited(pids)
    return Cell.between(
        start,
        end,
        measured,
        scheme="ray",
        latency_ms=run.latency_ms,
        in_flight=window,
        warm_forks=warm_count(window),
        max_threads=settings.threads_per_worker(window),
        ray=(settings, per_worker),
        repeat=repeat,
    )


def find(
    cells: Sequence[Cell],
    scheme: Scheme,
    latency_ms: float,
    window: int | None = None,
    repeat: int | None = None,
) -> Cell | None:
    for c in cells:
        if (
            (c.scheme, c.latency_ms) == (scheme, latency_ms)
            and window in (None, c.in_flight)
            and repeat in (None, c.repeat)
        ):
            return c
    return None


def over_sequential(cells: Sequence[Cell], cell: Cell) -> float | None:
    """(a)'s forks/s over (c)'s at the same latency in the same repeat (the window does not
    apply to (c))."""
    base = find(cells, "sequential", cell.latency_ms, repeat=cell.repeat)
    return None if base is None or cell.scheme != "ray" else cell.forks_per_s / base.forks_per_s


def over_asyncio(cells: Sequence[Cell], cell: Cell) -> float | None:
    """(a)'s forks/s over (b)'s at the same latency and window in the same repeat."""
    base = find(cells, "asyncio", cell.latency_ms, cell.in_flight, cell.repeat)
    return None if base is None or cell.scheme != "ray" else cell.forks_per_s / base.forks_per_s


def fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


@dataclass(frozen=True)
class Group:
    """The repeats of one scheme at one latency and window: the table shows their median
    cell (by forks/s; the lower middle one for an even count) and the spread."""

    cells: tuple[Cell, ...]

    @property
    def middle(self) -> Cell:
        ranked = sorted(self.cells, key=lambda c: c.forks_per_s)
        return ranked[(len(ranked) - 1) // 2]

    def ratios(
        self, all_cells: Sequence[Cell], over: Callable[[Sequence[Cell], Cell], float | None]
    ) -> list[float]:
        return [r for c in self.cells if (r := over(all_cells, c)) is not None]


def spread(values: Sequence[float], spec: str, suffix: str = "") -> str:
    """`median (min-max)` of per-repeat values; the value alone for one repeat."""
    if not values:
        return "-"
    mid = f"{median(values):{spec}}{suffix}"
    if len(values) == 1:
        return mid
    return f"{mid} ({min(values):{spec}}-{max(values):{spec}})"


def groups(cells: Sequence[Cell]) -> list[Group]:
    order: dict[Scheme, int] = {"sequential": 0, "asyncio": 1, "ray": 2}
    by_key: dict[tuple[float, int, int], list[Cell]] = {}
    for c in cells:
        by_key.setdefault((c.latency_ms, c.in_flight, order[c.scheme]), []).append(c)
    return [Group(tuple(by_key[key])) for key in sorted(by_key)]


def table(cells: Sequence[Cell], step: int, ray: RaySettings) -> Table:
    repeats = max((c.repeat for c in cells), default=0) + 1
    out = Table(
        title=(
            f"Resample forks of the demo tape (step {step}, live tail): (a) Ray executor "
            f"({ray.label}), (b) one asyncio process, (c) one fork at a time; "
            f"median of {repeats} repeat(s) (min-max)"
        )
    )
    headers = (
        "scheme",
        "latency ms",
        "in flight",
        "forks",
        "wall s",
        "forks/s",
        "CPU ms/fork",
        "(a)/(c)",
        "(a)/(b)",
        "tail calls/fork",
        "Ray daemons ms/fork",
        "provider ms/fork",
        "provider req/s",
        "other load cores",
        "not ok",
    )
    for header in headers:
        out.add_column(header, justify="left" if header == "scheme" else "right")
    for group in groups(cells):
        c = group.middle
        other = max(
            (x.other_cpu_cores for x in group.cells if x.other_cpu_cores is not None),
            default=None,
        )
        not_ok = sum(x.not_ok for x in group.cells)
        out.add_row(
            LABELS[c.scheme],
            f"{c.latency_ms:g}",
            "1 (any)" if c.scheme == "sequential" else str(c.in_flight),
            str(c.forks),
            f"{c.wall_s:.2f}",
            spread([x.forks_per_s for x in group.cells], ".1f"),
            spread([x.cpu_ms_per_fork for x in group.cells], ".2f"),
            spread(group.ratios(cells, over_sequential), ".1f", "x"),
            spread(group.ratios(cells, over_asyncio), ".2f", "x"),
            f"{c.tail_calls_per_fork:.2f}",
            f"{c.ray_system_ms_per_fork:.2f}" if c.scheme == "ray" else "",
            fmt(c.provider_cpu_ms_per_fork, ".2f"),
            f"{c.provider_requests_per_s:.0f}",
            fmt(other, ".2f")
            if other is None or other < DISTURBED_CORES
            else f"[yellow]{other:.2f}",
            str(not_ok) if not_ok == 0 else f"[bold red]{not_ok}[/]",
        )
    return out


@dataclass(frozen=True)
class Verdict:
    passed: bool
    line: str


def verdicts(cells: Sequence[Cell]) -> list[Verdict]:
    """The issue's targets on the median of the repeats' side-by-side ratios; every
    repeat's ratio is printed with it."""
    out: list[Verdict] = []
    for t in TARGETS_OVER_SEQUENTIAL:
        what = f"(a) >= {t.at_least:g}x (c) at {t.latency_ms:g} ms, window {t.in_flight}"
        measured = [
            c
            for c in cells
            if (c.scheme, c.latency_ms, c.in_flight) == ("ray", t.latency_ms, t.in_flight)
        ]
        ratios = [r for c in measured if (r := over_sequential(cells, c)) is not None]
        if not ratios:
            out.append(Verdict(False, f"{what}: not measured in this run"))
            continue
        each = ", ".join(f"{r:.1f}x" for r in ratios)
        below = sum(r < t.at_least for r in ratios)
        out.append(
            Verdict(
                median(ratios) >= t.at_least,
                f"{what}: median {median(ratios):.1f}x over {len(ratios)} repeat(s) ({each}; "
                f"{below} below target)",
            )
        )
    for latency_ms in sorted({c.latency_ms for c in cells}):
        at = [g for g in groups(cells) if g.middle.latency_ms == latency_ms]
        pairs = [
            (g.middle.in_flight, median(rs)) for g in at if (rs := g.ratios(cells, over_asyncio))
        ]
        what = f"(a) >= 2/3 of (b) at every window, {latency_ms:g} ms (median of repeats)"
        if not pairs:
            continue
        low = [f"W={w} {r:.2f}" for w, r in pairs if r < RAY_OVER_ASYNCIO_AT_LEAST]
        worst_window, worst_ratio = min(pairs, key=lambda p: p[1])
        detail = (
            f"below at {', '.join(low)}" if low else f"lowest {worst_ratio:.2f} at W={worst_window}"
        )
        out.append(Verdict(not low, f"{what}: {detail}"))
    return out


def bottlenecks(cells: Sequence[Cell]) -> list[str]:
    """Where the simulated provider or other processes, not the scheme, may have set the pace."""
    notes: list[str] = []
    busiest = max(
        (c for c in cells if c.provider_busy_cores is not None),
        key=lambda c: c.provider_busy_cores or 0.0,
        default=None,
    )
    if busiest is not None and busiest.provider_cpu_s:
        # uvicorn serves on one thread: one core is all the provider can ever use.
        capacity = busiest.provider_requests / busiest.provider_cpu_s
        verdict = (
            "it set the pace there"
            if (busiest.provider_busy_cores or 0.0) >= PROVIDER_BOUND_CORES
            else f"it ran at {busiest.provider_requests_per_s / capacity:.0%} of that and "
            "limited no cell"
        )
        notes.append(
            f"provider: about {capacity:.0f} req/s per CPU second on its one core; its busiest "
            f"cell, {LABELS[busiest.scheme]} {busiest.latency_ms:g} ms W={busiest.in_flight}, "
            f"asked {busiest.provider_requests_per_s:.0f} req/s (the measured forks' tail "
            f"calls: {busiest.tail_calls_per_s:.0f}/s): {verdict}"
        )
    for c in cells:
        busy = c.provider_busy_cores
        if busy is not None and busy >= PROVIDER_BOUND_CORES:
            notes.append(
                f"[yellow]provider-bound: {LABELS[c.scheme]} {c.latency_ms:g} ms "
                f"W={c.in_flight}: the provider used {busy:.2f} cores for "
                f"{c.provider_requests_per_s:.0f} req/s; this cell measures the provider"
            )
    disturbed = [
        f"{LABELS[c.scheme]} {c.latency_ms:g} ms W={c.in_flight} ({c.other_cpu_cores:.2f})"
        for c in cells
        if c.other_cpu_cores is not None and c.other_cpu_cores >= DISTURBED_CORES
    ]
    if disturbed:
        notes.append(
            "[yellow]other processes used CPU (cores) during: " + ", ".join(disturbed) + "[/]"
        )
    return notes


SCHEMA = pa.schema(
    [
        pa.field("scheme", pa.string(), nullable=False),
        pa.field("latency_ms", pa.float64(), nullable=False),
        pa.field("in_flight", pa.int32(), nullable=False),
        pa.field("forks", pa.int32(), nullable=False),
        pa.field("warm_forks", pa.int32(), nullable=False),
        pa.field("wall_s", pa.float64(), nullable=False),
        pa.field("forks_per_s", pa.float64(), nullable=False),
        pa.field("cpu_s", pa.float64(), nullable=False),
        pa.field("cpu_ms_per_fork", pa.float64(), nullable=False),
        pa.field("driver_cpu_s", pa.float64(), nullable=False),
        pa.field("workers_cpu_s", pa.float64(), nullable=False),
        pa.field("ray_system_cpu_s", pa.float64(), nullable=False),
        pa.field("provider_cpu_s", pa.float64()),
        pa.field("provider_cpu_ms_per_fork", pa.float64()),
        pa.field("provider_busy_cores", pa.float64()),
        pa.field("provider_requests", pa.int64(), nullable=False),
        pa.field("provider_requests_per_s", pa.float64(), nullable=False),
        pa.field("tail_calls", pa.int64(), nullable=False),
        pa.field("tail_calls_per_fork", pa.float64(), nullable=False),
        pa.field("other_cpu_cores", pa.float64()),
        pa.field("not_ok", pa.int32(), nullable=False),
        pa.field("statuses", pa.string(), nullable=False),
        pa.field("flipped", pa.int32(), nullable=False),
        pa.field("max_threads", pa.int32(), nullable=False),
        pa.field("ray_workers", pa.int32()),
        pa.field("batch_size", pa.int32()),
        pa.field("per_worker_in_flight", pa.int32()),
        pa.field("repeat", pa.int32(), nullable=False),
        pa.field("a_over_c", pa.float64()),
        pa.field("a_over_b", pa.float64()),
        # The run and the machine, on every row so that each row stands alone.
        pa.field("created", pa.string(), nullable=False),
        pa.field("quick", pa.bool_(), nullable=False),
        pa.field("step", pa.int32(), nullable=False),
        pa.field("cpu_count", pa.int32()),
        pa.field("python", pa.string(), nullable=False),
        pa.field("platform", pa.string(), nullable=False),
        pa.field("ray_version", pa.string(), nullable=False),
        pa.field("load_average_1m_before", pa.float64()),
    ]
)


def write_results(
    out: Path, cells: Sequence[Cell], config: dict[str, Any], facts: dict[str, Any]
) -> tuple[Path, Path]:
    """`throughput.parquet` (explicit schema, the run and machine also in its metadata) and
    the same rows as `throughput.csv`."""
    out.mkdir(parents=True, exist_ok=True)
    run_columns = {
        "created": config["created"],
        "quick": config["quick"],
        "step": config["step"],
        "cpu_count": facts["cpu_count"],
        "python": facts["python"],
        "platform": facts["platform"],
        "ray_version": facts["versions"].get("ray", "unknown"),
        "load_average_1m_before": config["load_average_1m_before"],
    }
    rows: list[dict[str, Any]] = []
    for c in cells:
        row = {name: value for name, value in asdict(c).items() if name in SCHEMA.names}
        row["statuses"] = json.dumps(c.statuses, sort_keys=True)
        for name in (
            "forks_per_s",
            "cpu_s",
            "cpu_ms_per_fork",
            "provider_cpu_ms_per_fork",
            "provider_busy_cores",
            "provider_requests_per_s",
            "tail_calls_per_fork",
            "other_cpu_cores",
        ):
            row[name] = getattr(c, name)
        row["a_over_c"] = over_sequential(cells, c)
        row["a_over_b"] = over_asyncio(cells, c)
        rows.append({**row, **run_columns})
    metadata = {
        "benchmark": "throughput",
        "config": json.dumps(config),
        "machine": json.dumps(facts),
    }
    arrow = pa.Table.from_pylist(rows, schema=SCHEMA.with_metadata(metadata))
    parquet_path = out / "throughput.parquet"
    pq.write_table(arrow, parquet_path)
    csv_path = out / "throughput.csv"
    pa_csv.write_csv(arrow, csv_path)
    return parquet_path, csv_path


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("at least 1")
    return value


def batch_size(text: str) -> int | None:
    if text == "auto":
        return None
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("a batch holds at least one fork")
    return value


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="~1 s per cell instead of ~3 s, windows up to 128 (with 3 repeats: ~7 min "
        "instead of ~18)",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder for the results")
    parser.add_argument(
        "--repeats",
        type=positive,
        default=3,
        help="measure every cell this many times, schemes taking turns; the table and the "
        "targets use the median (default 3)",
    )
    parser.add_argument(
        "--step", type=int, default=DEFAULT_STEP, help="the step to resample (default 2)"
    )
    parser.add_argument(
        "--latencies-ms", type=float, nargs="+", default=list(LATENCIES_MS), metavar="MS"
    )
    parser.add_argument(
        "--windows",
        type=int,
        nargs="+",
        default=None,
        metavar="W",
        help=f"forks in flight (default {' '.join(map(str, WINDOWS))})",
    )
    parser.add_argument(
        "--schemes",
        nargs="+",
        choices=list(LABELS),
        default=list(LABELS),
        metavar="NAME",
        help="ray, asyncio, sequential (default: all three)",
    )
    parser.add_argument("--workers", type=int, default=RaySettings.workers, help="(a)'s actors")
    parser.add_argument(
        "--batch-size",
        type=batch_size,
        default=RaySettings.batch_size,
        help="(a)'s forks per actor call, or 'auto' (default 16)",
    )
    parser.add_argument(
        "--per-worker-in-flight",
        type=int,
        default=None,
        help="(a)'s per_worker_in_flight (default: the window over the workers)",
    )
    parser.add_argument(
        "--settle-s",
        type=float,
        default=0.0,
        metavar="S",
        help="before each cell, wait up to S s for other processes to go quiet (default 0)",
    )
    parser.add_argument(
        "--worker-niceness",
        type=int,
        default=None,
        help="set RAY_worker_niceness for the embedded Ray (default: Ray's own, 15)",
    )
    args = parser.parse_args(argv)
    if args.windows is None:
        args.windows = list(QUICK_WINDOWS if args.quick else WINDOWS)
    return args


async def record_once(job: Job, sim: SimProcess, scratch: Path) -> tuple[Tape, bytes]:
    path = scratch / "support_refund.tape"
    tape = await record_demo_tape(job, BaseUrls.for_server(sim.url), path)
    return tape, path.read_bytes()


def bench(args: argparse.Namespace, console: Console) -> list[Cell]:
    job = load_job(JOB_FILE)
    assert job.spec.policy is not None
    schemes: list[Scheme] = list(args.schemes)
    settings = RaySettings(args.workers, args.batch_size, args.per_worker_in_flight)
    if "ray" in schemes:
        if args.worker_niceness is not None:
            # Read by the raylet when it starts: only an embedded Ray started here obeys it.
            os.environ[WORKER_NICENESS_ENV] = str(args.worker_niceness)
        began = time.perf_counter()
        init_ray()
        console.print(f"embedded Ray up in {time.perf_counter() - began:.1f} s")
    cells: list[Cell] = []
    recorded: tuple[Tape, bytes] | None = None
    with tempfile.TemporaryDirectory(prefix="car-ray-bench-") as scratch:
        for latency_ms in args.latencies_ms:
            with SimProcess(
                job.spec.policy, latency_s=latency_ms / 1000, search_path=job.search_path
            ) as sim:
                # One tape for the whole run: a fork's live calls go to the current provider,
                # whatever address the tape was recorded against.
                if recorded is None:
                    recorded = run_loop(record_once(job, sim, Path(scratch)))
                tape, raw = recorded
                run = Run(
                    job=job,
                    sim=sim,
                    base_urls=BaseUrls.for_server(sim.url),
                    tape=tape,
                    raw=raw,
                    step=args.step,
                    latency_ms=latency_ms,
                    target_s=1.0 if args.quick else 3.0,
                    settle_s=args.settle_s,
                    console=console,
                )
                cells += run_loop(bench_latency(run, args.windows, schemes, settings, args.repeats))
    return cells


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    console = make_console(width=240)
    started = time.perf_counter()
    load_before = warn_if_loaded(console)
    cells = bench(args, console)
    console.print(table(cells, args.step, RaySettings(args.workers, args.batch_size)))
    results = verdicts(cells)
    for verdict in results:
        mark = "[bold green]PASS[/]" if verdict.passed else "[bold red]FAIL[/]"
        console.print(f"{mark}  {verdict.line}")
    for note in bottlenecks(cells):
        console.print(note)
    config: dict[str, Any] = {
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "job": str(JOB_FILE.relative_to(ROOT)),
        "step": args.step,
        "intervention": "resample",
        "tail": "live",
        "quick": args.quick,
        "repeats": args.repeats,
        "latencies_ms": args.latencies_ms,
        "windows": args.windows,
        "schemes": args.schemes,
        "ray": {
            "workers": args.workers,
            "batch_size": "auto" if args.batch_size is None else args.batch_size,
            "per_worker_in_flight": args.per_worker_in_flight,
            "worker_niceness": args.worker_niceness,
        },
        "targets": [{"line": v.line, "passed": v.passed} for v in results],
        "settle_s": args.settle_s,
        "total_s": round(time.perf_counter() - started, 2),
        "load_average_1m_before": round(load_before, 2),
    }
    facts = machine(("ray", "pyarrow", "aiohttp", "openai", "uvloop"))
    parquet_path, csv_path = write_results(args.out, cells, config, facts)
    console.print(f"wrote {parquet_path} and {csv_path} in {config['total_s']} s")
    broken = [
        f"{LABELS[c.scheme]}/{c.latency_ms:g}ms/W{c.in_flight} {c.statuses}"
        for c in cells
        if c.not_ok or c.tail_calls == 0
    ]
    return 1 if not_all_ok(console, broken) else 0


if __name__ == "__main__":
    sys.exit(main())
