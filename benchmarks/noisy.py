"""Agents whose every step varies its wording: what holding decisions instead of whole actions
buys. Each noisy scenario's default job (10 forks a step) runs over attribution seeds twice,
as its job file says (`hold = "decisions"`) and holding actions (whole texts, the default of
a job that sets nothing), side by side in one run.

    .venv/bin/python benchmarks/noisy.py [--seeds 10] [--processes 2] [--jobs a,b]

Printed per scenario and way: the median forks a job spent, the share that stopped on an
answer (separated, precise, or nothing to blame), and the share whose rank 1 is among the
scenario's planted steps (for a control: no rank 1). Figures go to
benchmarks/results/noisy.json.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import Any

from _common import ROOT, in_processes, job_cell, make_console, seeds_args, write_figures
from rich.table import Table

JOBS = (
    "checklist_sparse_30",
    "checklist_sparse_100",
    "checklist_dense",
    "and_conj_noisy",
    "relay_noisy",
    "overdetermined_noisy",
    "null_control_noisy",
    "support_refund_noisy",
)
WAYS = ("decisions", "actions")
# Holding actions, a 101-step job runs the group game's rounds (about 260 forks of a slow
# agent: many minutes a job here in one process): that way is measured on the shorter tapes
# only, and on longer ones by benchmarks/groups.py.
DECISIONS_ONLY = ("checklist_sparse_100",)


def run(task: tuple[str, str, int]) -> dict[str, Any]:
    name, hold, seed = task
    from car_ray.bench import _job_and_tape, _quiet, ended
    from car_ray.job import Job
    from car_ray.schedule import Budget
    from car_ray.truth import run_local
    from car_ray.validate import _scenario

    _quiet()
    base, tape = _job_and_tape(str(ROOT / "jobs" / name / "job.toml"))
    spec = base.spec.model_copy(update={"attribution_seed": seed, "hold": hold})
    job = Job(base.path, spec)
    began = time.perf_counter()
    outcome, _ = run_local(job, tape, Budget(**base.spec.budget.model_dump()))
    planted = set(_scenario(base).get("planted", {}).get("resample", []))
    first = [
        r["step"]
        for r in outcome.attribution
        if r["intervention"] == "resample" and r["rank"] == 1 and (r["phi"] or 0) > 0
    ]
    right = set(first) <= planted and bool(first) == bool(planted)
    return {
        "job": name,
        "hold": hold,
        "seed": seed,
        "steps": len(tape.steps),
        "forks": outcome.progress.spent.forks,
        "ended": ended(outcome.answer, outcome.status),
        "right": right,
        "wall_s": round(time.perf_counter() - began, 2),
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = seeds_args(__doc__, 10, argv)
    jobs = JOBS
    began = time.perf_counter()
    tasks = [
        (name, hold, seed)
        for name in jobs
        for hold in WAYS
        for seed in range(args.seeds)
        if hold == "decisions" or name not in DECISIONS_ONLY
    ]
    results = in_processes(run, tasks, args.processes)
    console = make_console()
    table = Table(title=f"noisy scenarios, default jobs over {args.seeds} attribution seeds")
    for column in ("scenario", "steps", "hold", "median forks", "answered", "rank 1 planted"):
        table.add_column(column, justify="left" if column in ("scenario", "hold") else "right")
    summary: dict[str, Any] = {}
    for name in jobs:
        for hold in WAYS:
            runs = [r for r in results if r["job"] == name and r["hold"] == hold]
            if not runs:
                continue
            cell = job_cell(runs)
            summary[f"{name}/{hold}"] = cell
            table.add_row(
                name,
                str(runs[0]["steps"]),
                hold,
                f"{cell['median_forks']:g}",
                f"{cell['answered']} of {len(runs)}",
                f"{cell['right']} of {len(runs)}",
            )
    console.print(table)
    figures = {"seeds": args.seeds, "summary": summary, "runs": results}
    write_figures(console, args.out, "noisy.json", figures, began)
    return 0


if __name__ == "__main__":
    sys.exit(main())
