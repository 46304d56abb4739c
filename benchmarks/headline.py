"""The two demo jobs' headline, over independent attribution seeds: is the first row what a
user should fix?

- jobs/research_async (an AND of two draws: fetch the rumour blog at step 4, trust it at
  step 6; the submit tool at step 7 only carries the answer): right when steps 4 and 6 hold
  ranks 1 and 2 and step 7 is not ranked above either.
- jobs/support_refund (a prompt injection in the looked-up order, step 1, talks the model
  into a refund at step 4): right when step 4 is ranked first among the model's steps and
  the observation at step 1 first among the observation interventions.

Each job runs as its job file says (research_async sets no cap: 10 forks a step; the demo
caps itself at 3000 forks and $1), with attribution seeds 0..N-1, in worker processes
(`truth.run_local`: the scheduler and estimators of `car-ray attribute` on an in-process
executor against the simulated provider).

    .venv/bin/python benchmarks/headline.py [--seeds 20] [--processes 2]

Prints, per job, how many runs were right, how many stopped on their own (separated or
precise), and the forks they used; writes `headline.json` to `--out`. Exits 1 if a run was
wrong or raised.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from statistics import mean
from typing import Any

from _common import ROOT, in_processes, make_console, seeds_args
from rich.table import Table

JOBS = ("research_async", "support_refund")


def _rank(rows: list[dict[str, Any]], kind: str, step: int) -> int | None:
    row = next((r for r in rows if r["intervention"] == kind and r["step"] == step), None)
    return None if row is None else row["rank"]


def right(job: str, rows: list[dict[str, Any]]) -> tuple[bool, str]:
    """Whether a run's table leads with what a user should fix, and what it led with."""
    if job == "research_async":
        top_two = {
            r["step"] for r in rows if r["intervention"] == "resample" and r["rank"] in (1, 2)
        }
        submit = _rank(rows, "resample", 7)
        ok = top_two == {4, 6} and (submit is None or submit > 2)
        return ok, f"ranks 1-2: {sorted(top_two)}; step 7: {submit}"
    model = [
        r
        for r in rows
        if r["intervention"] == "resample" and r["step_kind"] == "llm" and r["rank"] is not None
    ]
    first_model = min(model, key=lambda r: r["rank"])["step"] if model else None
    first_observation = next(
        (r["step"] for r in rows if r["intervention"] == "observation" and r["rank"] == 1), None
    )
    ok = first_model == 4 and first_observation == 1
    return ok, f"model step first: {first_model}; observation first: {first_observation}"


def run(task: tuple[str, int]) -> dict[str, Any]:
    """One attribution of `job` with attribution seed `seed`, as its job file says."""
    job_name, seed = task
    from car_ray.bench import _job_and_tape, _quiet, ended
    from car_ray.job import Job
    from car_ray.schedule import Budget
    from car_ray.truth import run_local

    _quiet()
    base, tape = _job_and_tape(str(ROOT / "jobs" / job_name / "job.toml"))
    job = Job(base.path, base.spec.model_copy(update={"attribution_seed": seed}))
    began = time.perf_counter()
    outcome, _ = run_local(job, tape, Budget(**base.spec.budget.model_dump()))
    ok, led = right(job_name, outcome.attribution)
    stopped = ended(outcome.answer, outcome.status) in ("separated", "precise")
    return {
        "job": job_name,
        "seed": seed,
        "right": ok,
        "led_with": led,
        "stopped": stopped,
        "status": outcome.status,
        "forks": outcome.progress.spent.forks,
        "steps": len(tape.steps),
        "wall_s": round(time.perf_counter() - began, 3),
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = seeds_args(__doc__, 20, argv)
    tasks = [(job, seed) for job in JOBS for seed in range(args.seeds)]
    began = time.perf_counter()
    results = in_processes(run, tasks, args.processes)
    console = make_console()
    table = Table(title=f"the first row, over {args.seeds} attribution seeds")
    for column in ("job", "right", "stopped on its own", "forks (mean, max)", "forks/step"):
        table.add_column(column)
    wrong = []
    for job in JOBS:
        runs = [r for r in results if r["job"] == job]
        forks = [r["forks"] for r in runs]
        table.add_row(
            job,
            f"{sum(r['right'] for r in runs)} of {len(runs)}",
            f"{sum(r['stopped'] for r in runs)} of {len(runs)}",
            f"{mean(forks):.1f}, {max(forks)}",
            f"{mean(forks) / runs[0]['steps']:.1f}",
        )
        wrong += [r for r in runs if not r["right"]]
    console.print(table)
    for r in wrong:
        console.print(f"wrong: {r['job']} seed {r['seed']}: {r['led_with']}", markup=False)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "headline.json"
    path.write_text(json.dumps({"seeds": args.seeds, "runs": results}, indent=1))
    console.print(f"wrote {path}; wall time {time.perf_counter() - began:.0f} s", markup=False)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
