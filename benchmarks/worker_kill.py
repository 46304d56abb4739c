"""What one ForkWorker SIGKILL costs an attribution job: forks lost and budget charged.

Runs the demo job (jobs/support_refund, method "uniform" with a live tail, 30 ms of simulated
latency, a cap of --max-forks forks) with `car_ray.attribute.attribute` on an embedded local
Ray, and SIGKILLs the first worker's process once --kill-after forks are done. Ray restarts
the worker; the job goes on. Each run reports:

  lost        forks (and batches) the executor returned as `BatchLost`: the scheduler charges
              each its whole reservation and runs it again under a new one;
  rerouted    batches Ray refused to send to the restarting worker, which the executor sent
              to a live one instead (nothing of them ran, nothing is charged);
  charged     the ledger's spent USD at the end (rows settled at their cost, lost forks at
              their reservation) against the real cost of the rows written: charged / real.

    .venv/bin/python benchmarks/worker_kill.py [--runs 3] [--max-forks 800] [--kill-after 150]

Prints a table, one line a run and the medians; exits 1 if a run wrote a task twice or a
worker was never killed.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any

import pyarrow.dataset as pads
from _common import JOB_FILE, make_console, record_demo_tape, warn_if_loaded
from rich.console import Console
from rich.table import Table
from structlog.testing import capture_logs

from car_ray._aio import run as run_loop
from car_ray.attribute import attribute
from car_ray.execute import init_ray
from car_ray.job import Job, load_job
from car_ray.replay import BaseUrls
from car_ray.results import JobInfo, Spend
from car_ray.schedule import job_id_of
from car_ray.sim import SimProcess
from car_ray.tape import Tape


@dataclass(frozen=True)
class KillRun:
    run: int
    status: str
    killed_pid: int
    lost_forks: int
    lost_batches: int
    rerouted_batches: int
    rows: int
    unique_rows: int
    spent_forks: int
    charged_usd: float
    real_usd: float
    wall_s: float

    @property
    def charged_over_real(self) -> float:
        return self.charged_usd / self.real_usd if self.real_usd else float("nan")


def kill_run(
    job: Job, tape: Tape, out: Path, run: int, *, kill_after: int, console: Console
) -> KillRun:
    job_id = job_id_of(job, tape)
    killed: list[int] = []
    finished = threading.Event()

    def killer() -> None:
        # job.json carries the worker pids (from `RayExecutor.worker_pids`) and the progress.
        while not finished.is_set() and not killed:
            info = JobInfo.read(str(out), job_id)
            if info and info.workers and info.progress and info.progress.done >= kill_after:
                os.kill(info.workers[0], signal.SIGKILL)
                killed.append(info.workers[0])
            finished.wait(0.05)

    thread = threading.Thread(target=killer)
    started = time.perf_counter()
    with capture_logs() as events, open(os.devnull, "w") as quiet:
        thread.start()
        try:
            folder, outcome = attribute(job, tape=tape, out=str(out), console=Console(file=quiet))
        finally:
            finished.set()
            thread.join()
    wall_s = time.perf_counter() - started
    rows: list[dict[str, Any]] = (
        pads.dataset(os.path.join(folder, "forks"), format="parquet").to_table().to_pylist()
    )
    info = JobInfo.read(str(out), job_id)
    spent = info.ledger.spent if info and info.ledger else Spend()
    result = KillRun(
        run=run,
        status=outcome.status,
        killed_pid=killed[0] if killed else 0,
        lost_forks=outcome.progress.lost,
        lost_batches=sum(e["event"] == "batch_lost" for e in events),
        rerouted_batches=sum(e["event"] == "batch_rerouted" for e in events),
        rows=len(rows),
        unique_rows=len({r["task_id"] for r in rows}),
        spent_forks=spent.forks,
        charged_usd=spent.usd,
        real_usd=sum(float(r["cost_usd"]) for r in rows),
        wall_s=wall_s,
    )
    console.print(
        f"run {run + 1}: killed {result.killed_pid or 'nothing'}, lost {result.lost_forks} "
        f"forks in {result.lost_batches} batches, rerouted {result.rerouted_batches} batches, "
        f"{result.rows} rows, charged/real {result.charged_over_real:.2f}x, "
        f"{result.wall_s:.1f} s",
        highlight=False,
    )
    return result


def table(runs: Sequence[KillRun], max_forks: int) -> Table:
    out = Table(title=f"One ForkWorker SIGKILL in a job capped at {max_forks} forks")
    for header in (
        "run",
        "status",
        "lost forks",
        "lost batches",
        "rerouted batches",
        "rows",
        "spent forks",
        "charged USD",
        "real USD",
        "charged / real",
        "wall s",
    ):
        out.add_column(header, justify="right")
    for r in runs:
        out.add_row(
            str(r.run + 1),
            r.status,
            str(r.lost_forks),
            str(r.lost_batches),
            str(r.rerouted_batches),
            str(r.rows),
            str(r.spent_forks),
            f"{r.charged_usd:.4f}",
            f"{r.real_usd:.4f}",
            f"{r.charged_over_real:.2f}x",
            f"{r.wall_s:.1f}",
        )
    out.add_row(
        "median",
        "",
        f"{median(r.lost_forks for r in runs):g}",
        f"{median(r.lost_batches for r in runs):g}",
        f"{median(r.rerouted_batches for r in runs):g}",
        f"{median(r.rows for r in runs):g}",
        f"{median(r.spent_forks for r in runs):g}",
        f"{median(r.charged_usd for r in runs):.4f}",
        f"{median(r.real_usd for r in runs):.4f}",
        f"{median(r.charged_over_real for r in runs):.2f}x",
        f"{median(r.wall_s for r in runs):.1f}",
        style="bold",
    )
    return out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--max-forks", type=int, default=800)
    parser.add_argument("--kill-after", type=int, default=150, help="forks done before the kill")
    parser.add_argument("--latency-ms", type=float, default=30.0)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    console = make_console()
    warn_if_loaded(console)
    base = load_job(JOB_FILE)
    update = {"method": "uniform", "uniform_tail": "live", "forks_per_step": 10_000}
    spec = base.spec.model_copy(update=update, deep=True)
    spec.budget.max_forks = args.max_forks
    spec.provider.sim_latency_ms = args.latency_ms
    job = Job(base.path, spec)
    runs: list[KillRun] = []
    with tempfile.TemporaryDirectory(prefix="car-ray-kill-") as scratch:
        assert job.spec.policy is not None
        with SimProcess(job.spec.policy, search_path=job.code_path()) as sim:
            tape = run_loop(
                record_demo_tape(job, BaseUrls.for_server(sim.url), Path(scratch) / "demo.tape")
            )
        init_ray()
        for run in range(args.runs):
            out = Path(scratch) / f"out-{run}"
            runs.append(kill_run(job, tape, out, run, kill_after=args.kill_after, console=console))
    console.print(table(runs, args.max_forks))
    broken = [r for r in runs if r.unique_rows != r.rows or not r.killed_pid]
    if broken:
        console.print(f"[bold red]a task written twice or no worker killed in runs {broken}")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
