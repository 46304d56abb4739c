"""Would another stopping rule let more default jobs stop? The shipped verdict beside two
that know the job's horizon, in one run.

A default job (no caps: 10 forks a step) stops when its top is separated; on six scenarios
some jobs end on their budget first (`benchmarks/go_on.py`). This runs those six under each
rule, over attribution seeds, and counts the jobs that stopped on their own, the jobs whose
first row is an exact top step, and the forks they used; and, for each rule, how often an
exact tie (steps 2 and 5 each clear the failure with probability 0.2, so their exact phi are
equal) is called separated when the verdict is looked at after each of up to 60 seeds.

- shipped: each pair of the top and a rival by the sign test (a test martingale of a fair
  coin, valid at every look) and the t interval of the paired differences (`SeedShapley`).
- horizon: each pair by one test that knows how far the job can go: the sum of the paired
  differences against a constant boundary c s sqrt(N), N the seeds the job's caps are
  projected to buy (the seeds so far and the forks left at the forks a seed has cost, never
  lowered), s their standard deviation, c from P(sup |B_t| >= c, t <= 1) = alpha for a
  Brownian motion (a truncated O'Brien-Fleming design: valid on the normal approximation,
  with a horizon taken from the data).
- split: horizon at 0.7 alpha, or the shipped tests at 0.3 alpha.

The two other rules are what-ifs patched in here, not settings of car-ray.

    .venv/bin/python benchmarks/stop_rules.py [--seeds 40] [--processes 2]

Prints a table and writes `stop_rules.json` to `--out`.
"""

from __future__ import annotations

import functools
import json
import math
import random
import sys
import time
from collections.abc import Sequence
from statistics import mean
from typing import Any

import numpy as np
from _common import ROOT, in_processes, make_console, seeds_args
from go_on import SCENARIOS, STOPPED
from rich.table import Table

RULES = ("shipped", "horizon", "split")
SPLIT = 0.7  # the share of alpha the split rule gives its horizon test
TIE_RUNS = 1000
TIE_SEEDS = 60


@functools.cache
def _boundary(alpha: float) -> float:
    """c with P(sup_{t <= 1} |B_t| >= c) = alpha (the two-sided series for a Brownian
    motion's maximum modulus), by bisection."""

    def crossing(c: float) -> float:
        terms = (
            (-1) ** k / (2 * k + 1) * math.exp(-((2 * k + 1) ** 2) * math.pi**2 / (8 * c * c))
            for k in range(60)
        )
        return 1 - 4 / math.pi * sum(terms)

    low, high = 0.5, 6.0
    for _ in range(70):
        mid = (low + high) / 2
        low, high = (mid, high) if crossing(mid) > alpha else (low, mid)
    return high


def _horizon_passes(diff: np.ndarray, alpha: float, horizon: float) -> bool:
    from car_ray.schedule._mechanism import MIN_SEEDS

    n = diff.size
    total = float(diff.sum())
    if n < MIN_SEEDS or total <= 0:
        return False
    # A floor of 1/n on the variance: four identical seeds are no spread known to be 0.
    spread = math.sqrt(max(float(diff.var(ddof=1)), 1.0 / n))
    return total >= _boundary(alpha) * spread * math.sqrt(max(horizon, n))


def apply(rule: str) -> None:
    """Patch this process's `SeedShapley` and `HeldShapley` to run `rule`."""
    if rule == "shipped":
        return
    from car_ray.schedule import _mechanism, _stages

    share = 1.0 if rule == "horizon" else SPLIT

    def failing(
        self: Any, phi: np.ndarray
    ) -> tuple[int, list[int], float, list[tuple[str, int, int]]]:
        lead, top, rest, pair_alpha = self._split(phi)
        out = [("zero", j, j) for j in top if (self._phi_interval(phi[:, j]).low or 0.0) <= 0]
        horizon = getattr(self, "horizon", None) or phi.shape[0]
        for i in top:
            for j in rest:
                diff = phi[:, i] - phi[:, j]
                ok = _horizon_passes(diff, pair_alpha * share, horizon)
                if not ok and share < 1.0:
                    rest_alpha = pair_alpha * (1 - share)
                    ok = _mechanism._signs_agree(diff, rest_alpha) and _mechanism._apart(
                        diff, rest_alpha
                    )
                if not ok:
                    out.append(("signs", i, j))
        return lead, top, pair_alpha, out

    seeds = _stages.HeldShapley._seeds

    def projecting(self: Any, room: int) -> Any:
        shap, left = self.shap, self.job.forks_left()
        if left is not None:
            per_seed = max(1.0, shap.forks_per_seed())
            ahead = len(shap.complete_seeds()) + (left + len(self.pending)) / per_seed
            shap.horizon = max(getattr(shap, "horizon", 0.0) or 0.0, ahead)
        return seeds(self, room)

    _mechanism.SeedShapley._failing = failing  # type: ignore[method-assign]
    _stages.HeldShapley._seeds = projecting  # type: ignore[method-assign]


def run(task: tuple[str, str, int, list[int]]) -> dict[str, Any]:
    rule, name, seed, top = task
    apply(rule)
    from car_ray.bench import _job_and_tape, _quiet, _verdict, top1
    from car_ray.job import Job
    from car_ray.schedule import Budget
    from car_ray.truth import run_local_scheduler

    _quiet()
    base, tape = _job_and_tape(str(ROOT / "jobs" / name / "job.toml"))
    job = Job(base.path, base.spec.model_copy(update={"attribution_seed": seed}))
    outcome, _, _ = run_local_scheduler(job, tape, Budget())
    first, right = top1("auto", outcome.attribution, top)
    return {
        "rule": rule,
        "scenario": name,
        "seed": seed,
        "ended": _verdict(outcome.notes),
        "forks": outcome.progress.spent.forks,
        "first": first,
        "right": right,
    }


def tie(rule: str) -> dict[str, Any]:
    """How often the verdict, looked at after each seed, names one of two tied steps."""
    apply(rule)
    from car_ray.schedule._mechanism import SeedShapley

    draws = random.Random(11)
    wrong = 0
    for r in range(TIE_RUNS):
        shap = SeedShapley([2, 5], 0.05, salt=f"tie{r}")
        shap.horizon = TIE_SEEDS  # type: ignore[attr-defined]
        for seed in range(TIE_SEEDS):
            u = {k: draws.random() for k in (2, 5)}
            for coalition in shap.coalitions(seed):
                shap.observe(seed, coalition, any(u[k] < 0.2 for k in coalition))
            verdict = shap.verdict(0.0)
            if verdict is not None:
                wrong += verdict[1] != [2, 5]
                break
    return {"rule": rule, "wrong": wrong / TIE_RUNS}


def _tops() -> dict[str, list[int]]:
    from car_ray.bench import _quiet, _solve, top_exact
    from car_ray.truth import Truth

    _quiet()

    return {
        name: top_exact(Truth.model_validate_json(_solve(str(ROOT / "jobs" / name / "job.toml"))))
        for name in SCENARIOS
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = seeds_args(__doc__, 40, argv)
    began = time.perf_counter()
    tops = _tops()
    tasks = [
        (rule, name, seed, tops[name])
        for rule in RULES
        for name in SCENARIOS
        for seed in range(args.seeds)
    ]
    results = in_processes(run, tasks, args.processes)
    ties = {r["rule"]: r["wrong"] for r in in_processes(tie, list(RULES), args.processes)}
    console = make_console()
    table = Table(
        title=f"default jobs over attribution seeds 0-{args.seeds - 1}: stopped on their own / "
        "first row an exact top step / mean forks"
    )
    table.add_column("scenario")
    for rule in RULES:
        table.add_column(rule, justify="right")
    for name in (*SCENARIOS, "all"):
        cells = []
        for rule in RULES:
            runs = [r for r in results if r["rule"] == rule and name in (r["scenario"], "all")]
            stopped = sum(r["ended"] in STOPPED for r in runs)
            right = sum(r["right"] for r in runs)
            cells.append(
                f"{stopped} / {right} of {len(runs)} / {mean(r['forks'] for r in runs):.1f}"
            )
        table.add_row(name, *cells)
    table.add_row(
        f"a tie called separated ({TIE_RUNS} runs)", *(f"{ties[rule]:.1%}" for rule in RULES)
    )
    console.print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "stop_rules.json"
    path.write_text(json.dumps({"seeds": args.seeds, "ties": ties, "runs": results}, indent=1))
    console.print(f"wrote {path}; wall time {time.perf_counter() - began:.0f} s", markup=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
