"""The batch's budget splits side by side, under a budget too tight for every trace.

Generates N failing traces of jobs/nightly (three planted kinds; the manifest gives each a
priority, higher for larger refunds) and attributes them three times with `car-ray batch`
under the same `--max-forks` (by default 15 forks a trace, below the ~23 a trace spends
when its caps do not bind), once per `--split`: equal, priority and adaptive. For each it
counts the traces whose rank-1 step is the planted one, the same weighted by priority, the
traces that ended without an answer or were never begun, and the forks spent.

    .venv/bin/python benchmarks/batch_split.py                    # 60 traces, 15 forks each
    .venv/bin/python benchmarks/batch_split.py --traces 120 --forks-per-trace 12

Prints a table and writes benchmarks/results/batch_split.json."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
JOB = ROOT / "jobs" / "nightly" / "job.toml"
OUT = ROOT / "benchmarks" / "results"
SPLITS = ("equal", "priority", "adaptive")


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT / "jobs"), "COLUMNS": "200"}


def _figures(rows: list[dict[str, Any]], info: dict[str, Any], wall: float) -> dict[str, Any]:
    named = [r for r in rows if r["top_step"] is not None and r["top_step"] == r["planted_step"]]
    weight = sum(r["priority"] or 1.0 for r in rows)
    return {
        "planted_named": len(named),
        "planted_named_share": round(len(named) / len(rows), 3),
        "priority_weighted_named": round(sum(r["priority"] or 1.0 for r in named) / weight, 3),
        "complete": sum(r["status"] == "complete" for r in rows),
        "no_answer": sum(r["top_step"] is None and r["status"] != "pending" for r in rows),
        "never_begun": sum(r["status"] == "pending" for r in rows),
        "forks": info["spent"]["forks"],
        "usd": round(info["spent"]["usd"], 4),
        "wall_s": round(wall, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=int, default=60)
    parser.add_argument("--forks-per-trace", type=int, default=15)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    console = Console()
    scratch = Path(tempfile.mkdtemp(prefix="car-ray-split-bench-"))
    tapes = scratch / "tapes"
    subprocess.run(
        [sys.executable, str(ROOT / "jobs" / "nightly" / "generate.py"), str(tapes),
         "--count", str(args.traces), "--seed", "11"],
        check=True, cwd=ROOT, env=_env(),
    )  # fmt: skip
    max_forks = args.traces * args.forks_per_trace
    figures: dict[str, Any] = {"traces": args.traces, "max_forks": max_forks, "splits": {}}
    for split in SPLITS:
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "car_ray.cli", "batch", "--job", str(JOB), "--from",
             str(tapes), "--max-forks", str(max_forks), "--split", split, "--out",
             str(scratch / split), "--json"],
            cwd=ROOT, env=_env(), capture_output=True, text=True,
        )  # fmt: skip
        wall = time.monotonic() - started
        if not done.stdout.strip():
            console.print(done.stderr[-3000:], markup=False)
            raise SystemExit(f"car-ray batch --split {split} exited {done.returncode}")
        result = json.loads(done.stdout)
        figures["splits"][split] = {
            "exit": done.returncode,
            **_figures(result["traces"], result["batch"], wall),
        }
    table = Table(
        title=f"{args.traces} nightly traces under {max_forks} forks "
        f"({args.forks_per_trace} a trace), by --split"
    )
    names = list(next(iter(figures["splits"].values())))
    table.add_column("figure")
    for split in SPLITS:
        table.add_column(split, justify="right")
    for name in names:
        table.add_row(name, *(str(figures["splits"][s][name]) for s in SPLITS))
    console.print(table)
    figures["cpus"] = os.cpu_count()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "batch_split.json").write_text(json.dumps(figures, indent=2) + "\n")
    console.print(f"scratch {scratch}", markup=False)


if __name__ == "__main__":
    main()
