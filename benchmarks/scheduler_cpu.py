"""How much CPU the scheduler itself spends choosing forks: the CPU seconds in
`Scheduler.suggest` (its stages' suggestions, the estimators and rules they ask) against the
CPU of the whole run, for default jobs.

    .venv/bin/python benchmarks/scheduler_cpu.py [--seeds 3] [--jobs long_tape,research_async]

Each job runs as its job file says (the default: no caps) in this process, for each
attribution seed (LocalExecutor, the simulated provider in process: the scheduler, its
stages and estimators are the real ones); the timing is a subclass of `Scheduler` whose
`suggest` keeps its CPU (nothing of car-ray is patched). Printed per job: forks, CPU seconds
in `suggest`, CPU of the whole run and the share. Figures go to
benchmarks/results/scheduler_cpu.json. (The comparison of the clearance bound's vectorised
grid with one level at a time that this benchmark ran before is in the tuning record's
history: 93b52d4.)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from statistics import median
from typing import Any

from _common import DEFAULT_OUT, ROOT, make_console, warn_if_loaded
from rich.table import Table

from car_ray._scenario import ensure_tape
from car_ray.bench import _quiet
from car_ray.execute import LocalExecutor, MemorySink
from car_ray.job import Job, load_job
from car_ray.providers import PriceTable
from car_ray.replay import ForkSpec
from car_ray.schedule import Budget, Scheduler, job_id_of
from car_ray.tape import Tape
from car_ray.truth import sim_runner

JOBS = ("long_tape", "research_async", "and_conj", "support_refund", "relay")


class TimedScheduler(Scheduler):
    """A scheduler that keeps the CPU seconds its `suggest` took."""

    suggest_cpu_s = 0.0

    def suggest(self, room: int) -> list[tuple[str, ForkSpec]] | None:
        start = time.process_time()
        try:
            return super().suggest(room)
        finally:
            self.suggest_cpu_s += time.process_time() - start


def one(job: Job, tape: Tape) -> dict[str, Any]:
    """One default run: its forks and CPU seconds."""
    executor = LocalExecutor(sim_runner(job, tape))
    scheduler = TimedScheduler(
        job,
        tape,
        job_id=job_id_of(job, tape),
        executor=executor,
        sink=MemorySink(),
        budget=Budget(),
        prices=PriceTable.load(None),
    )
    start = time.process_time()
    try:
        outcome = scheduler.run()
    finally:
        executor.shutdown()
    return {
        "forks": outcome.progress.spent.forks,
        "suggest_cpu_s": scheduler.suggest_cpu_s,
        "run_cpu_s": time.process_time() - start,
    }


def run(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--jobs", default=",".join(JOBS))
    args = parser.parse_args(argv)
    _quiet()
    console = make_console(width=140)
    warn_if_loaded(console)
    results: list[dict[str, Any]] = []
    for name in args.jobs.split(","):
        base = load_job(ROOT / "jobs" / name / "job.toml")
        tape = ensure_tape(base)  # recorded on first use, read once a job
        for seed in range(args.seeds):
            job = Job(base.path, base.spec.model_copy(update={"attribution_seed": seed}))
            if seed == 0:
                one(job, tape)  # warm-up (imports, caches), not counted
            results.append({"job": name, "seed": seed, **one(job, tape)})
    table = Table(title=f"scheduler CPU, default jobs, {args.seeds} seeds each (medians)")
    for col in ("job", "forks", "suggest s", "run s", "suggest / run"):
        table.add_column(col, justify="right")
    summary: dict[str, Any] = {}
    for name in args.jobs.split(","):
        runs = [r for r in results if r["job"] == name]
        cell = {k: median(r[k] for r in runs) for k in ("forks", "suggest_cpu_s", "run_cpu_s")}
        summary[name] = cell
        table.add_row(
            name,
            f"{cell['forks']:g}",
            f"{cell['suggest_cpu_s']:.2f}",
            f"{cell['run_cpu_s']:.2f}",
            f"{cell['suggest_cpu_s'] / max(cell['run_cpu_s'], 1e-9):.0%}",
        )
    console.print(table)
    DEFAULT_OUT.mkdir(parents=True, exist_ok=True)
    path = DEFAULT_OUT / "scheduler_cpu.json"
    path.write_text(json.dumps({"summary": summary, "runs": results}, indent=2) + "\n")
    console.print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(run())
