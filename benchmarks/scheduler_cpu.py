"""How much CPU the scheduler itself spends choosing forks, with the clearance bound
(`clean_to_clear`, asked for every step not found, by every fork that probes) evaluated at
every level of its grid in one vectorised call ("grid", the default) and one level at a time
("per level": a call per level, as before; the bounds themselves are today's, which run a
little faster on one level than the old scalar ones did), side by side in one run.

    .venv/bin/python benchmarks/scheduler_cpu.py [--seeds 3] [--jobs long_tape,research_async]

Each job runs as its job file says (the default: no caps) in this process, for each
attribution seed under both schemes (LocalExecutor, the simulated provider in process: the
scheduler, its stages and estimators are the real ones). Printed per job: forks (the two
schemes must run the same forks, by task id, and "per level" must have been called: the
run fails otherwise), CPU seconds in
`Scheduler.suggest`, CPU of the whole run, and per level / grid. Figures go to
benchmarks/results/scheduler_cpu.json.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from statistics import median
from typing import Any

import numpy as np
from _common import DEFAULT_OUT, ROOT, make_console, warn_if_loaded
from rich.table import Table

import car_ray.schedule._mechanism as mechanism
from car_ray._scenario import ensure_tape
from car_ray.bench import _quiet
from car_ray.job import Job, load_job
from car_ray.schedule import Budget, Scheduler
from car_ray.tape import Tape
from car_ray.truth import run_local_scheduler

JOBS = ("long_tape", "research_async", "and_conj", "support_refund", "relay")
GRID = mechanism.clean_to_clear


def per_level(lower: Callable[[np.ndarray], np.ndarray], alpha: float, reach: float = 1.0) -> float:
    """`clean_to_clear` as it was: the top's lower bound asked for at one level at a time."""
    CALLS["per level"] += 1
    c, levels = mechanism._clear_levels(alpha)

    def at(level: float) -> float:
        return float(lower(np.array([level]))[0])

    if at(c) <= 0.0:
        return math.inf
    need = 1.0
    for i, level in enumerate(levels):
        bound = at(float(level)) / reach
        above = float(levels[i + 1]) if i + 1 < len(levels) else 1.0
        if bound >= 1.0:
            continue
        need = max(need, math.ceil(math.log(c / above) / math.log1p(-bound)))
    return need


SCHEMES: dict[str, Callable[..., float]] = {"grid": GRID, "per level": per_level}
CALLS = {"per level": 0}


def one(job: Job, tape: Tape, scheme: str) -> dict[str, Any]:
    """One default run under `scheme`: its forks, verdict notes and CPU seconds."""
    in_suggest = 0.0
    suggest = Scheduler.suggest

    def timed(self: Scheduler, room: int) -> Any:
        nonlocal in_suggest
        start = time.process_time()
        try:
            return suggest(self, room)
        finally:
            in_suggest += time.process_time() - start

    calls = CALLS["per level"]
    mechanism.clean_to_clear = SCHEMES[scheme]  # type: ignore[assignment]
    Scheduler.suggest = timed  # type: ignore[method-assign]
    start = time.process_time()
    try:
        outcome, rows, _ = run_local_scheduler(job, tape, Budget())
    finally:
        Scheduler.suggest = suggest  # type: ignore[method-assign]
        mechanism.clean_to_clear = GRID
    return {
        "forks": outcome.progress.spent.forks,
        "task_ids": [r["task_id"] for r in rows],
        "per_level_calls": CALLS["per level"] - calls,
        "notes": [n for n in outcome.notes if n.startswith("shapley")],
        "suggest_cpu_s": in_suggest,
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
                one(job, tape, "grid")  # warm-up (imports, caches), not counted
            # Each scheme goes first on every other seed: neither gains from the other's warmth.
            for scheme in list(SCHEMES)[:: 1 if seed % 2 == 0 else -1]:
                results.append(
                    {"job": name, "seed": seed, "scheme": scheme, **one(job, tape, scheme)}
                )
    table = Table(title=f"scheduler CPU, default jobs, {args.seeds} seeds each (medians)")
    for col in (
        "job",
        "forks",
        "suggest s, grid",
        "suggest s, per level",
        "per level / grid",
        "run s, grid",
        "run s, per level",
        "per level / grid",
    ):
        table.add_column(col, justify="right")
    summary: dict[str, Any] = {}
    differ: list[str] = []
    for name in args.jobs.split(","):
        runs = {s: [r for r in results if r["job"] == name and r["scheme"] == s] for s in SCHEMES}
        by_seed = {s: sorted(rs, key=lambda r: r["seed"]) for s, rs in runs.items()}
        for a, b in zip(by_seed["grid"], by_seed["per level"], strict=True):
            if (a["task_ids"], a["notes"]) != (b["task_ids"], b["notes"]):
                differ.append(f"{name} seed {a['seed']}: {a['forks']} vs {b['forks']} forks")
            if not b["per_level_calls"]:
                differ.append(f"{name} seed {a['seed']}: per level was never called")
        cell = {
            s: {k: median(r[k] for r in rs) for k in ("forks", "suggest_cpu_s", "run_cpu_s")}
            for s, rs in runs.items()
        }
        summary[name] = cell
        g, p = cell["grid"], cell["per level"]
        table.add_row(
            name,
            f"{g['forks']:g}",
            f"{g['suggest_cpu_s']:.2f}",
            f"{p['suggest_cpu_s']:.2f}",
            f"{p['suggest_cpu_s'] / max(g['suggest_cpu_s'], 1e-9):.1f}x",
            f"{g['run_cpu_s']:.2f}",
            f"{p['run_cpu_s']:.2f}",
            f"{p['run_cpu_s'] / max(g['run_cpu_s'], 1e-9):.1f}x",
        )
    console.print(table)
    for line in differ:
        console.print(f"[bold red]the comparison does not hold:[/] {line}", markup=True)
    DEFAULT_OUT.mkdir(parents=True, exist_ok=True)
    path = DEFAULT_OUT / "scheduler_cpu.json"
    path.write_text(json.dumps({"summary": summary, "runs": results}, indent=2) + "\n")
    console.print(f"wrote {path}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(run())
