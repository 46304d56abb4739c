"""What `car_ray.recording` adds to each model call, against the same agent unrecorded.

Two agents from jobs/ run against the simulated provider in a child process on 127.0.0.1:
support_refund (the sync openai SDK) and research_async (the async anthropic SDK, streaming,
async tools). Each runs N times in each of three modes, interleaved run by run in one
process (each mode goes first, second and third in turn):
- unrecorded: the agent gets a plain context: the SDK's own client and transport (one pooled
  httpx2 client, as a production service keeps), tools called directly;
- recorded: `car_ray.recording` with a scorer, tapes on this disk, every line fsynced, a mark
  per run;
- recorded, fsync=False: the same, flushing left to the OS.
Every mode sends the same seed header on each request, so the runs of one seed draw the same
answers: the same model calls, the same tools (the table flags any run that did not).

Per model call = a run's wall time (or this process's CPU, every thread) over its model
calls: per-run costs (opening the tape, the seal, the scorer, the mark) are spread over the
calls. "Added" is the paired difference with the unrecorded run of the same seed.

    .venv/bin/python benchmarks/recording_overhead.py [--runs 200] [--latency-ms 0] [--quick]

Prints a table and writes `recording_overhead.json` to `--out` (benchmarks/results).
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import random
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import openai
from _common import DEFAULT_OUT, ROOT, load_average, machine, make_console, warn_if_loaded
from rich.table import Table

import car_ray
from car_ray.job import Job, load_job
from car_ray.providers import SEED_HEADER
from car_ray.recorder import RecordedRun
from car_ray.replay import BaseUrls, step_seed
from car_ray.sim import SimProcess

JOBS = {
    "support_refund (sync openai)": ROOT / "jobs" / "support_refund" / "job.toml",
    "research_async (async anthropic, stream)": ROOT / "jobs" / "research_async" / "job.toml",
}
WARMUP = 5


class PlainContext:
    """The agent's `ctx` without car-ray: the SDKs' own clients over shared pooled httpx2
    clients, tools called directly, the clock and ids drawn directly. Each request carries
    the seed header a recording sends for the same step, so the simulated provider answers
    both runs alike."""

    def __init__(
        self,
        input: Any,
        seed: int,
        clients: PlainClients,
    ) -> None:
        self.input = input
        self.seed = seed
        self.step = 0
        self.model_calls = 0
        self._clients = clients
        clients.current = self

    def next_seed(self) -> str:
        seed = step_seed(self.seed, self.step)
        self.step += 1
        self.model_calls += 1
        return str(seed)

    def openai(self) -> openai.OpenAI:
        return self._clients.openai

    def async_anthropic(self) -> anthropic.AsyncAnthropic:
        return self._clients.async_anthropic

    def tool(
        self, name: str, fn: Callable[..., Any], /, *args: Any, effect: bool = False, **kw: Any
    ) -> Any:
        self.step += 1
        return fn(*args, **kw)

    def now(self) -> float:
        return time.time()

    def uuid4(self) -> uuid.UUID:
        return uuid.uuid4()

    def random(self) -> float:
        return random.random()


@dataclass
class PlainClients:
    """One sync and one async pooled client per process, as a service keeps them."""

    base_urls: BaseUrls
    current: PlainContext | None = None
    openai: openai.OpenAI = field(init=False)
    async_anthropic: anthropic.AsyncAnthropic = field(init=False)

    def __post_init__(self) -> None:
        def seed(request: httpx2.Request) -> None:
            assert self.current is not None
            request.headers[SEED_HEADER] = self.current.next_seed()

        async def aseed(request: httpx2.Request) -> None:
            seed(request)

        self.openai = openai.OpenAI(
            api_key="sk-bench",
            base_url=self.base_urls.openai,
            max_retries=0,
            http_client=httpx2.Client(event_hooks={"request": [seed]}, timeout=600),
        )
        self.async_anthropic = anthropic.AsyncAnthropic(
            api_key="sk-bench",
            base_url=self.base_urls.anthropic,
            max_retries=0,
            http_client=httpx2.AsyncClient(event_hooks={"request": [aseed]}, timeout=600),
        )


@dataclass(frozen=True)
class RunFigures:
    mode: str  # "recorded" | "plain"
    seed: int
    model_calls: int
    wall_s: float
    cpu_s: float

    @property
    def wall_ms_per_call(self) -> float:
        return 1000 * self.wall_s / self.model_calls

    @property
    def cpu_ms_per_call(self) -> float:
        return 1000 * self.cpu_s / self.model_calls


def _llm_steps(run: RecordedRun) -> int:
    return sum(1 for line in run.path.read_text().splitlines() if line.startswith('{"type":"llm"'))


MODES = ("unrecorded", "recorded", "recorded, fsync=False")


def _order(i: int) -> list[str]:
    """Each mode goes first, second and third in turn."""
    k = i % len(MODES)
    return [*MODES[k:], *MODES[:k]]


async def bench(job: Job, base_urls: BaseUrls, folder: Path, sets: int) -> list[RunFigures]:
    """`sets` runs of the job's agent in each mode, interleaved; a sync agent blocks this
    loop while it runs (its recorded calls go through the recording loop's thread)."""
    plain_agent = job.load("agent")
    settings: dict[str, Any] = {
        "scorer": job.load("scorer"),
        "base_urls": base_urls,
        "api_keys": {"openai": "sk-bench", "anthropic": "sk-bench"},
    }
    recorded = {
        "recorded": car_ray.recording(folder, **settings)(plain_agent),
        "recorded, fsync=False": car_ray.recording(folder, fsync=False, **settings)(plain_agent),
    }
    clients = PlainClients(base_urls)
    out: list[RunFigures] = []
    for i in range(WARMUP + sets):
        seed = 1000 + i
        for mode in _order(i):
            cpu, wall = time.process_time(), time.perf_counter()
            if mode == "unrecorded":
                ctx = PlainContext(job.spec.input, seed, clients)
                await _maybe_await(plain_agent(ctx))
                wall_s, cpu_s = time.perf_counter() - wall, time.process_time() - cpu
                calls = ctx.model_calls
            else:
                run = await _maybe_await(recorded[mode].record(job.spec.input, seed=seed))
                wall_s, cpu_s = time.perf_counter() - wall, time.process_time() - cpu
                calls = _llm_steps(run)
            if i >= WARMUP:
                out.append(RunFigures(mode, seed, calls, wall_s, cpu_s))
    return out


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _mp(values: list[float]) -> tuple[float, float]:
    """(median, p90)."""
    return round(statistics.median(values), 4), round(_p(values, 0.9), 4)


@dataclass(frozen=True)
class Summary:
    """One agent in one mode; `added_*` are paired differences with the unrecorded run of
    the same seed. Each pair is (median, p90)."""

    agent: str
    mode: str
    runs: int
    model_calls_per_run: float
    same_calls_as_unrecorded: bool
    ms_per_call: tuple[float, float]
    cpu_ms_per_call: tuple[float, float]
    added_ms_per_call: tuple[float, float] | None
    added_cpu_ms_per_call: tuple[float, float] | None


def summarize(agent: str, runs: list[RunFigures]) -> list[Summary]:
    by_mode: dict[str, dict[int, RunFigures]] = {}
    for run in runs:
        by_mode.setdefault(run.mode, {})[run.seed] = run
    base = by_mode["unrecorded"]
    out: list[Summary] = []
    for mode in MODES:
        mine = by_mode[mode]
        pairs = [(mine[seed], base[seed]) for seed in mine]
        added = mode != "unrecorded"
        out.append(
            Summary(
                agent=agent,
                mode=mode,
                runs=len(mine),
                model_calls_per_run=round(statistics.mean(r.model_calls for r in mine.values()), 2),
                same_calls_as_unrecorded=all(r.model_calls == b.model_calls for r, b in pairs),
                ms_per_call=_mp([r.wall_ms_per_call for r in mine.values()]),
                cpu_ms_per_call=_mp([r.cpu_ms_per_call for r in mine.values()]),
                added_ms_per_call=(
                    _mp([r.wall_ms_per_call - b.wall_ms_per_call for r, b in pairs])
                    if added
                    else None
                ),
                added_cpu_ms_per_call=(
                    _mp([r.cpu_ms_per_call - b.cpu_ms_per_call for r, b in pairs])
                    if added
                    else None
                ),
            )
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200, help="runs per agent and mode")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="simulated latency")
    parser.add_argument("--quick", action="store_true", help="30 runs per agent and mode")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    sets = 30 if args.quick else args.runs
    console = make_console(160)
    load_before = warn_if_loaded(console)
    args.out.mkdir(parents=True, exist_ok=True)
    # On the disk the results go to (not a tmpfs): the fsyncs cost what they cost there.
    scratch = Path(tempfile.mkdtemp(prefix=".recording-", dir=args.out))
    summaries: list[Summary] = []
    raw: dict[str, list[dict[str, Any]]] = {}
    try:
        for name, job_file in JOBS.items():
            job = load_job(job_file)
            assert job.spec.policy is not None
            with SimProcess(
                job.spec.policy, latency_s=args.latency_ms / 1000, search_path=job.search_path
            ) as sim:
                base_urls = BaseUrls.for_server(sim.url)
                folder = scratch / job_file.parent.name
                runs = asyncio.run(bench(job, base_urls, folder, sets))
            summaries.extend(summarize(name, runs))
            raw[name] = [asdict(r) for r in runs]
            # Every recorded run left its tape and its mark.
            tapes = len(list(folder.glob("*.tape")))
            marks = len(list(folder.glob("*.mark.json")))
            assert tapes == marks == 2 * (sets + WARMUP), (tapes, marks)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    table = Table(
        title=(
            f"car_ray.recording against the same agent unrecorded: {sets} runs per agent and "
            f"mode, interleaved; simulated provider on 127.0.0.1, {args.latency_ms:g} ms latency"
        )
    )
    for column in (
        "agent",
        "mode",
        "calls/run",
        "ms/call med / p90",
        "CPU ms/call med / p90",
        "added ms/call med / p90",
        "added CPU ms/call med / p90",
    ):
        table.add_column(column, justify="left" if column in ("agent", "mode") else "right")

    def pair(value: tuple[float, float] | None) -> str:
        return "" if value is None else f"{value[0]:.2f} / {value[1]:.2f}"

    for s in summaries:
        table.add_row(
            s.agent if s.mode == "unrecorded" else "",
            s.mode,
            f"{s.model_calls_per_run:g}" + ("" if s.same_calls_as_unrecorded else " (!)"),
            pair(s.ms_per_call),
            pair(s.cpu_ms_per_call),
            pair(s.added_ms_per_call),
            pair(s.added_cpu_ms_per_call),
        )
    console.print(table)
    console.print(
        "per call = a run's wall time (or this process's CPU, all threads) over its model "
        "calls; added = recorded minus unrecorded, paired by seed (the same calls and answers)"
    )
    if not all(s.same_calls_as_unrecorded for s in summaries):
        console.print("[bold red](!) some runs made other calls than their pair: not like for like")
    out = args.out / "recording_overhead.json"
    out.write_text(
        json.dumps(
            {
                "benchmark": "recording_overhead",
                "when": datetime.now(UTC).isoformat(timespec="seconds"),
                "runs_per_mode": sets,
                "latency_ms": args.latency_ms,
                "load_average_before": load_before,
                "load_average_after": load_average(),
                "machine": machine(("aiohttp", "httpx2", "openai", "anthropic")),
                "summary": [asdict(s) for s in summaries],
                "runs": raw,
            },
            indent=1,
        )
        + "\n"
    )
    console.print(f"figures → {out}")


if __name__ == "__main__":
    main()
