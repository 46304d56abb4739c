"""Forks against the number of steps, on tapes whose every step changes its words at every
re-draw (as a real model's do): a checklist review (jobs/checklist) of N items, every model
step worded a thousand ways (`sim.Worded`, the "fresh" class: a re-draw almost never repeats
the recorded text), one planted item in the middle that re-drawing clears 70% of the time
(with --and, also an AND: two items side by side in the middle, each waived with
probability 0.3, the payout going out only when both are; exact phi 0.455 each).
Each tape is recorded here (the first recording seed whose run fails), and its default job
(10 forks a step) runs over attribution seeds two ways: holding whole actions (a job that
names nothing, so every step leaves the tape at every re-draw: the group game's case) and
holding decisions (the job names them: the deviation screen reads through the words).

    .venv/bin/python benchmarks/groups.py [--seeds 4] [--items 5,15,50] [--and] [--processes 2]

Printed per tape and way: steps, the median forks a job spent, how many stopped on an answer
(separated, precise or nothing to blame), and how many ranked the planted step first (for
the AND: both halves above every other step).
Figures go to benchmarks/results/groups.json. To compare with a checkout before the group
game, run this file with PYTHONPATH set to that checkout (its car_ray is imported first).
"""

from __future__ import annotations

import argparse
import itertools
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from statistics import median
from typing import Any

from _common import (
    DEFAULT_OUT,
    ROOT,
    in_processes,
    job_cell,
    make_console,
    record_demo_tape,
    write_figures,
)
from rich.table import Table

WAYS = ("actions", "decisions")
SCRATCH = Path("/tmp/car-ray-groups-bench")
PLANTED_WAIVES = 0.3  # the planted item is waived (the failure) with this probability

JOB = """agent = "checklist.agent:review_agent"
scorer = "checklist.agent:payout_released"
policy = "{name}:POLICY"
tape = "{name}.tape"
seed = {seed}
decision_text = ['^(.*?)\\n\\n-- ']

[input]
payout = "P-7731"
items = {items}
threshold = {threshold}

[[interventions]]
kind = "resample"
"""

POLICY = """from checklist.policy import Checklist

from car_ray.sim import Worded

POLICY = Worded(Checklist(items={items}, planted={planted}), wordings=1000)
"""


def _name(items: int, kind: str) -> str:
    return f"words_{items}" if kind == "one" else f"and_{items}"


def _planted(items: int, kind: str) -> list[int]:
    """The planted items (their steps are twice the item: a note before each)."""
    return [items // 2] if kind == "one" else [items // 2, items // 2 + 1]


def tape_for(items: int, kind: str = "one") -> Path:
    """The job file of the N-item tape (`kind` "one" planted item or an "and" of two),
    recorded on first use with the first seed whose run fails."""
    from car_ray._aio import run as run_async
    from car_ray.job import load_job
    from car_ray.replay import BaseUrls, is_bad, recorded_trajectory
    from car_ray.sim import SimServer

    name = _name(items, kind)
    folder = SCRATCH / name
    job_file = folder / "job.toml"
    if job_file.exists():
        return job_file
    folder.mkdir(parents=True, exist_ok=True)
    link = SCRATCH / "checklist"
    if not link.exists():
        link.symlink_to(ROOT / "jobs" / "checklist")
    planted = dict.fromkeys(_planted(items, kind), PLANTED_WAIVES)
    (folder / f"{name}.py").write_text(POLICY.format(items=items, planted=planted))
    threshold = len(planted)
    for seed in range(200):
        job_file.write_text(JOB.format(items=items, seed=seed, name=name, threshold=threshold))
        job = load_job(job_file)
        tape_path = folder / f"{name}.tape"
        with SimServer(job.load("policy")) as sim:
            tape = run_async(record_demo_tape(job, BaseUrls.for_server(sim.url), tape_path))
        if is_bad(job.load("scorer")(tape.seal.result, recorded_trajectory(tape))):
            return job_file
        tape_path.unlink()
    raise RuntimeError(f"no recording seed below 200 fails with {items} items")


def run(task: tuple[int, str, str, int]) -> dict[str, Any]:
    items, kind, hold, seed = task
    from car_ray.bench import _job_and_tape, _quiet, ended
    from car_ray.job import Job
    from car_ray.schedule import Budget
    from car_ray.truth import run_local

    _quiet()
    base, tape = _job_and_tape(str(SCRATCH / _name(items, kind) / "job.toml"))
    update: dict[str, Any] = {"attribution_seed": seed, "hold": hold}
    spec = base.spec.model_copy(update=update)
    job = Job(base.path, spec)
    began = time.perf_counter()
    outcome, rows = run_local(job, tape, Budget(**base.spec.budget.model_dump()))
    planted = {2 * item for item in _planted(items, kind)}
    ranked = sorted(
        (r for r in outcome.attribution if r["intervention"] == "resample" and r["phi"]),
        key=lambda r: -r["phi"],
    )
    top = {r["step"] for r in ranked[: len(planted)] if r["phi"] > 0}
    return {
        "items": items,
        "kind": kind,
        "steps": len(tape.steps),
        "hold": hold,
        "seed": seed,
        "forks": outcome.progress.spent.forks,
        "group_forks": sum(1 for r in rows if r.get("stage") == "groups"),
        # Forks of rounds gone on for a verdict's clearance (among group_forks).
        "going_on_forks": sum(
            n.figures.get("forks", 0) for n in outcome.notes if n.kind == "groups_on"
        ),
        "ended": ended(outcome.answer, outcome.status),
        "right": top == planted,
        "wall_s": round(time.perf_counter() - began, 2),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--items", default="5,15,50")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--fresh", action="store_true", help="record the tapes again")
    parser.add_argument("--and", dest="and_", action="store_true", help="also the AND tapes")
    parser.add_argument("--ways", default=",".join(WAYS), help="actions, decisions or both")
    args = parser.parse_args(argv)
    sizes = [int(x) for x in args.items.split(",")]
    if args.fresh:
        shutil.rmtree(SCRATCH, ignore_errors=True)
    began = time.perf_counter()
    kinds = ("one", "and") if args.and_ else ("one",)
    ways = [w for w in args.ways.split(",") if w]
    for items in sizes:
        for kind in kinds:
            tape_for(items, kind)
    tasks = [
        (n, kind, hold, seed)
        for n in sizes
        for kind in kinds
        for hold in ways
        for seed in range(args.seeds)
    ]
    results = in_processes(run, tasks, args.processes)
    console = make_console()
    table = Table(title=f"worded checklists, default jobs over {args.seeds} attribution seeds")
    columns = (
        "steps",
        "planted",
        "hold",
        "median forks",
        "of them groups",
        "went on",
        "answered",
        "top right",
    )
    for column in columns:
        table.add_column(column, justify="left" if column in ("hold", "planted") else "right")
    summary: dict[str, Any] = {}
    for items, kind, hold in itertools.product(sizes, kinds, ways):
        runs = [
            r for r in results if r["items"] == items and r["kind"] == kind and r["hold"] == hold
        ]
        cell = {
            **job_cell(runs),
            "steps": runs[0]["steps"],
            "median_group_forks": median(r["group_forks"] for r in runs),
            "went_on": sum(1 for r in runs if r["going_on_forks"]),
        }
        summary[f"{items}/{kind}/{hold}"] = cell
        table.add_row(
            str(cell["steps"]),
            kind,
            hold,
            f"{cell['median_forks']:g}",
            f"{cell['median_group_forks']:g}",
            f"{cell['went_on']} of {len(runs)}",
            f"{cell['answered']} of {len(runs)}",
            f"{cell['right']} of {len(runs)}",
        )
    console.print(table)
    figures = {"seeds": args.seeds, "summary": summary, "runs": results}
    write_figures(console, args.out, "groups.json", figures, began)
    return 0


if __name__ == "__main__":
    sys.exit(main())
