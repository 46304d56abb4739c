"""Default jobs that end on their budget before the top separated: does the cap their note
suggests (`--max-forks`, the projection and half as many again) separate it?

For each scenario and attribution seed, the job runs as a user's default job would (no
caps: 10 forks a step). A job that stopped on its own is counted and left. A job whose
budget ended first has a note that says why and about how many more forks would separate
its top; the benchmark then goes on as the note says, resuming from the job's rows (the
scheduler of `car-ray attribute` given the rows already written, as a rerun with a larger
`--max-forks` is), at the suggested cap and at the bare projection, and counts which
separated (or became precise).

    .venv/bin/python benchmarks/go_on.py [--seeds 80] [--processes 2]

Prints a table per scenario and writes `go_on.json` to `--out`.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from _common import ROOT, in_processes, make_console, seeds_args
from rich.table import Table

# The scenarios whose default jobs do not always stop on their own (the others always do).
SCENARIOS = (
    "and_conj",
    "support_refund",
    "research_async",
    "relay",
    "overdetermined",
    "policy_fix",
)
STOPPED = ("separated", "precise")


def _resumed(job: Any, tape: Any, rows: list[dict[str, Any]], cap: int) -> str:
    """How the job ends when run on from `rows` under a fork cap of `cap` in all."""
    from car_ray.bench import ended
    from car_ray.schedule import Budget
    from car_ray.truth import run_local_scheduler

    outcome, _, _ = run_local_scheduler(job, tape, Budget(max_forks=cap), already=rows)
    return ended(outcome.answer, outcome.status) or outcome.status


def run(task: tuple[str, int]) -> dict[str, Any]:
    name, seed = task
    from car_ray.bench import _job_and_tape, _quiet, ended
    from car_ray.job import Job
    from car_ray.schedule import Budget
    from car_ray.truth import run_local_scheduler

    _quiet()
    base, tape = _job_and_tape(str(ROOT / "jobs" / name / "job.toml"))
    job = Job(base.path, base.spec.model_copy(update={"attribution_seed": seed}))
    outcome, rows, _ = run_local_scheduler(job, tape, Budget())
    spent = outcome.progress.spent.forks
    result: dict[str, Any] = {
        "scenario": name,
        "seed": seed,
        "ended": ended(outcome.answer, outcome.status),
        "forks": spent,
    }
    if result["ended"] != "budget":
        return result
    note = next((n for n in outcome.notes if n.kind == "shapley"), None)
    if note is None or "projected_forks" not in note.figures:
        return result  # the budget ended before the screen, or with no projection
    result["note"] = note.text
    result["projected"] = note.figures["projected_forks"]
    result["suggested"] = note.figures["suggested_more"]
    result["at_suggested"] = _resumed(job, tape, rows, spent + result["suggested"])
    result["at_projected"] = _resumed(job, tape, rows, spent + result["projected"])
    return result


def main(argv: Sequence[str] | None = None) -> int:
    args = seeds_args(__doc__, 80, argv)
    tasks = [(name, seed) for name in SCENARIOS for seed in range(args.seeds)]
    began = time.perf_counter()
    results = in_processes(run, tasks, args.processes)
    console = make_console()
    table = Table(title=f"default jobs over {args.seeds} attribution seeds, and going on")
    for column in (
        "scenario",
        "stopped on its own",
        "ended on its budget",
        "with a projection",
        "separated at the suggested cap",
        "at the projection alone",
    ):
        table.add_column(column)
    total = {"projection": 0, "suggested": 0, "projected": 0}
    for name in SCENARIOS:
        runs = [r for r in results if r["scenario"] == name]
        ended = [r for r in runs if r["ended"] == "budget"]
        projected = [r for r in ended if "projected" in r]
        at_suggested = sum(r["at_suggested"] in STOPPED for r in projected)
        at_projected = sum(r["at_projected"] in STOPPED for r in projected)
        total["projection"] += len(projected)
        total["suggested"] += at_suggested
        total["projected"] += at_projected
        table.add_row(
            name,
            f"{sum(r['ended'] in STOPPED for r in runs)} of {len(runs)}",
            str(len(ended)),
            str(len(projected)),
            str(at_suggested),
            str(at_projected),
        )
    table.add_row(
        "all",
        "",
        "",
        str(total["projection"]),
        str(total["suggested"]),
        str(total["projected"]),
    )
    console.print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "go_on.json"
    path.write_text(json.dumps({"seeds": args.seeds, "total": total, "runs": results}, indent=1))
    console.print(f"wrote {path}; wall time {time.perf_counter() - began:.0f} s", markup=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
