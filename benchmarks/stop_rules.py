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
- horizon: each pair by one test that knows how far the job can go, in place of the sign
  test and the t interval both (in telling the top from the rest and in separating it):
  the sum of the paired differences against a constant boundary c s sqrt(N), N the seeds
  the job's caps are projected to buy (the seeds so far and those the forks left buy at the
  forks a seed has cost, never lowered), s their standard deviation, c from
  P(sup |B_t| >= c, t <= 1) = alpha for a Brownian motion (a truncated O'Brien-Fleming
  design: valid on the normal approximation, with a horizon taken from the data).
- split: a pair passes horizon's test at 0.7 alpha, or the shipped tests at 0.3 alpha.

For the scenarios whose shipped jobs end on a game of the top and one rival, it also says
how often even the most powerful test at a fixed number of seeds, knowing the top and the
per-seed rates these jobs measured, would miss the pair at the seeds a budget-ended job had.

The two other rules are what-ifs defined here and passed to the jobs as their stopping rule
(`ShapleyRules.stop`), not settings of car-ray.

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
from dataclasses import dataclass, replace
from statistics import mean
from typing import Any

import numpy as np
from _common import ROOT, in_processes, make_console, seeds_args
from go_on import SCENARIOS, STOPPED
from rich.table import Table

from car_ray.schedule import SHIPPED_RULES, ShapleyResult, ShapleyRules
from car_ray.schedule._tuning import MIN_SEEDS
from car_ray.schedule.rules import Failing, Judgement, Look, apart, signs_agree

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
    n = diff.size
    total = float(diff.sum())
    if n < MIN_SEEDS or total <= 0:
        return False
    # A floor of 1/n on the variance: four identical seeds are no spread known to be 0.
    spread = math.sqrt(max(float(diff.var(ddof=1)), 1.0 / n))
    return total >= _boundary(alpha) * spread * math.sqrt(max(horizon, n))


@dataclass(frozen=True)
class HorizonRule:
    """A stopping rule that knows the job's horizon (`rules.Look.horizon`, the seeds the
    caps are projected to buy): each pair of the top and a rival by `_horizon_passes` at
    `share` of its level, in place of the sign test and t interval both (in telling the
    top from the rest and in separating it), or, with `share` below 1, the shipped tests at
    the rest of its level."""

    share: float

    def apart(self, diff: np.ndarray, pair_alpha: float, horizon: float) -> bool:
        if _horizon_passes(diff, pair_alpha * self.share, horizon):
            return True
        if self.share == 1.0:
            return False
        rest = pair_alpha * (1 - self.share)
        return signs_agree(diff, rest) and apart(diff, rest)

    def judge(self, phi: np.ndarray, look: Look) -> Judgement:
        m = phi.shape[1]
        lead = int(np.argmax(phi.mean(axis=0)))
        pair_alpha = look.alpha / max(1, m - 1)
        horizon = look.horizon or phi.shape[0]
        top = [
            j
            for j in range(m)
            if j == lead or not self.apart(phi[:, lead] - phi[:, j], pair_alpha, horizon)
        ]
        failing: list[Failing] = [("zero", j, j) for j in top if look.phi_low(phi[:, j]) <= 0]
        for i in top:
            for j in range(m):
                if j not in top and not self.apart(phi[:, i] - phi[:, j], pair_alpha, horizon):
                    failing.append(("signs", i, j))
        return Judgement(lead, top, pair_alpha, failing)


def rules_of(rule: str) -> ShapleyRules:
    """The Shapley rules a job runs under `rule`: the shipped ones, with the stopping rule
    replaced for the two what-ifs."""
    if rule == "shipped":
        return SHIPPED_RULES
    return replace(SHIPPED_RULES, stop=HorizonRule(1.0 if rule == "horizon" else SPLIT))


def run(task: tuple[str, str, int, list[int]]) -> dict[str, Any]:
    rule, name, seed, top = task
    from car_ray.bench import _job_and_tape, _quiet, ended, top1
    from car_ray.job import Job
    from car_ray.schedule import Budget
    from car_ray.truth import run_local_scheduler

    _quiet()
    base, tape = _job_and_tape(str(ROOT / "jobs" / name / "job.toml"))
    job = Job(base.path, base.spec.model_copy(update={"attribution_seed": seed}))
    outcome, _, scheduler = run_local_scheduler(job, tape, Budget(), rules=rules_of(rule))
    first, right = top1("auto", outcome.attribution, top)
    return {
        "rule": rule,
        "scenario": name,
        "seed": seed,
        "ended": ended(outcome.answer, outcome.status),
        "forks": outcome.progress.spent.forks,
        "first": first,
        "right": right,
        "pair": _pair(scheduler.results.shapley, top),
    }


def _pair(shapley: ShapleyResult | None, top: list[int]) -> list[int] | None:
    """A game of two candidates, one of them the exact top: the seeds where the top's phi
    came out above the other's, below it, and all the complete seeds."""
    if shapley is None or len(shapley.candidates) != 2:
        return None
    candidates = list(shapley.candidates)
    if len(set(top) & set(candidates)) != 1:
        return None
    phi = shapley.per_seed_phi
    i = candidates.index(next(k for k in top if k in candidates))
    diff = phi[:, i] - phi[:, 1 - i]
    return [int((diff > 0).sum()), int((diff < 0).sum()), int(diff.size)]


def one_look_miss(wins: float, losses: float, seeds: int, alpha: float) -> float:
    """How often the most powerful test of a pair at level alpha misses it: a test that
    knows the top and the chance of each seed being a win or a loss, and looks once, at
    `seeds` seeds (the randomized one-sided sign test on the seeds where the two differ,
    the most powerful given their number: Neyman-Pearson)."""
    from scipy.stats import binom

    differ, share = wins + losses, wins / (wins + losses)
    power = 0.0
    for d in range(1, seeds + 1):
        # The fewest wins whose tail beyond is within alpha under a fair coin (scipy's isf of
        # a discrete law: checked exact for d < 200 at 5% and 2.5%).
        cut = int(binom.isf(alpha, d, 0.5))
        at = float(binom.pmf(cut, d, 0.5))
        chance = (alpha - float(binom.sf(cut, d, 0.5))) / at if at > 0 else 0.0
        hit = float(binom.sf(cut, d, share)) + chance * float(binom.pmf(cut, d, share))
        power += float(binom.pmf(d, seeds, differ)) * hit
    return 1.0 - power


def tie(rule: str) -> dict[str, Any]:
    """How often the verdict, looked at after each seed, names one of two tied steps."""
    from car_ray.schedule import SeedShapley

    draws = random.Random(11)
    wrong = 0
    for r in range(TIE_RUNS):
        shap = SeedShapley([2, 5], 0.05, salt=f"tie{r}", rule=rules_of(rule).stop)
        shap.horizon = TIE_SEEDS
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


def _bounds(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per scenario whose shipped jobs mostly (three in four) ended on a game of the top and
    one rival: the per-seed rates of the pair pooled over those jobs and `one_look_miss` at
    the seeds a budget-ended job had (the median)."""
    out: dict[str, dict[str, Any]] = {}
    for name in SCENARIOS:
        runs = [r for r in results if r["rule"] == "shipped" and r["scenario"] == name]
        pairs = [r["pair"] for r in runs if r["pair"] is not None]
        ended = sorted(r["pair"][2] for r in runs if r["pair"] and r["ended"] == "budget")
        if 4 * len(pairs) < 3 * len(runs) or not ended:
            continue
        seeds = sum(p[2] for p in pairs)
        win, loss = sum(p[0] for p in pairs) / seeds, sum(p[1] for p in pairs) / seeds
        n = ended[len(ended) // 2]
        out[name] = {
            "win": win,
            "loss": loss,
            "seeds": n,
            "miss": one_look_miss(win, loss, n, 0.05),
            "miss_half": one_look_miss(win, loss, n, 0.025),
        }
    return out


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
    bounds = _bounds(results)
    for name, b in bounds.items():
        console.print(
            f"{name}: a test that knew the top and the rates these jobs measured (a win in "
            f"{b['win']:.3f} of seeds, a loss in {b['loss']:.3f}) and looked once, at the "
            f"{b['seeds']} seeds a job that ended on its budget had (the median), would miss "
            f"the pair {b['miss']:.1%} of the time at 5% one-sided, {b['miss_half']:.1%} at "
            "2.5% (the top not known in advance)",
            markup=False,
        )
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "stop_rules.json"
    path.write_text(
        json.dumps(
            {"seeds": args.seeds, "ties": ties, "one_look": bounds, "runs": results}, indent=1
        )
    )
    console.print(f"wrote {path}; wall time {time.perf_counter() - began:.0f} s", markup=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
