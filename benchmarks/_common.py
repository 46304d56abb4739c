"""What the benchmarks share: the demo job, its forks, CPU readings and machine facts.

Each benchmark records the demo tape (jobs/support_refund) against the simulated provider in
a scratch folder, runs resample forks of it and reports forks per second and CPU per fork."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import multiprocessing
import os
import platform
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from statistics import median
from typing import Any, TypeVar

from rich.console import Console

from car_ray.job import Job
from car_ray.replay import BaseUrls, ForkRow, ForkRunner, ForkSpec, Resample, record
from car_ray.sim import SimProcess
from car_ray.tape import Tape

ROOT = Path(__file__).resolve().parent.parent
JOB_FILE = ROOT / "jobs" / "support_refund" / "job.toml"
DEFAULT_OUT = ROOT / "benchmarks" / "results"
# Step 2 (the model's turn after the order lookup) leaves a live tail of 1-3 calls, 2.7 on
# average: check the policy (p 0.9), then decide, then answer if it refunded. Step 4, the
# refund decision itself, leaves 1-2 (1.8 on average).
DEFAULT_STEP = 2

_Task = TypeVar("_Task")
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def fork_specs(tape_id: str, step: int, count: int | None = None) -> Iterator[ForkSpec]:
    """Resample forks of `step` with a live tail, seeds 0, 1, 2, ... (endless without count)."""
    seed = 0
    while count is None or seed < count:
        yield ForkSpec(tape_id=tape_id, interventions={step: Resample()}, tail="live", seed=seed)
        seed += 1


async def run_window(runner: ForkRunner, forks: Iterator[ForkSpec], window: int) -> list[ForkRow]:
    """Run every fork with exactly `window` in flight until the iterator runs out."""
    rows: list[ForkRow] = []

    async def lane() -> None:
        # The iterator is shared: each lane takes the next fork as soon as its last ends.
        for spec in forks:
            rows.append(await runner.run(spec))

    await asyncio.gather(*(lane() for _ in range(window)))
    return rows


async def record_demo_tape(job: Job, base_urls: BaseUrls, path: Path) -> Tape:
    """Record the demo job's agent once against a live (simulated) provider."""
    tape, recorded = await record(
        job.load("agent"),
        job.spec.agent,
        job.spec.input,
        path,
        base_urls=base_urls,
        seed=job.spec.seed,
    )
    if recorded.error is not None:
        raise RuntimeError(f"recording the demo tape failed: {recorded.error!r}")
    return tape


def process_cpu_s(pid: int) -> float | None:
    """utime + stime of a live process (all its threads) from /proc/<pid>/stat; None if gone.

    Reading /proc needs no extra package and works for processes that are not our children
    (Ray's workers are the raylet's)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces: split after its closing parenthesis.
    fields = stat[stat.rindex(b")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def alive(pid: int) -> bool:
    """Whether `pid` is a running process (not gone, not a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2 :].split()[0] not in (b"Z", b"X")


def wait_exited(pids: Iterable[int], timeout_s: float = 10.0) -> None:
    """Wait until every process in `pids` has exited, or `timeout_s` has passed."""
    deadline = time.monotonic() + timeout_s
    waiting = [pid for pid in pids if alive(pid)]
    while waiting and time.monotonic() < deadline:
        time.sleep(0.05)
        waiting = [pid for pid in waiting if alive(pid)]


def total_cpu_s(pids: Iterable[int]) -> float:
    """The summed CPU seconds of `pids`; a process that has exited counts as 0."""
    return sum(process_cpu_s(pid) or 0.0 for pid in pids)


def machine_busy_cpu_s() -> float | None:
    """CPU seconds the whole machine has spent busy since boot (every core, every process)."""
    try:
        with open("/proc/stat") as f:
            first = f.readline().split()
    except OSError:
        return None
    # cpu user nice system idle iowait irq softirq steal guest guest_nice
    ticks = [int(x) for x in first[1:9]]
    return (sum(ticks) - ticks[3] - ticks[4]) / _CLOCK_TICKS


def descendants(root: int) -> set[int]:
    """Every live process under `root` (children, grandchildren, ...), read from /proc."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        parents[int(entry)] = int(stat[stat.rindex(b")") + 2 :].split()[1])
    found: set[int] = set()
    frontier = [root]
    while frontier:
        pid = frontier.pop()
        for child, parent in parents.items():
            if parent == pid and child not in found:
                found.add(child)
                frontier.append(child)
    return found


def sim_pid(sim: SimProcess) -> int | None:
    """The simulated provider's process id (SimProcess keeps its child private)."""
    child = getattr(sim, "_process", None)
    return None if child is None else int(child.pid)


class ServerCpu:
    """The simulated provider's CPU seconds, read from /proc (None where there is no /proc)."""

    def __init__(self, sim: SimProcess) -> None:
        pid = sim_pid(sim)
        self._pid = pid if pid is not None and process_cpu_s(pid) is not None else None

    @property
    def available(self) -> bool:
        return self._pid is not None

    def seconds(self) -> float | None:
        return None if self._pid is None else process_cpu_s(self._pid)


def machine(modules: Sequence[str] = ("aiohttp", "httpx2", "openai")) -> dict[str, Any]:
    versions: dict[str, str] = {}
    for module in modules:
        try:
            versions[module] = str(importlib.import_module(module).__version__)
        except (ImportError, AttributeError):
            versions[module] = "unknown"
    return {
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "load_average_1m": load_average(),
        "versions": versions,
    }


def load_average() -> float | None:
    return round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None


def seeds_args(doc: str | None, seeds: int, argv: Sequence[str] | None) -> argparse.Namespace:
    """The options of a benchmark over attribution seeds: --seeds (default `seeds`),
    --processes and --out."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0] if doc else None)
    parser.add_argument("--seeds", type=int, default=seeds)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    return parser.parse_args(argv)


def in_processes(
    run: Callable[[_Task], dict[str, Any]], tasks: Sequence[_Task], processes: int
) -> list[dict[str, Any]]:
    """`run` over `tasks` in `processes` spawned worker processes, in order."""
    with ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn")) as pool:
        return list(pool.map(run, tasks))


# The ends of a default job that answer (`car_ray.bench.ended`): a verdict, or nothing to blame.
ANSWERS = ("separated", "precise", "nothing")


def job_cell(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """What a benchmark says of one scenario's jobs (each run a dict with `right`, `ended`
    and `forks`): how many ranked the planted step first, how many stopped on an answer, the
    median forks and how many ran."""
    return {
        "right": sum(bool(r["right"]) for r in runs),
        "answered": sum(r["ended"] in ANSWERS for r in runs),
        "median_forks": median(r["forks"] for r in runs),
        "runs": len(runs),
    }


def write_figures(console: Console, out: Path, name: str, figures: Any, began: float) -> None:
    """Write a benchmark's figures to `out`/`name` as JSON and say where, with the wall time
    since `began` (a `time.perf_counter()` reading)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / name
    path.write_text(json.dumps(figures, indent=1))
    console.print(f"wrote {path}; wall time {time.perf_counter() - began:.0f} s", markup=False)


def make_console(width: int = 140) -> Console:
    console = Console()
    if not console.is_terminal:
        # Piped or captured, rich assumes 80 columns and would truncate the table's headers.
        console = Console(width=width)
    return console


def warn_if_loaded(console: Console) -> float:
    """Say so when the machine is busy before the run; returns the 1-minute load average."""
    load_before = load_average() or 0.0
    if load_before > 0.5:
        # Forks are CPU-bound: anything else on the machine shows in the figures.
        console.print(
            f"[yellow]load average {load_before:.2f} before the run: "
            "other processes will depress these figures"
        )
    return load_before


def not_all_ok(console: Console, broken: Sequence[str]) -> bool:
    """Say which cells had forks that did not end "ok" (each named with its statuses);
    True if any did: their figures do not measure working forks."""
    if broken:
        console.print(
            "[bold red]not every fork was ok: these figures do not measure working forks: "
            + ", ".join(broken)
        )
    return bool(broken)
