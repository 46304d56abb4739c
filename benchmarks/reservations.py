"""How close a fork's budget reservation is to what it really costs, and what that does to a
dollar cap: the demo job (jobs/support_refund, method auto) with reservations learned from
settled forks ("learned", the default) and with the worst case for every fork ("worst case",
the behaviour before), side by side in one run.

    .venv/bin/python benchmarks/reservations.py [--seeds 3] [--max-usd 0.02]

For each attribution seed the job runs twice under a $1 cap it never reaches (and the default
10 forks a step) and twice under `--max-usd` (a cap it reaches), in this process
(LocalExecutor, the simulated provider in process: the
scheduler, its ledger and every fork's SpendLimit are the real ones). Printed per scheme: the
median over forks that spent anything of reserved / settled dollars, forks cut at a learned
reservation and run again, spend against the cap (never above it), and forks the capped job
got to run. Figures go to benchmarks/results/reservations.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from statistics import median
from typing import Any

from _common import DEFAULT_OUT, JOB_FILE, make_console
from rich.table import Table

from car_ray._scenario import ensure_tape
from car_ray.job import Job, load_job
from car_ray.schedule import Budget
from car_ray.schedule._tuning import LEARN_AFTER
from car_ray.tape import Tape
from car_ray.truth import run_local_scheduler

LEARNED = LEARN_AFTER
# A dollar cap the job never reaches: reservations are learned only under a dollar or token
# cap (without one they would only cut forks).
GENEROUS_USD = 1.0


def one(job: Job, tape: Tape, budget: Budget, learn_after: int) -> dict[str, Any]:
    outcome, rows, scheduler = run_local_scheduler(job, tape, budget, learn_after=learn_after)
    ledger = scheduler.governor.snapshot()
    report = ledger["reservations"]
    return {
        "status": outcome.status,
        "forks": ledger["spent"]["forks"],
        "spent_usd": ledger["spent"]["usd"],
        "cap_usd": budget.max_usd,
        "median_ratio": report["median_ratio"],
        "reserved_usd": report["reserved"]["usd"],
        "settled_usd": report["settled"]["usd"],
        "cut_and_rerun": sum(r["task_id"].endswith("/cut") for r in rows),
        "top": next(
            (
                r["step"]
                for r in outcome.attribution
                if r["intervention"] == "resample" and r["rank"] == 1
            ),
            None,
        ),
    }


def run(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--max-usd", type=float, default=0.002)
    args = parser.parse_args(argv)
    console = make_console(width=160)
    base = load_job(JOB_FILE)
    tape = ensure_tape(base)
    schemes = {"learned": LEARNED, "worst case": 10**9}
    results: list[dict[str, Any]] = []
    for seed in range(args.seeds):
        job = Job(base.path, base.spec.model_copy(update={"attribution_seed": seed}))
        for cap in (GENEROUS_USD, args.max_usd):
            for name, learn_after in schemes.items():
                got = one(job, tape, Budget(max_usd=cap), learn_after)
                results.append({"scheme": name, "seed": seed, **got})
    table = Table(title=f"reservations on {JOB_FILE.parent.name}, {args.seeds} seeds")
    for col in (
        "scheme",
        "cap",
        "median reserved/settled",
        "reserved $ / settled $",
        "cut + rerun",
        "forks run",
        "spent $ (max)",
        "top step",
    ):
        table.add_column(col, justify="right")
    summary: dict[str, Any] = {}
    for name in schemes:
        for cap in (GENEROUS_USD, args.max_usd):
            cell = [r for r in results if r["scheme"] == name and r["cap_usd"] == cap]
            ratios = [r["median_ratio"] for r in cell if r["median_ratio"] is not None]
            over = [r for r in cell if cap is not None and r["spent_usd"] > cap + 1e-12]
            if over:
                console.print(f"[bold red]CAP EXCEEDED: {over}")
            key = f"{name} / {'no cap' if cap is None else f'${cap:g}'}"
            summary[key] = {
                "median_ratio": median(ratios) if ratios else None,
                "reserved_over_settled": sum(r["reserved_usd"] for r in cell)
                / max(1e-12, sum(r["settled_usd"] for r in cell)),
                "cut_and_rerun": sum(r["cut_and_rerun"] for r in cell),
                "forks": [r["forks"] for r in cell],
                "max_spent_usd": max(r["spent_usd"] for r in cell),
                "cap_exceeded": bool(over),
                "top": [r["top"] for r in cell],
            }
            s = summary[key]
            table.add_row(
                name,
                "none" if cap is None else f"${cap:g}",
                "—" if s["median_ratio"] is None else f"{s['median_ratio']:.2f}",
                f"{s['reserved_over_settled']:.2f}",
                str(s["cut_and_rerun"]),
                " ".join(map(str, s["forks"])),
                f"{s['max_spent_usd']:.5f}",
                " ".join(map(str, s["top"])),
            )
    console.print(table)
    DEFAULT_OUT.mkdir(parents=True, exist_ok=True)
    path = DEFAULT_OUT / "reservations.json"
    path.write_text(json.dumps({"summary": summary, "runs": results}, indent=2) + "\n")
    console.print(f"wrote {path}")
    return 1 if any(s["cap_exceeded"] for s in summary.values()) else 0


if __name__ == "__main__":
    sys.exit(run())
