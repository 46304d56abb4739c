"""Forks in flight against a verdict that may come at any seed: the shipped window (about half
the forks the verdict still needs, one once its tests pass) beside a fixed window of 8, in
one run. A Shapley fork in flight when the verdict comes is paid for and tells nothing.

    .venv/bin/python benchmarks/window.py [--seeds 16] [--processes 2]

Default jobs of jobs/and_conj and jobs/research_async over attribution seeds 20 on. Printed
per scenario and window: the forks spent in all, the jobs that stopped on separation, and
whether every first row is one of the exact top (`car-ray truth`: 2 and 4 in and_conj, 4 and
6 in research_async); and the most one job spent beyond its fixed-window twin. Figures go to
benchmarks/results/window.json. Measured when the window was chosen (57d3c30, seeds 20-35):
1,920 forks against 2,079, 27 stops against 26.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import Any

from _common import ROOT, in_processes, make_console, seeds_args, write_figures
from rich.table import Table

TOPS = {"and_conj": (2, 4), "research_async": (4, 6)}
WINDOWS = ("narrowing", "fixed 8")
FIRST_SEED = 20


def run(task: tuple[str, str, int]) -> dict[str, Any]:
    name, window, seed = task
    from dataclasses import replace

    from car_ray.bench import _job_and_tape, _quiet, ended
    from car_ray.job import Job
    from car_ray.schedule import SHIPPED_RULES, Budget
    from car_ray.schedule.rules import FixedWindow
    from car_ray.truth import run_local

    _quiet()
    rules = (
        SHIPPED_RULES if window == "narrowing" else replace(SHIPPED_RULES, window=FixedWindow(8))
    )
    base, tape = _job_and_tape(str(ROOT / "jobs" / name / "job.toml"))
    job = Job(base.path, base.spec.model_copy(update={"attribution_seed": seed}))
    outcome, _ = run_local(job, tape, Budget(), rules)
    first = [
        r["step"] for r in outcome.attribution if r["intervention"] == "resample" and r["rank"] == 1
    ]
    return {
        "job": name,
        "window": window,
        "seed": seed,
        "forks": outcome.progress.spent.forks,
        "separated": ended(outcome.answer, outcome.status) == "separated",
        "right": bool(first) and set(first) <= set(TOPS[name]),
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = seeds_args(__doc__, 16, argv)
    began = time.perf_counter()
    seeds = range(FIRST_SEED, FIRST_SEED + args.seeds)
    tasks = [(name, window, seed) for name in TOPS for window in WINDOWS for seed in seeds]
    results = in_processes(run, tasks, args.processes)
    console = make_console()
    table = Table(title=f"default jobs, attribution seeds {seeds.start}-{seeds.stop - 1}")
    for column in ("scenario", "window", "forks", "separated", "first row right"):
        table.add_column(column, justify="left" if column in ("scenario", "window") else "right")
    summary: dict[str, Any] = {}
    for name in TOPS:
        for window in WINDOWS:
            runs = [r for r in results if r["job"] == name and r["window"] == window]
            forks = sum(r["forks"] for r in runs)
            stops = sum(r["separated"] for r in runs)
            right = sum(r["right"] for r in runs)
            summary[f"{name}/{window}"] = {"forks": forks, "separated": stops, "right": right}
            table.add_row(name, window, str(forks), f"{stops}/{len(runs)}", f"{right}/{len(runs)}")
    console.print(table)
    pairs = {(r["job"], r["seed"]): r for r in results if r["window"] == "fixed 8"}
    beyond = max(
        r["forks"] - pairs[(r["job"], r["seed"])]["forks"]
        for r in results
        if r["window"] == "narrowing"
    )
    narrowing = sum(r["forks"] for r in results if r["window"] == "narrowing")
    fixed = sum(r["forks"] for r in results if r["window"] == "fixed 8")
    console.print(
        f"narrowing / fixed forks: {narrowing / fixed:.3f}; most one job spent beyond its twin: "
        f"{beyond}",
        markup=False,
    )
    figures = {
        "seeds": list(seeds),
        "summary": summary,
        "ratio": narrowing / fixed,
        "runs": results,
    }
    write_figures(console, args.out, "window.json", figures, began)
    return 0


if __name__ == "__main__":
    sys.exit(main())
