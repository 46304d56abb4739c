"""Fork throughput and per-fork CPU cost in one process, for each live upstream.

Resample forks of the demo tape (jobs/support_refund) run against the simulated provider in a
child process, at 0 ms and 50 ms of simulated latency, with 1, 8, 32 and 128 forks in flight,
through `AiohttpUpstream` (the default) and `HttpxUpstream` side by side.

    .venv/bin/python benchmarks/fork_overhead.py [--quick] [--out benchmarks/results]

Prints a table and writes `fork_overhead.json` and `fork_overhead.csv` to `--out`. Exits 1 if
any fork ended other than "ok", so a broken run cannot pass for a fast one.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from _common import (
    DEFAULT_OUT,
    DEFAULT_STEP,
    JOB_FILE,
    ROOT,
    ServerCpu,
    fork_specs,
    machine,
    make_console,
    not_all_ok,
    record_demo_tape,
    run_window,
    warn_if_loaded,
)
from rich.console import Console
from rich.table import Table

from car_ray._aio import run as run_loop
from car_ray.job import Job, load_job
from car_ray.replay import (
    AiohttpUpstream,
    BaseUrls,
    ForkRunner,
    HttpxUpstream,
    Upstream,
)
from car_ray.sim import SimProcess

UpstreamName = Literal["aiohttp", "httpx"]
UPSTREAMS: dict[UpstreamName, Callable[[], Upstream]] = {
    "aiohttp": AiohttpUpstream,
    "httpx": HttpxUpstream,
}
LATENCIES_MS = (0.0, 50.0)
WINDOWS = (1, 8, 32, 128)


def fork_count(latency_ms: float, window: int, quick: bool) -> int:
    """Forks per cell: the window filled 3-6 times over, ~1-6 s each on 2 cores."""
    if quick:
        return max(20, window * 2) if latency_ms == 0 else max(8, window * 2)
    # One process runs ~70-100 forks/s (CPU-bound); a fork at 50 ms waits ~0.14 s on the
    # provider, so one in flight manages ~7 forks/s.
    return max(100, window * 3) if latency_ms == 0 else max(24, window * 4)


@dataclass(frozen=True)
class Cell:
    """One measurement: N forks of one upstream at one latency with `in_flight` kept busy."""

    upstream: UpstreamName
    latency_ms: float
    in_flight: int
    forks: int
    wall_s: float
    cpu_s: float
    server_cpu_s: float | None
    tail_calls: int
    server_requests: int
    not_ok: int
    statuses: dict[str, int]
    flipped: int

    @property
    def forks_per_s(self) -> float:
        return self.forks / self.wall_s

    @property
    def cpu_ms_per_fork(self) -> float:
        return 1000 * self.cpu_s / self.forks

    @property
    def server_cpu_ms_per_fork(self) -> float | None:
        return None if self.server_cpu_s is None else 1000 * self.server_cpu_s / self.forks

    @property
    def tail_calls_per_fork(self) -> float:
        return self.tail_calls / self.forks

    @property
    def latency_bound_forks_per_s(self) -> float | None:
        """What the window allows if only the provider's latency cost time."""
        if self.latency_ms == 0 or self.tail_calls == 0:
            return None
        return self.in_flight / (self.latency_ms / 1000 * self.tail_calls_per_fork)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for name in (
            "forks_per_s",
            "cpu_ms_per_fork",
            "server_cpu_ms_per_fork",
            "tail_calls_per_fork",
            "latency_bound_forks_per_s",
        ):
            value = getattr(self, name)
            out[name] = None if value is None else round(value, 4)
        return out


async def measure(
    runner: ForkRunner,
    sim: SimProcess,
    server_cpu: ServerCpu,
    *,
    upstream: UpstreamName,
    latency_ms: float,
    tape_id: str,
    step: int,
    window: int,
    count: int,
) -> Cell:
    # Warm up outside the clock: connections open, agent threads start, lazy imports happen.
    warm = max(window, 8)
    await run_window(runner, fork_specs(tape_id, step, warm), warm)
    served_before = sim.requests_served
    server_before = server_cpu.seconds()
    cpu_before = time.process_time()
    wall_before = time.perf_counter()
    rows = await run_window(runner, fork_specs(tape_id, step, count), window)
    wall_s = time.perf_counter() - wall_before
    cpu_s = time.process_time() - cpu_before
    server_after = server_cpu.seconds()
    server_requests = sim.requests_served - served_before
    statuses: Counter[str] = Counter(row.status for row in rows)
    tail_calls = sum(row.tail_calls for row in rows)
    return Cell(
        upstream=upstream,
        latency_ms=latency_ms,
        in_flight=window,
        forks=len(rows),
        wall_s=wall_s,
        cpu_s=cpu_s,
        server_cpu_s=(
            None if server_before is None or server_after is None else server_after - server_before
        ),
        tail_calls=tail_calls,
        server_requests=server_requests,
        not_ok=len(rows) - statuses.get("ok", 0),
        statuses=dict(statuses),
        flipped=sum(1 for row in rows if row.flipped),
    )


async def bench_latency(
    job: Job,
    latency_ms: float,
    *,
    upstreams: Sequence[UpstreamName],
    windows: Sequence[int],
    step: int,
    quick: bool,
    scratch: Path,
    console: Console,
) -> list[Cell]:
    agent = job.load("agent")
    scorer = job.load("scorer")
    assert job.spec.policy is not None
    cells: list[Cell] = []
    with SimProcess(
        job.spec.policy, latency_s=latency_ms / 1000, search_path=job.search_path
    ) as sim:
        base_urls = BaseUrls.for_server(sim.url)
        tape = await record_demo_tape(
            job, base_urls, scratch / f"support_refund-{latency_ms:g}ms.tape"
        )
        server_cpu = ServerCpu(sim)
        for name in upstreams:
            runner = ForkRunner(agent, scorer, base_urls=base_urls, upstream=UPSTREAMS[name]())
            try:
                tape_id = runner.add_tape(tape)
                for window in windows:
                    count = fork_count(latency_ms, window, quick)
                    cell = await measure(
                        runner,
                        sim,
                        server_cpu,
                        upstream=name,
                        latency_ms=latency_ms,
                        tape_id=tape_id,
                        step=step,
                        window=window,
                        count=count,
                    )
                    console.print(
                        f"{name:>7} {latency_ms:>4g} ms  W={window:<3} {cell.forks:>4} forks "
                        f"{cell.wall_s:6.2f} s  {cell.forks_per_s:7.1f} forks/s  "
                        f"{cell.cpu_ms_per_fork:6.2f} CPU ms/fork  not ok {cell.not_ok}",
                        highlight=False,
                    )
                    cells.append(cell)
            finally:
                await runner.aclose()
    return cells


def ratio(cells: Sequence[Cell], cell: Cell) -> float | None:
    """aiohttp's forks/s over httpx's at the same latency and window."""
    by_name = {
        c.upstream: c.forks_per_s
        for c in cells
        if c.latency_ms == cell.latency_ms and c.in_flight == cell.in_flight
    }
    if "aiohttp" not in by_name or "httpx" not in by_name:
        return None
    return by_name["aiohttp"] / by_name["httpx"]


def table(cells: Sequence[Cell], step: int) -> Table:
    with_server = any(c.server_cpu_s is not None for c in cells)
    out = Table(title=f"Resample forks of the demo tape (step {step}, live tail), one process")
    for header in ("upstream", "latency ms", "in flight", "forks", "wall s", "forks/s"):
        out.add_column(header, justify="right")
    out.add_column("CPU ms/fork", justify="right")
    if with_server:
        out.add_column("server CPU ms/fork", justify="right")
    out.add_column("tail calls/fork", justify="right")
    out.add_column("aiohttp/httpx", justify="right")
    out.add_column("not ok", justify="right")
    ordered = sorted(cells, key=lambda c: (c.latency_ms, c.in_flight, c.upstream))
    for c in ordered:
        r = ratio(cells, c)
        server = c.server_cpu_ms_per_fork
        values = [
            c.upstream,
            f"{c.latency_ms:g}",
            str(c.in_flight),
            str(c.forks),
            f"{c.wall_s:.2f}",
            f"{c.forks_per_s:.1f}",
            f"{c.cpu_ms_per_fork:.2f}",
            *([f"{server:.2f}" if server is not None else "-"] if with_server else []),
            f"{c.tail_calls_per_fork:.2f}",
            f"{r:.2f}x" if r is not None and c.upstream == "aiohttp" else "",
            str(c.not_ok) if c.not_ok == 0 else f"[bold red]{c.not_ok}[/]",
        ]
        out.add_row(*values)
    return out


def write_results(out: Path, cells: Sequence[Cell], config: dict[str, Any]) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    rows = [{**c.as_dict(), "aiohttp_over_httpx": ratio(cells, c)} for c in cells]
    json_path = out / "fork_overhead.json"
    payload = {
        "benchmark": "fork_overhead",
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "config": config,
        "rows": rows,
    }
    json_path.write_text(json.dumps(payload, indent=2) + "\n")
    csv_path = out / "fork_overhead.csv"
    with csv_path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        for row in rows:
            writer.writerow({**row, "statuses": json.dumps(row["statuses"], sort_keys=True)})
    return json_path, csv_path


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer forks per cell (~15 s)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder for the results")
    parser.add_argument(
        "--step", type=int, default=DEFAULT_STEP, help="the step to resample (default 2)"
    )
    parser.add_argument(
        "--latencies-ms", type=float, nargs="+", default=list(LATENCIES_MS), metavar="MS"
    )
    parser.add_argument("--windows", type=int, nargs="+", default=list(WINDOWS), metavar="W")
    parser.add_argument(
        "--upstreams", nargs="+", choices=list(UPSTREAMS), default=list(UPSTREAMS), metavar="NAME"
    )
    return parser.parse_args(argv)


async def main_async(args: argparse.Namespace, console: Console) -> list[Cell]:
    job = load_job(JOB_FILE)
    cells: list[Cell] = []
    with tempfile.TemporaryDirectory(prefix="car-ray-bench-") as scratch:
        for latency_ms in args.latencies_ms:
            cells += await bench_latency(
                job,
                latency_ms,
                upstreams=args.upstreams,
                windows=args.windows,
                step=args.step,
                quick=args.quick,
                scratch=Path(scratch),
                console=console,
            )
    return cells


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    console = make_console()
    started = time.perf_counter()
    load_before = warn_if_loaded(console)
    cells = run_loop(main_async(args, console))
    console.print(table(cells, args.step))
    config = {
        "job": str(JOB_FILE.relative_to(ROOT)),
        "step": args.step,
        "intervention": "resample",
        "tail": "live",
        "quick": args.quick,
        "latencies_ms": args.latencies_ms,
        "windows": args.windows,
        "upstreams": args.upstreams,
        "total_s": round(time.perf_counter() - started, 2),
        "load_average_1m_before": round(load_before, 2),
    }
    json_path, csv_path = write_results(args.out, cells, config)
    console.print(f"wrote {json_path} and {csv_path} in {config['total_s']} s")
    broken = [
        f"{c.upstream}/{c.latency_ms:g}ms/W{c.in_flight} {c.statuses}"
        for c in cells
        if c.not_ok or c.tail_calls == 0
    ]
    mismatched = [c for c in cells if c.server_requests != c.tail_calls]
    if mismatched:
        console.print(
            "[yellow]the provider served a different number of requests than the forks "
            "counted as tail calls in: "
            + ", ".join(
                f"{c.upstream}/{c.latency_ms:g}ms/W{c.in_flight} "
                f"({c.server_requests} != {c.tail_calls})"
                for c in mismatched
            )
        )
    return 1 if not_all_ok(console, broken) else 0


if __name__ == "__main__":
    sys.exit(main())
