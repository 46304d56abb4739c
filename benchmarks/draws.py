"""What a provider that does not couple draws does to the answers: every scenario of
`car-ray validate`'s suite (the noisy one included), its default job over attribution seeds,
on the simulated provider drawing `coupled` (common random numbers: the held game exactly)
and `seeded` (as OpenAI: an identical request with the same seed reproduces, a changed one
is an unrelated sample), side by side in one run. Exact values are those of the game each way
estimates: the held game on the coupled provider, the maximal game off it (`truth.Game`).

    .venv/bin/python benchmarks/draws.py [--seeds 10] [--processes 2] [--jobs a,b]
                                        [--draws coupled,seeded,seeded:live,unseeded]
                                        [--per-step 10]

`--per-step` sets the jobs' fork cap (forks a step of the tape; validate's, 10, by default).

A way is the provider's draws, and off the coupled provider what a held step that chose does
once its request changed: `seeded` keeps its decision as an estimated maximal coupling would
(the job's default, `coupling = "estimated"`), `seeded:live` draws it live (`coupling =
"off"`).

Printed per scenario and way: top-1 right (the rank-1 re-drawn step among the exact top
within validate's TIE, or for a control no step's interval above 0), the whole top credited
(every step of the exact top, both halves of an AND or of an over-determined pair, has its
phi above every other re-drawn step's; for a control, as top-1), the root right (the
verdict's root is an observation or context arm with the highest exact flip, or, where no
such arm's exact flip is above one half, as `results.is_root` asks of a root, it names
none), the share that stopped on an answer, and the median forks; and per way the median
draws a job made off the tape (live draws, a coupling's included; a draw the forks of a
seed shared counts in each, so this is an upper bound on the calls paid for). Figures go
to benchmarks/results/draws.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _common import ANSWERS, ROOT, in_processes, job_cell, make_console, write_figures
from rich.table import Table

WAYS = ("coupled", "seeded", "seeded:live")


def _truth(task: tuple[str, str]) -> tuple[list[int], list[int]]:
    """The exact top and the exact roots of a scenario in a game: the observation or context
    arms with the highest flip, if it is above one half (none: no root, `results.is_root`)."""
    from car_ray.bench import _quiet, _solve, top_exact
    from car_ray.results._verdict import ROOT_KINDS, ROOT_SHARE
    from car_ray.truth import Truth

    _quiet()
    truth = Truth.model_validate_json(_solve(*task))
    flips = {a.step: a.flip for a in truth.arms if a.kind in ROOT_KINDS}
    best = max(flips.values(), default=0.0)
    roots = sorted(k for k, f in flips.items() if best > ROOT_SHARE and f >= best - 1e-9)
    return top_exact(truth), roots


def _game(way: str) -> str:
    """The game a way's jobs estimate (`truth.game_of`; `seeded:live`, drawn live, estimates
    neither, and is scored against the maximal one)."""
    from car_ray.truth import game_of

    return game_of(way.partition(":")[0])


def run(task: tuple[str, str, int, tuple[int, ...], tuple[int, ...], int]) -> dict[str, Any]:
    job_file, way, seed, top, roots, per_step = task
    draws, _, live = way.partition(":")
    from car_ray.bench import _job_and_tape, _quiet, ended, top1
    from car_ray.job import Job
    from car_ray.results import root_cause
    from car_ray.schedule import Budget
    from car_ray.truth import run_local

    _quiet()
    base, tape = _job_and_tape(job_file)
    provider = base.spec.provider.model_copy(update={"sim_draws": draws})
    coupling = "off" if live == "live" else "estimated"
    spec = base.spec.model_copy(
        update={"attribution_seed": seed, "provider": provider, "coupling": coupling}
    )
    began = time.perf_counter()
    # The default job: validate's cap (10 forks a step), or `--per-step`'s.
    budget = Budget(max_forks=per_step * len(tape.steps))
    outcome, rows = run_local(Job(base.path, spec), tape, budget)
    found, right = top1("auto", outcome.attribution, list(top))
    whole = whole_top(outcome.attribution, top) if top else right
    named = root_cause(outcome.attribution)
    root = None if named is None else int(named["step"])
    return {
        "job": base.folder.name,
        "draws": way,
        "seed": seed,
        "steps": len(tape.steps),
        "forks": outcome.progress.spent.forks,
        "ended": ended(outcome.answer, outcome.status),
        "found": found,
        "right": right,
        "whole_top": whole,
        # The verdict's root is an exact root (or there is none, and it names none).
        "root": root,
        "root_right": root in roots if roots else root is None,
        "provider_draws": outcome.answer.provider_draws if outcome.answer else None,
        # Draws a fork made off the tape (live draws, a coupling's included, shared or not).
        "fresh_draws": sum(int(r.get("fresh_draws") or 0) for r in rows),
        "wall_s": round(time.perf_counter() - began, 2),
    }


def whole_top(attribution: list[dict[str, Any]], top: Sequence[int]) -> bool:
    """Whether every step of the exact top has its phi above SLACK and above every other
    re-drawn step's by SLACK (a step without a phi, cleared or not measured, counts as 0)."""
    from car_ray.validate import SLACK

    phi = {
        int(r["step"]): float(r["phi"] or 0.0)
        for r in attribution
        if r["intervention"] == "resample"
    }
    lowest = min(phi.get(step, 0.0) for step in top)
    rest = [v for step, v in phi.items() if step not in top]
    return lowest > SLACK and all(v < lowest - SLACK for v in rest)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--jobs", default="", help="scenario folders, comma-separated")
    parser.add_argument("--draws", default=",".join(WAYS))
    parser.add_argument("--per-step", type=int, default=10, help="the fork cap, per step")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    from car_ray.validate import suite

    files = [str(p) for p in suite(ROOT / "jobs")]
    if args.jobs:
        wanted = set(args.jobs.split(","))
        files = [f for f in files if Path(f).parent.name in wanted]
    ways = args.draws.split(",")
    began = time.perf_counter()
    games = sorted({(f, _game(way)) for f in files for way in ways})
    exact = dict(zip(games, in_processes(_truth, games, args.processes), strict=True))
    tasks = [
        (f, draws, seed, *(tuple(x) for x in exact[(f, _game(draws))]), args.per_step)
        for f in files
        for draws in ways
        for seed in range(args.seeds)
    ]
    results = in_processes(run, tasks, args.processes)
    console = make_console()
    table = Table(
        title=f"default jobs over {args.seeds} attribution seeds at {args.per_step} forks a "
        "step, by provider draws"
    )
    columns = ["scenario", "steps"]
    for draws in ways:
        columns += [
            f"{draws} top-1",
            f"{draws} whole top",
            f"{draws} root",
            f"{draws} answered",
            f"{draws} forks",
        ]
    for column in columns:
        table.add_column(column, justify="left" if column == "scenario" else "right")
    summary: dict[str, Any] = {}
    for f in files:
        name = Path(f).parent.name
        cells: list[str] = []
        steps = 0
        for draws in ways:
            runs = [r for r in results if r["job"] == name and r["draws"] == draws]
            steps = runs[0]["steps"]
            cell = summary[f"{name}/{draws}"] = job_cell(runs)
            cell["whole_top"] = sum(bool(r["whole_top"]) for r in runs)
            cell["root_right"] = sum(bool(r["root_right"]) for r in runs)
            cells += [
                f"{cell['right']}/{len(runs)}",
                f"{cell['whole_top']}/{len(runs)}",
                f"{cell['root_right']}/{len(runs)}",
                f"{cell['answered']}/{len(runs)}",
                f"{cell['median_forks']:g}",
            ]
        table.add_row(name, str(steps), *cells)
    console.print(table)
    for draws in ways:
        runs = [r for r in results if r["draws"] == draws]
        console.print(
            f"{draws}: top-1 right in {sum(r['right'] for r in runs)} of {len(runs)} jobs, "
            f"the whole top credited in {sum(bool(r['whole_top']) for r in runs)}, "
            f"the root right in {sum(bool(r['root_right']) for r in runs)}, "
            f"answered {sum(r['ended'] in ANSWERS for r in runs)}, "
            f"{statistics.median(r['fresh_draws'] for r in runs):g} draws off the tape a job "
            "(median)",
            markup=False,
        )
    figures = {
        "seeds": args.seeds,
        "per_step": args.per_step,
        "ways": ways,
        "summary": summary,
        "runs": results,
    }
    write_figures(console, args.out, "draws.json", figures, began)
    return 0


if __name__ == "__main__":
    sys.exit(main())
