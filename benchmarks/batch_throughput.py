"""A nightly batch against the same traces run one `car-ray attribute` after another.

Generates N failing traces of jobs/nightly (three planted kinds), attributes them all with one
`car-ray batch` (one Ray, one simulated provider, one worker pool, traces sharing the window),
then runs `car-ray attribute` on a sample of the same traces one after another, each a fresh
process as a user's loop would run it, and extrapolates the sequential time to all N. Both
run each trace under the same caps (the job's default: 10 forks a step).

    .venv/bin/python benchmarks/batch_throughput.py            # 500 traces, 8 sequential
    .venv/bin/python benchmarks/batch_throughput.py --traces 60 --sequential 4

Prints a table and writes benchmarks/results/batch_throughput.json."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
JOB = ROOT / "jobs" / "nightly" / "job.toml"
OUT = ROOT / "benchmarks" / "results"


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT / "jobs"), "COLUMNS": "200"}


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "car_ray.cli", *args]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=int, default=500)
    parser.add_argument("--sequential", type=int, default=8, help="traces run one by one")
    parser.add_argument("--budget-usd", type=float, default=50.0)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    console = Console()
    scratch = Path(tempfile.mkdtemp(prefix="car-ray-batch-bench-"))
    tapes = scratch / "tapes"
    subprocess.run(
        [sys.executable, str(ROOT / "jobs" / "nightly" / "generate.py"), str(tapes),
         "--count", str(args.traces), "--seed", "7"],
        check=True, cwd=ROOT, env=_env(),
    )  # fmt: skip

    # One batch over every trace.
    started = time.monotonic()
    batch = subprocess.run(
        _cli("batch", "--job", str(JOB), "--from", str(tapes), "--budget-usd",
             str(args.budget_usd), "--out", str(scratch / "batch"), "--json"),
        cwd=ROOT, env=_env(), capture_output=True, text=True,
    )  # fmt: skip
    batch_wall = time.monotonic() - started
    if batch.returncode != 0:
        console.print(batch.stderr[-3000:], markup=False)
        raise SystemExit(f"car-ray batch exited {batch.returncode}")
    result = json.loads(batch.stdout)
    info, rows = result["batch"], result["traces"]
    done = [r for r in rows if r["status"] == "complete"]
    right = [
        r for r in done if r["planted_step"] is not None and r["top_step"] == r["planted_step"]
    ]
    forks = info["spent"]["forks"]
    usd = info["spent"]["usd"]

    # The same traces, one `car-ray attribute` after another (a sample, extrapolated).
    sample = sorted(rows, key=lambda r: r["trace"])[: args.sequential]
    seq_walls: list[float] = []
    seq_forks = 0
    for row in sample:
        job_file = scratch / "seq" / row["trace"] / "job.toml"
        job_file.parent.mkdir(parents=True)
        text = JOB.read_text().replace('tape = "nightly.tape"', f'tape = "{row["tape"]}"')
        job_file.write_text(text)
        t0 = time.monotonic()
        one = subprocess.run(
            _cli("attribute", str(job_file), "--out", str(scratch / "seq-out"), "--json"),
            cwd=ROOT, env=_env(), capture_output=True, text=True,
        )  # fmt: skip
        seq_walls.append(time.monotonic() - t0)
        if one.returncode != 0:
            console.print(one.stderr[-2000:], markup=False)
            raise SystemExit(f"car-ray attribute exited {one.returncode} on {row['tape']}")
        seq_forks += json.loads(one.stdout)["spent"]["forks"]
    per_trace_seq = sum(seq_walls) / len(seq_walls)
    per_trace_batch = batch_wall / len(rows)
    figures = {
        "traces": len(rows),
        "attributed": len(done),
        "planted_cause_named": len(right),
        "batch_wall_s": round(batch_wall, 1),
        "batch_inner_wall_s": round(info["wall_s"], 1),
        "traces_per_minute": round(len(rows) / batch_wall * 60, 1),
        "forks": forks,
        "forks_per_second": round(forks / info["wall_s"], 1),
        "usd": round(usd, 4),
        "usd_per_trace": round(usd / max(1, len(done)), 6),
        "forks_per_trace": round(forks / max(1, len(done)), 1),
        "pool_busy_share": round(info["busy_share"] or 0.0, 3),
        "sequential_sample": len(sample),
        "sequential_s_per_trace": round(per_trace_seq, 2),
        "sequential_forks_per_trace": round(seq_forks / len(sample), 1),
        "batch_s_per_trace": round(per_trace_batch, 3),
        "speedup": round(per_trace_seq / per_trace_batch, 1),
        "cpus": os.cpu_count(),
    }
    table = Table(title=f"car-ray batch: {len(rows)} nightly traces vs one attribute each")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for k, v in figures.items():
        table.add_row(k, str(v))
    console.print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "batch_throughput.json").write_text(json.dumps(figures, indent=2) + "\n")
    traces = pq.read_table(scratch / "batch" / info["batch_id"] / "traces.parquet")
    console.print(f"traces.parquet: {traces.num_rows} rows; scratch {scratch}", markup=False)


if __name__ == "__main__":
    main()
