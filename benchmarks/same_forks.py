"""Does a change to the scheduler keep its behaviour fork for fork? Runs every scenario in
`jobs/` (default job, and a capped one) over attribution seeds on two checkouts, this one and
`--base` (a git revision, checked out into a scratch worktree), and compares, job by job, the
forks each chose (task ids, in the order they were run) and the verdict line. Both sides run
the same tape files (this checkout's: a tape re-recorded would have another id and so other
task ids), in this process's Python, each side importing its own car_ray.

    .venv/bin/python benchmarks/same_forks.py --base 9b17d39 [--seeds 20] [--cap 30]

Prints a table per scenario, writes the figures to benchmarks/results/same_forks.json and
exits 1 on any difference (the first differing fork of each job is shown)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from _common import DEFAULT_OUT, ROOT, make_console
from rich.table import Table

# Run in a child whose working directory and PYTHONPATH are one checkout: it imports that
# checkout's car_ray, so it may use only what both sides have. One JSON line a job.
CHILD = r"""
import json, sys
from car_ray.bench import _job_and_tape
from car_ray.job import Job
from car_ray.results import verdict
from car_ray.schedule import Budget
from car_ray.truth import run_local

files, seeds, caps = json.loads(sys.argv[1])
for file in files:
    base, tape = _job_and_tape(file)
    for cap in caps:
        for seed in seeds:
            job = Job(base.path, base.spec.model_copy(update={"attribution_seed": seed}))
            outcome, rows = run_local(job, tape, Budget(max_forks=cap))
            notes = [getattr(n, "text", n) for n in outcome.notes]
            args = (outcome.attribution, tape, outcome.status, notes)
            answer = getattr(outcome, "answer", None)
            line = verdict(*args, answer) if answer is not None else verdict(*args)
            tasks = [r["task_id"] for r in rows]
            print(json.dumps({"job": file, "seed": seed, "cap": cap, "status": outcome.status,
                              "verdict": line, "tasks": tasks}), flush=True)
"""


def scenarios(base: str) -> list[str]:
    """Every jobs/*/job.toml here that the base revision has too."""
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-tree", "-r", "--name-only", base, "jobs"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    here = {str(p.relative_to(ROOT)) for p in (ROOT / "jobs").glob("*/job.toml")}
    return sorted(here & set(listed))


def ensure_tapes(files: list[str]) -> list[Path]:
    """Record any tape missing here (with this checkout's code) and return their paths."""
    from car_ray.bench import _job_and_tape

    return [Path(_job_and_tape(str(ROOT / f))[1].path) for f in files]


def worktree(revision: str, into: Path) -> Path:
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(into), revision],
        check=True,
        capture_output=True,
    )
    return into


def run_side(root: Path, files: list[str], seeds: list[int], caps: list[int | None]) -> list[Any]:
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{root / 'jobs'}"}
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    done = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps([files, seeds, caps])],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the run in {root} failed:\n{done.stderr[-4000:]}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the git revision to compare with")
    parser.add_argument("--seeds", type=int, default=20, help="attribution seeds 0..N-1")
    parser.add_argument("--cap", type=int, default=30, help="the capped job's --max-forks")
    parser.add_argument("--jobs", nargs="*", help="job files (default: every jobs/*/job.toml)")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT / "same_forks.json")
    args = parser.parse_args(argv)
    console = make_console()
    files = args.jobs or scenarios(args.base)
    tapes = ensure_tapes(files)
    seeds = list(range(args.seeds))
    caps: list[int | None] = [None, args.cap]
    scratch = Path(tempfile.mkdtemp(prefix="same-forks-"))
    started = time.monotonic()
    try:
        base = worktree(args.base, scratch / "base")
        for tape in tapes:  # the same tape files on both sides
            shutil.copy2(tape, base / tape.relative_to(ROOT))
        shards = [files[i :: args.processes] for i in range(args.processes)]
        sides = {"base": base, "here": ROOT}
        with ThreadPoolExecutor(args.processes) as pool:
            runs = {
                (side, i): pool.submit(run_side, root, shard, seeds, caps)
                for side, root in sides.items()
                for i, shard in enumerate(shards)
                if shard
            }
            got = {key: future.result() for key, future in runs.items()}
    finally:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(scratch / "base")],
            capture_output=True,
            check=False,
        )
        shutil.rmtree(scratch, ignore_errors=True)
    by_side: dict[str, dict[tuple[str, int, int | None], Any]] = {"base": {}, "here": {}}
    for (side, _), lines in got.items():
        for line in lines:
            by_side[side][(line["job"], line["seed"], line["cap"])] = line
    table = Table(title=f"forks and verdicts, {args.base} against this checkout")
    for column in ("scenario", "jobs", "same forks", "same verdict", "forks (base)", "forks"):
        table.add_column(column, justify="left" if column == "scenario" else "right")
    differences: list[str] = []
    figures: dict[str, Any] = {}
    for file in files:
        keys = [(file, s, c) for c in caps for s in seeds]
        same_forks = same_verdict = forks_base = forks_here = 0
        for key in keys:
            a, b = by_side["base"].get(key), by_side["here"].get(key)
            if a is None or b is None:
                differences.append(f"{key}: missing on {'base' if a is None else 'here'}")
                continue
            forks_base += len(a["tasks"])
            forks_here += len(b["tasks"])
            if a["tasks"] == b["tasks"]:
                same_forks += 1
            else:
                i = next(
                    (
                        i
                        for i, (x, y) in enumerate(zip(a["tasks"], b["tasks"], strict=False))
                        if x != y
                    ),
                    min(len(a["tasks"]), len(b["tasks"])),
                )
                differences.append(
                    f"{key}: forks differ at #{i} ({len(a['tasks'])} against {len(b['tasks'])})"
                )
            if a["verdict"] == b["verdict"] and a["status"] == b["status"]:
                same_verdict += 1
            else:
                differences.append(
                    f"{key}: verdict\n  base: {a['verdict']}\n  here: {b['verdict']}"
                )
        name = Path(file).parent.name
        table.add_row(
            name,
            str(len(keys)),
            str(same_forks),
            str(same_verdict),
            str(forks_base),
            str(forks_here),
        )
        figures[name] = {
            "jobs": len(keys),
            "same_forks": same_forks,
            "same_verdict": same_verdict,
            "forks_base": forks_base,
            "forks_here": forks_here,
        }
    console.print(table)
    wall = time.monotonic() - started
    console.print(f"{len(differences)} difference(s); {wall:.0f} s")
    for line in differences[:40]:
        console.print(line, markup=False, highlight=False)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "base": args.base,
                "seeds": args.seeds,
                "cap": args.cap,
                "wall_s": wall,
                "scenarios": figures,
                "differences": differences,
            },
            indent=2,
        )
        + "\n"
    )
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main())
