"""How often could any test stop a default job? The bound behind "10 forks a step is not
enough for 95%" on a scenario whose top must be told from one rival.

For each scenario, its default job runs over attribution seeds with a stopping rule that
never stops (so every job completes the seeds its cap buys, and the seeds are not chosen by
when a test passed), capped at `--per-step` forks a step. Each complete seed gives the pair's
per-seed difference (the exact top step's phi less the exact runner-up's). Sequences of as
many seeds as such a job completes (the median) are then drawn from those differences, and
for each it says whether, by then:

- shipped: the job's sign test passes (`rules.sign_passes`, valid at every look);
- oracle: the test martingale of the share the jobs measured passes (the likelihood ratio
  of that share, and of its mirror, against a fair coin: the growth-optimal test on signs
  valid at every look, for a test that knew the share; not always the one that stops most
  often by a given seed);
- one look: a two-sided binomial test on the signs at the last seed passes (valid at that
  one look only: about the most any two-sided test on the signs can do by then).

    .venv/bin/python benchmarks/stop_bound.py [--seeds 20] [--per-step 10] [--draws 2000]
                                              [--jobs relay_noisy,support_refund_noisy]

Prints a table and writes `stop_bound.json` to `--out`.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from _common import ROOT, in_processes, make_console, write_figures
from rich.table import Table
from scipy.special import xlogy
from scipy.stats import binom

from car_ray.schedule.rules import Judgement, Look, sign_passes

JOBS = ("relay_noisy", "support_refund_noisy")
ALPHA = 0.05  # a pair's level with one rival (alpha over the m - 1 rivals, m = 2)


class NeverStops:
    """A stopping rule whose top never separates: the job runs to its cap."""

    def judge(self, phi: np.ndarray, look: Look) -> Judgement:
        lead = int(np.argmax(phi.mean(axis=0)))
        return Judgement(lead, [lead], look.alpha, [("zero", lead, lead)])


def _pair(job_file: str) -> tuple[int, int]:
    """The exact top step and the exact runner-up (by phi) of a scenario's held game."""
    from car_ray.bench import _quiet, _solve
    from car_ray.truth import Truth

    _quiet()
    truth = Truth.model_validate_json(_solve(job_file))
    ranked = sorted(truth.steps, key=lambda s: -s.phi)
    return ranked[0].step, ranked[1].step


def run(task: tuple[str, int, int, int, int]) -> dict[str, Any]:
    job_file, seed, per_step, top, rival = task
    from car_ray.bench import _job_and_tape, _quiet
    from car_ray.job import Job
    from car_ray.schedule import SHIPPED_RULES, Budget
    from car_ray.truth import run_local_scheduler

    _quiet()
    base, tape = _job_and_tape(job_file)
    job = Job(base.path, base.spec.model_copy(update={"attribution_seed": seed}))
    rules = replace(SHIPPED_RULES, stop=NeverStops())
    budget = Budget(max_forks=per_step * len(tape.steps))
    _, _, scheduler = run_local_scheduler(job, tape, budget, rules=rules)
    shap = scheduler.results.shapley
    diffs: list[float] = []
    if shap is not None and {top, rival} <= set(shap.candidates):
        phi = shap.per_seed_phi
        i, j = shap.candidates.index(top), shap.candidates.index(rival)
        diffs = [float(d) for d in phi[:, i] - phi[:, j]]
    return {"job": Path(job_file).parent.name, "seed": seed, "diffs": diffs}


def _oracle(wins: int, losses: int, share: float) -> float:
    """log of the test martingale of `share` and its mirror (half each) against 1/2 (a share
    of 0 or 1 makes a seed that goes the other way worth nothing: -inf)."""
    a = xlogy(wins, 2 * share) + xlogy(losses, 2 * (1 - share))
    b = xlogy(wins, 2 * (1 - share)) + xlogy(losses, 2 * share)
    return float(np.logaddexp(a, b)) - math.log(2)


def rates(diffs: np.ndarray, seeds: int, draws: int, rng: np.random.Generator) -> dict[str, float]:
    """The share of `draws` sequences of `seeds` differences each test stops by their end."""
    ahead, behind = float((diffs > 0).mean()), float((diffs < 0).mean())
    passed = {"shipped": 0, "oracle": 0, "one look": 0}
    if ahead + behind == 0:
        return {name: 0.0 for name in passed}  # the pair never differs: no test on signs stops
    share = ahead / (ahead + behind)
    for _ in range(draws):
        x = rng.choice(diffs, size=seeds)
        wins, losses = np.cumsum(x > 0), np.cumsum(x < 0)
        for name, passes in (
            ("shipped", lambda w, lo: sign_passes(w, lo, ALPHA)),
            ("oracle", lambda w, lo: w > lo and _oracle(w, lo, share) >= -math.log(ALPHA)),
        ):
            if any(passes(int(w), int(lo)) for w, lo in zip(wins, losses, strict=True)):
                passed[name] += 1
        w, lo = int(wins[-1]), int(losses[-1])
        if w > lo and 2 * binom.sf(w - 1, w + lo, 0.5) <= ALPHA:
            passed["one look"] += 1
    return {name: n / draws for name, n in passed.items()}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--per-step", type=int, default=10)
    parser.add_argument("--draws", type=int, default=2000)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--jobs", default=",".join(JOBS))
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    began = time.perf_counter()
    files = [str(ROOT / "jobs" / name / "job.toml") for name in args.jobs.split(",")]
    pairs = dict(zip(files, in_processes(_pair, files, args.processes), strict=True))
    tasks = [(f, s, args.per_step, *pairs[f]) for f in files for s in range(args.seeds)]
    results = in_processes(run, tasks, args.processes)
    rng = np.random.default_rng(0)
    console = make_console()
    table = Table(
        title=f"stopping by the seeds a job capped at {args.per_step} forks a step completes"
    )
    for column in ("scenario", "pair", "seeds", "differ", "ahead", "shipped", "oracle", "1 look"):
        table.add_column(column, justify="left" if column == "scenario" else "right")
    summary: dict[str, Any] = {}
    for f in files:
        name = Path(f).parent.name
        runs = [r for r in results if r["job"] == name and r["diffs"]]
        if not runs:
            console.print(f"{name}: no job measured both steps of the pair {pairs[f]}")
            continue
        diffs = np.array([d for r in runs for d in r["diffs"]])
        seeds = int(statistics.median(len(r["diffs"]) for r in runs))
        differ = float((diffs != 0).mean())
        ahead = float((diffs > 0).sum() / max(1, (diffs != 0).sum()))
        cell = rates(diffs, seeds, args.draws, rng)
        summary[name] = {
            "pair": pairs[f],
            "jobs": len(runs),
            "pooled_seeds": int(diffs.size),
            "seeds": seeds,
            "differ": differ,
            "ahead": ahead,
            **cell,
        }
        table.add_row(
            name,
            f"{pairs[f][0]} / {pairs[f][1]}",
            str(seeds),
            f"{differ:.0%}",
            f"{ahead:.0%}",
            *(f"{cell[k]:.0%}" for k in ("shipped", "oracle", "one look")),
        )
    console.print(table)
    figures = {"seeds": args.seeds, "per_step": args.per_step, "draws": args.draws}
    write_figures(console, args.out, "stop_bound.json", {**figures, "summary": summary}, began)
    return 0


if __name__ == "__main__":
    sys.exit(main())
