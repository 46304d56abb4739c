"""Accuracy against budget: car-ray's adaptive scheduler ("auto") against uniform allocation
with a live, pinned or held tail, on every scenario of jobs/ whose exact values are known.

The same as `car-ray bench` (car_ray/bench.py, whose docstring defines every figure):

    .venv/bin/python benchmarks/accuracy.py [--quick] [--scenarios relay echo] [--seeds 20]

Prints top-1 accuracy per scheme and budget, the fewest forks each scheme needs for 95%
top-1 accuracy, auto's interval coverage and its default-budget runs, and writes
`accuracy.parquet` and `accuracy.png` to `--out` (benchmarks/results). About 20 minutes on
two cores; --quick about 3. Exits 1 if an attribution run raised.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import structlog
from _common import DEFAULT_OUT, ROOT, make_console

from car_ray.bench import MAX_BUDGET, SCHEMES, main
from car_ray.validate import suite


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("at least 1")
    return value


def fraction(text: str) -> float:
    value = float(text)
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError("a number above 0")
    return value


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("job_files", nargs="*", type=Path, help="default: jobs/*/job.toml")
    parser.add_argument(
        "--quick", action="store_true", help="forks a step 0.5 1 4 8, 5 seeds, no long tape"
    )
    parser.add_argument("--scenarios", nargs="+", metavar="NAME", help="only these jobs/NAME")
    parser.add_argument("--seeds", type=positive, help="attribution seeds (default 20, quick 5)")
    parser.add_argument(
        "--forks-per-step",
        type=fraction,
        nargs="+",
        metavar="F",
        help="the budget grid, forks a step (default 0.25 0.5 1 2 4 8; quick 0.5 1 4 8)",
    )
    parser.add_argument(
        "--max-budget",
        type=positive,
        default=MAX_BUDGET,
        help=f"no budget above this many forks (default {MAX_BUDGET})",
    )
    parser.add_argument(
        "--long-seeds",
        type=int,
        help="seeds for tapes over 32 steps (default 3; --quick: 0, or 1 if --scenarios names one)",
    )
    parser.add_argument(
        "--schemes",
        nargs="+",
        choices=SCHEMES[1:],
        default=list(SCHEMES[1:]),
        help="the uniform schemes to run beside auto (default: all three)",
    )
    parser.add_argument("--processes", type=positive, default=2)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder for the results")
    return parser.parse_args(argv)


def run(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )
    return main(
        args.job_files or suite(ROOT / "jobs"),
        quick=args.quick,
        scenarios=args.scenarios,
        seeds=args.seeds,
        forks_per_step=args.forks_per_step,
        max_budget=args.max_budget,
        long_seeds=args.long_seeds,
        processes=args.processes,
        out=args.out,
        schemes=["auto", *args.schemes],
        console=make_console(width=200),
    )


if __name__ == "__main__":
    sys.exit(run())
