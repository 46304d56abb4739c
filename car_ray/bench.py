"""`car-ray bench`: accuracy against budget, car-ray's adaptive scheduler against uniform
allocation, on every scenario whose exact values are known.

For each scenario job (a simulated policy: `validate.suite(heavy=True)` by default) the exact values
are enumerated once (`truth.solve`). Then, for every budget of a log grid (F forks a step of
the tape, rounded up: F in 1/4, 1/2, 1, 2, 4, 8; `--quick`: 1/2, 1, 4, 8; a budget is at most
`max_budget` = 256 forks) and every attribution seed 0..R-1 (R = 20; `--quick`: 5), one
attribution job runs in a worker process (`truth.run_local`, no Ray) under
`Budget(max_forks=budget)`, four ways (the uniform schemes only at budgets of at least one
fork a step: below it a uniform scheme leaves steps unmeasured, so what it ranks first
depends on the order of the steps; auto's screen tests blocks of steps in one fork, so it
can answer with fewer forks than the tape has steps):

  auto            car-ray's adaptive scheduler (method "auto": screen, Shapley on the held
                  game one seed at a time, the other arms with a held tail); it stops when
                  the top cause is separated or its intervals are precise, or at the cap;
  uniform-live    method "uniform": k = budget // arms forks (at least 1) of every arm, each
                  with a live tail (everything after the intervention re-drawn);
  uniform-pinned  the same with a pinned tail (every later step answered with its
                  recorded text or result, whatever the intervention changed);
  uniform-held    the same with a held tail (later steps keep their mechanism: the game
                  auto measures).

auto also runs once a seed with no cap at all (`Budget()`: the scheduler's own default of
10 forks a step), to see what a user gets by default and whether it stopped on its own.

A fork of the 65-step tape (jobs/long_tape) costs 40-70 ms against 25-35 ms on the others
(its agent posts chat completions without the SDK, whose request transform made it ~0.5 s), so
it runs the whole grid and every seed; `--quick` skips tapes over 32 steps unless
`--scenarios` names them (`--long-seeds N` caps their seeds). The default grid takes about 20
minutes on two cores, `--quick` about 3.

Definitions (also in the printed tables):

- exact top set: the steps whose exact phi is within `validate.TIE` of the best exact phi;
  empty when every exact phi is ~0 (the negative control).
- top-1: the resample row a scheme ranks 1 (auto ranks by phi, uniform by flip-rate). It is
  correct when that step is in the exact top set AND its ranked value is strictly above that
  of every step outside the top set (a tie with a step outside cannot be told apart by a
  user: it counts as wrong). For the negative control, correct means nothing is blamed: no
  resample row has phi_lo > 0 (auto), no resample fork flipped (uniform).
- phi MAE: mean over resample rows with a phi of |phi - exact phi| (auto only).
- coverage: how many exact values lie in the row's interval, counted by `validate.score`
  (phi, necessity and sufficiency of resample rows, the flip of every other arm against its
  exact held-tail flip); for uniform schemes only the other arms have such intervals.
- phi width: the mean width phi_hi - phi_lo over the steps Shapley measured (ranked rows;
  steps the screen cleared carry the interval ±(their deviation bound) and are left out).
- fewest forks: the mean forks used at the smallest budget of the grid whose top-1 accuracy
  over the seeds is at least 0.95 ("never" if none). The best uniform scheme of a scenario
  is the one with the fewest; auto / best uniform is the ratio of the two, and its median
  is over the scenarios where both reach 0.95, the negative control left out (every scheme
  is right there at any budget).
- stopped on its own (default runs): auto's Shapley note says the top "separated" or the
  intervals are "precise", or that no step makes a choice (the negative control); a note
  that "the budget ended before the top separated" is not a stop on its own.

Every run is a row of `accuracy.parquet`; `accuracy.png` plots, per scenario, top-1 accuracy
against mean forks used, one line per scheme. Scenarios that differ only in their tape's
length (`<family>_<n>`: jobs/checklist_sparse_10, _30, _100, _300) get a table and a panel of
`scaling.png` of forks against steps: auto with no cap, and auto's and uniform-held's fewest
forks for the accuracy (uniform-held needs a fork an arm, more than the grid's budgets at 300
steps: its least is drawn as an open marker). Runs go to `processes` worker processes (each
runs whole attribution jobs); the exact values are computed in the same pool.
"""

from __future__ import annotations

import json
import logging
import math
import multiprocessing
import os
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from statistics import mean, median
from typing import Any, Literal

import pyarrow as pa
import pyarrow.parquet as pq
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ._answer import Answer
from ._notes import Note
from .job import Job, load_job
from .schedule import Budget, job_arms
from .truth import Game, Truth
from .validate import SLACK, TIE, score, suite

Scheme = Literal["auto", "uniform-live", "uniform-pinned", "uniform-held"]
SCHEMES: tuple[Scheme, ...] = ("auto", "uniform-live", "uniform-pinned", "uniform-held")
# The uniform schemes other tools use (uniform-held is car-ray's own game, uniformly spent).
OTHER_TOOLS: tuple[Scheme, ...] = ("uniform-live", "uniform-pinned")
FORKS_PER_STEP = (0.25, 0.5, 1, 2, 4, 8)  # auto's uncapped run (10 forks a step) is the next
QUICK_FORKS_PER_STEP = (0.5, 1, 4, 8)
SEEDS = 20
QUICK_SEEDS = 5
MAX_BUDGET = 256  # no budget above this many forks
# Tapes longer than LONG_STEPS run at most `long_seeds` seeds (default: all; --quick: none,
# unless `scenarios` names them: then one).
LONG_STEPS = 32
ACCURATE = 0.95  # top-1 accuracy that counts as "reaches the right answer"
DEFAULT_OUT = Path("benchmarks/results")

SCHEMA = pa.schema(
    [
        pa.field("scenario", pa.string(), nullable=False),
        pa.field("scheme", pa.string(), nullable=False),
        # The grid point (forks a step of the tape) and its cap; both null for the default run.
        pa.field("forks_per_step", pa.float64()),
        pa.field("budget", pa.int64()),
        pa.field("default_budget", pa.bool_(), nullable=False),
        pa.field("uniform_k", pa.int32()),  # uniform schemes: forks of every arm
        pa.field("seed", pa.int32(), nullable=False),
        pa.field("steps", pa.int32(), nullable=False),
        pa.field("arms", pa.int32(), nullable=False),
        pa.field("forks", pa.int64(), nullable=False),
        pa.field("status", pa.string(), nullable=False),
        pa.field("top_exact", pa.list_(pa.int32()), nullable=False),
        pa.field("top1", pa.int32()),
        pa.field("top1_correct", pa.bool_(), nullable=False),
        pa.field("phi_mae", pa.float64()),
        pa.field("covered", pa.int32(), nullable=False),
        pa.field("checked", pa.int32(), nullable=False),
        # Of those: the phi of the steps Shapley measured (auto's ranked rows).
        pa.field("phi_covered", pa.int32(), nullable=False),
        pa.field("phi_checked", pa.int32(), nullable=False),
        pa.field("phi_width", pa.float64()),
        # auto: how Shapley ended (separated, precise, nothing, budget; null if it never ran)
        pa.field("verdict", pa.string()),
        pa.field("stopped", pa.bool_()),
        pa.field("control_ok", pa.bool_(), nullable=False),
        pa.field("wall_s", pa.float64(), nullable=False),
        pa.field("cpu_s", pa.float64(), nullable=False),  # this process, every thread
        pa.field("error", pa.string()),
    ]
)


@dataclass(frozen=True)
class Task:
    """One attribution job: a scenario, a scheme, a cap (None: the scheduler's default)."""

    job_file: str
    scenario: str
    scheme: Scheme
    forks_per_step: float | None
    budget: int | None
    uniform_k: int | None
    seed: int
    cost: float  # an estimate in forks x steps, to hand out the longest first
    # What the simulated provider does with a seed (`sim_draws`).
    draws: str = "coupled"


@dataclass(frozen=True)
class Result:
    task: Task
    forks: int
    status: str
    attribution: list[dict[str, Any]]
    notes: list[Note]
    answer: Answer | None
    wall_s: float
    cpu_s: float
    error: str | None


# -- in the worker processes ------------------------------------------------------------------

_loaded: dict[str, tuple[Job, Any]] = {}


class _DropPendingTasks(logging.Filter):
    """Drops asyncio's "Task was destroyed but it is pending!": `LocalExecutor.shutdown`
    closes its loop without `shutdown_asyncgens`, so every fork of a streaming async agent
    (jobs/late_commit) leaves a pending generator task, logged once per fork."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Task was destroyed but it is pending")


_DROP = _DropPendingTasks()


def _quiet() -> None:
    """A worker's logs: warnings and worse, to stderr (as the command line sets them)."""
    import structlog

    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )
    logging.getLogger("asyncio").addFilter(_DROP)


def _job_and_tape(job_file: str) -> tuple[Job, Any]:
    from ._scenario import ensure_tape

    if job_file not in _loaded:
        job = load_job(job_file)
        _loaded[job_file] = (job, ensure_tape(job))
    return _loaded[job_file]


def _solve(job_file: str, game: Game = "held") -> str:
    """The scenario's exact values in `game`, as JSON (`Truth.model_dump_json`)."""
    from ._aio import run as run_loop
    from .truth import solve

    job, tape = _job_and_tape(job_file)
    return run_loop(solve(job, tape, game=game)).model_dump_json()


def _run(task: Task) -> Result:
    from .truth import run_local

    job, tape = _job_and_tape(task.job_file)
    provider = job.spec.provider.model_copy(update={"sim_draws": task.draws})
    update: dict[str, Any] = {"attribution_seed": task.seed, "provider": provider}
    if task.scheme == "auto":
        update["method"] = "auto"
    else:
        update.update(
            method="uniform",
            uniform_tail=task.scheme.removeprefix("uniform-"),
            forks_per_step=task.uniform_k,
        )
    job = Job(job.path, job.spec.model_copy(update=update))
    budget = Budget() if task.budget is None else Budget(max_forks=task.budget)
    began, cpu = time.perf_counter(), time.process_time()
    try:
        outcome, _ = run_local(job, tape, budget)
    except Exception as exc:  # one broken run is a row, not the end of the benchmark
        wall, cpu = time.perf_counter() - began, time.process_time() - cpu
        return Result(task, 0, "error", [], [], None, wall, cpu, repr(exc))
    return Result(
        task,
        outcome.progress.spent.forks,
        outcome.status,
        outcome.attribution,
        outcome.notes,
        outcome.answer,
        time.perf_counter() - began,
        time.process_time() - cpu,
        None,
    )


# -- scoring ------------------------------------------------------------------------------------


def top_exact(truth: Truth) -> list[int]:
    """The exact top set: every step within TIE of the best exact phi (none if all ~0)."""
    best = max((s.phi for s in truth.steps), default=0.0)
    if best <= SLACK:
        return []
    return [s.step for s in truth.steps if s.phi >= best - TIE]


def top1(
    scheme: str, attribution: list[dict[str, Any]], top: Sequence[int]
) -> tuple[int | None, bool]:
    """The step a scheme ranks 1 among the resample rows, and whether that is right (see the
    module's definitions)."""
    key = "phi" if scheme == "auto" else "flip_rate"
    resample = [r for r in attribution if r["intervention"] == "resample"]
    first = next((r for r in resample if r["rank"] == 1), None)
    if not top:
        if scheme == "auto":
            nothing = all((r["phi_lo"] or 0.0) <= SLACK for r in resample)
        else:
            nothing = all((r["flip_rate"] or 0.0) <= SLACK for r in resample)
        return (None if first is None else int(first["step"])), nothing
    if first is None or first[key] is None:
        return None, False
    value = float(first[key])
    ahead = all(
        r[key] is None or float(r[key]) < value - SLACK for r in resample if r["step"] not in top
    )
    return int(first["step"]), first["step"] in top and ahead


def ended(answer: Answer | None, status: str | None = None) -> str | None:
    """How the held mechanism ended, from its answer: "separated", "precise" or "nothing"
    (it stopped on its own), "budget" (its budget ended before it answered), None otherwise
    (a comparison scheme's answer, a failed job, or a complete one that did not answer)."""
    if answer is None or answer.kind == "measured":
        return None
    if answer.answered:
        return answer.kind
    return "budget" if status == "budget_exhausted" else None


def row_of(result: Result, truth: Truth, steps: int, arms: int) -> dict[str, Any]:
    """One run as a row of accuracy.parquet."""
    task = result.task
    top = top_exact(truth)
    found, correct = top1(task.scheme, result.attribution, top)
    check = score(
        task.scenario,
        truth,
        result.attribution,
        result.notes,
        result.forks,
        result.status,
        steps,
    )
    resample = [r for r in result.attribution if r["intervention"] == "resample"]
    errors = [abs(r["phi"] - truth.step(r["step"]).phi) for r in resample if r["phi"] is not None]
    widths = [
        r["phi_hi"] - r["phi_lo"]
        for r in resample
        if r["rank"] is not None and r["phi_lo"] is not None and r["phi_hi"] is not None
    ]
    verdict = ended(result.answer, result.status) if task.scheme == "auto" else None
    return {
        "scenario": task.scenario,
        "scheme": task.scheme,
        "draws": task.draws,
        "forks_per_step": task.forks_per_step,
        "budget": task.budget,
        "default_budget": task.budget is None,
        "uniform_k": task.uniform_k,
        "seed": task.seed,
        "steps": steps,
        "arms": arms,
        "forks": result.forks,
        "status": result.status,
        "top_exact": top,
        "top1": found,
        "top1_correct": correct and result.error is None,
        "phi_mae": mean(errors) if errors and task.scheme == "auto" else None,
        "covered": check.covered,
        "checked": check.checked,
        "phi_covered": check.phi_covered,
        "phi_checked": check.phi_checked,
        "phi_width": mean(widths) if widths else None,
        "verdict": verdict,
        "stopped": None
        if task.scheme != "auto"
        else verdict in ("separated", "precise", "nothing"),
        "control_ok": check.control_ok,
        "wall_s": round(result.wall_s, 4),
        "cpu_s": round(result.cpu_s, 4),
        "error": result.error,
    }


# -- the plan -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    name: str
    job_file: str
    steps: int
    arms: int
    seeds: int
    grid: list[tuple[float, int]]  # (forks a step, budget), budgets distinct and increasing

    def uniform_runs(self, budget: int) -> bool:
        """Whether the uniform schemes run at `budget`: one fork a step or more (below it
        they would leave steps unmeasured)."""
        return budget >= self.steps


def plan_scenario(
    job_file: Path, grid: Sequence[float], seeds: int, long_seeds: int, max_budget: int | None
) -> Scenario:
    """The scenario's budgets (F x steps rounded up, at most max_budget) and seeds (at most
    long_seeds for a tape over LONG_STEPS steps)."""
    from ._scenario import ensure_tape

    job = load_job(job_file)
    tape = ensure_tape(job)
    steps, arms = len(tape.steps), len(job_arms(job, tape))
    long = steps > LONG_STEPS
    points: list[tuple[float, int]] = []
    for f in sorted(grid):
        budget = math.ceil(f * steps)
        budget = budget if max_budget is None else min(budget, max_budget)
        if points and budget == points[-1][1]:
            points[-1] = (f, budget)  # the same budget: named by the larger F
        else:
            points.append((f, budget))
    n = min(seeds, long_seeds) if long else seeds
    return Scenario(job.folder.name, str(job_file), steps, arms, n, points)


def tasks_of(
    s: Scenario, draws: str = "coupled", schemes: Sequence[Scheme] = SCHEMES
) -> list[Task]:
    """The scenario's runs: auto with no cap once a seed, and each of `schemes` (auto always
    among them) at each budget of the grid it runs at."""
    out = []
    for seed in range(s.seeds):
        cost = 10.0 * s.steps**2
        out.append(Task(s.job_file, s.name, "auto", None, None, None, seed, cost, draws))
        for f, budget in s.grid:
            for scheme in SCHEMES if s.uniform_runs(budget) else SCHEMES[:1]:
                if scheme not in schemes and scheme != "auto":
                    continue
                k = None if scheme == "auto" else max(1, budget // s.arms)
                cost = budget * s.steps
                out.append(Task(s.job_file, s.name, scheme, f, budget, k, seed, cost, draws))
    return out


def _pool_map(
    processes: int,
    solve_files: Sequence[str],
    tasks: Sequence[Task],
    on_result: Callable[[Result], None],
) -> dict[str, str]:
    """Run the exact solves and the tasks on `processes` processes (in this one if 1); the
    solves' JSON by job file."""
    truths: dict[str, str] = {}
    if processes <= 1:
        logging.getLogger("asyncio").addFilter(_DROP)
        try:
            for path in solve_files:
                truths[path] = _solve(path)
            for task in tasks:
                on_result(_run(task))
        finally:
            logging.getLogger("asyncio").removeFilter(_DROP)
        return truths
    context = multiprocessing.get_context("spawn")  # no fork of a process with threads
    with ProcessPoolExecutor(processes, mp_context=context, initializer=_quiet) as pool:
        solving = {pool.submit(_solve, path): path for path in solve_files}
        running: list[Future[Result]] = [
            pool.submit(_run, task) for task in sorted(tasks, key=lambda t: -t.cost)
        ]
        for future in as_completed(running):
            on_result(future.result())
        for solved, path in solving.items():
            truths[path] = solved.result()
    return truths


# -- the summary --------------------------------------------------------------------------------


def _accuracy(rows: Sequence[dict[str, Any]]) -> float:
    return sum(bool(r["top1_correct"]) for r in rows) / len(rows)


def _mean_forks(rows: Sequence[dict[str, Any]]) -> float:
    return mean(float(r["forks"]) for r in rows)


def _mean_of(rows: Sequence[dict[str, Any]], key: str) -> float | None:
    values = [float(r[key]) for r in rows if r[key] is not None]
    return mean(values) if values else None


def _cells(rows: Sequence[dict[str, Any]]) -> dict[tuple[str, str, int], list[dict[str, Any]]]:
    """Grid runs by (scenario, scheme, budget)."""
    cells: dict[tuple[str, str, int], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        if not r["default_budget"]:
            cells[(r["scenario"], r["scheme"], r["budget"])].append(r)
    return cells


def fewest_forks(
    cells: dict[tuple[str, str, int], list[dict[str, Any]]],
    scenario: str,
    scheme: str,
    budgets: Sequence[int],
) -> float | None:
    """Mean forks used at the smallest budget whose top-1 accuracy is at least ACCURATE
    (`cells`: the grid runs by `_cells`)."""
    for budget in sorted(budgets):
        cell = cells.get((scenario, scheme, budget))
        if cell and _accuracy(cell) >= ACCURATE:
            return _mean_forks(cell)
    return None


@dataclass
class Summary:
    fewest: dict[tuple[str, str], float | None]
    best_uniform: dict[str, str | None]
    ratios: dict[str, float | None]
    median_ratio: float | None
    median_of: int  # scenarios in the median: both reach the accuracy, not a control
    # auto's fewest forks over the budgets the uniform schemes run at (one fork a step or
    # more), its ratio to the best uniform, and that ratio's median over the same scenarios
    auto_whole: dict[str, float | None]
    ratios_whole: dict[str, float | None]
    median_whole: float | None
    coverage: float | None
    covered: int
    checked: int
    phi_width: float | None
    phi_covered: int  # the phi of the steps Shapley measured, inside their intervals
    phi_checked: int
    # Against the schemes other tools use (uniform-live, uniform-pinned): the scenarios with
    # a cause where auto reaches the accuracy and neither of them does, and auto's ratio to
    # the better of them where one does.
    beats_others: list[str]
    others_ratios: dict[str, float]


def summarize(rows: Sequence[dict[str, Any]], scenarios: Sequence[Scenario]) -> Summary:
    fewest: dict[tuple[str, str], float | None] = {}
    best_uniform: dict[str, str | None] = {}
    ratios: dict[str, float | None] = {}
    auto_whole: dict[str, float | None] = {}
    ratios_whole: dict[str, float | None] = {}
    cells = _cells(rows)
    for s in scenarios:
        budgets = [b for _, b in s.grid]
        for scheme in SCHEMES:
            fewest[(s.name, scheme)] = fewest_forks(cells, s.name, scheme, budgets)
        whole = fewest_forks(cells, s.name, "auto", [b for b in budgets if s.uniform_runs(b)])
        auto_whole[s.name] = whole
        reached = [
            (value, scheme)
            for scheme in SCHEMES[1:]
            if (value := fewest[(s.name, scheme)]) is not None
        ]
        best = min(reached) if reached else None
        best_uniform[s.name] = None if best is None else best[1]
        auto = fewest[(s.name, "auto")]
        ratios[s.name] = None if best is None or auto is None else auto / max(best[0], 1e-9)
        ratios_whole[s.name] = None if best is None or whole is None else whole / max(best[0], 1e-9)
    # A negative control has nothing to find: every scheme is right at any budget.
    controls = {r["scenario"] for r in rows if not r["top_exact"]}
    known = [r for name, r in ratios.items() if r is not None and name not in controls]
    known_whole = [
        r
        for name, r in ratios_whole.items()
        if r is not None and ratios[name] is not None and name not in controls
    ]
    auto_rows = [r for r in rows if r["scheme"] == "auto" and not r["default_budget"]]
    covered = sum(int(r["covered"]) for r in auto_rows)
    checked = sum(int(r["checked"]) for r in auto_rows)
    widths = [float(r["phi_width"]) for r in auto_rows if r["phi_width"] is not None]
    beats: list[str] = []
    others: dict[str, float] = {}
    for s in scenarios:
        auto = fewest[(s.name, "auto")]
        theirs = [v for scheme in OTHER_TOOLS if (v := fewest[(s.name, scheme)]) is not None]
        if s.name in controls or auto is None:
            continue
        if theirs:
            others[s.name] = auto / max(min(theirs), 1e-9)
        else:
            beats.append(s.name)
    return Summary(
        fewest,
        best_uniform,
        ratios,
        median(known) if known else None,
        len(known),
        auto_whole,
        ratios_whole,
        median(known_whole) if len(known_whole) == len(known) and known else None,
        covered / checked if checked else None,
        covered,
        checked,
        mean(widths) if widths else None,
        sum(int(r["phi_covered"]) for r in auto_rows),
        sum(int(r["phi_checked"]) for r in auto_rows),
        beats,
        others,
    )


DEFINITIONS = (
    f"top-1 correct: the rank-1 resample step (auto: by phi; uniform: by flip-rate) is in the "
    f"exact top set (exact phi within {TIE} of the best) and strictly ahead of every step "
    "outside it (a tie counts as wrong); negative control: nothing blamed (auto: no phi_lo > "
    "0; uniform: no fork flipped). Cell: accuracy over the seeds (mean forks used)."
)


def accuracy_tables(
    rows: Sequence[dict[str, Any]], scenarios: Sequence[Scenario]
) -> Iterator[Table]:
    cells = _cells(rows)
    levels = sorted({f for s in scenarios for f, _ in s.grid})
    ran = {r["scheme"] for r in rows}
    for scheme in (s for s in SCHEMES if s in ran):
        table = Table(
            title=f"{scheme}: top-1 accuracy over the seeds (mean forks used) by budget "
            "(F forks a step of the tape)",
            title_justify="left",
        )
        table.add_column("F", justify="right")
        for s in scenarios:
            table.add_column(escape(f"{s.name}\n{s.steps} st, {s.seeds} seeds"), justify="right")
        for f in levels:
            line = [f"{f:g}"]
            for s in scenarios:
                budget = dict(s.grid).get(f)
                cell = cells.get((s.name, scheme, budget)) if budget is not None else None
                if not cell:
                    line.append("—")
                    continue
                acc = _accuracy(cell)
                text = f"{acc:.2f} ({_mean_forks(cell):.0f})"
                line.append(f"[green]{text}[/]" if acc >= ACCURATE else text)
            table.add_row(*line)
        yield table


def _fmt(value: float | None, spec: str = ".0f", none: str = "never") -> str:
    return none if value is None else format(value, spec)


def summary_table(
    summary: Summary, scenarios: Sequence[Scenario], schemes: Sequence[Scheme] = SCHEMES
) -> Table:
    table = Table(
        title=f"fewest forks: mean forks used at the smallest budget with top-1 accuracy >= "
        f"{ACCURATE} ('never': no budget on the grid)",
        title_justify="left",
    )
    table.add_column("scenario")
    for scheme in schemes:
        table.add_column(scheme, justify="right")
    table.add_column("best uniform")
    table.add_column("auto / best uniform", justify="right")
    table.add_column("auto from 1 fork a step", justify="right")
    table.add_column("its ratio", justify="right")
    for s in scenarios:
        best = summary.best_uniform[s.name]
        table.add_row(
            escape(s.name),
            *(_fmt(summary.fewest[(s.name, scheme)]) for scheme in schemes),
            escape(best or "none"),
            _fmt(summary.ratios[s.name], ".2f", "—"),
            _fmt(summary.auto_whole[s.name]),
            _fmt(summary.ratios_whole[s.name], ".2f", "—"),
        )
    return table


def default_table(rows: Sequence[dict[str, Any]], scenarios: Sequence[Scenario]) -> Table:
    table = Table(
        title="auto with no cap (the scheduler's default: 10 forks a step): forks a step used, "
        "how often it stopped on its own (Shapley separated or precise, or nothing to blame)",
        title_justify="left",
    )
    columns = ("scenario", "seeds", "forks/step", "stopped", "top-1", "phi MAE", "phi width")
    for column in (*columns, "coverage"):
        table.add_column(column, justify="left" if column == "scenario" else "right")
    for s in scenarios:
        runs = [r for r in rows if r["scenario"] == s.name and r["default_budget"]]
        if not runs:
            continue
        checked = sum(int(r["checked"]) for r in runs)
        table.add_row(
            escape(s.name),
            str(len(runs)),
            f"{_mean_forks(runs) / s.steps:.1f}",
            f"{sum(bool(r['stopped']) for r in runs) / len(runs):.0%}",
            f"{_accuracy(runs):.2f}",
            _fmt(_mean_of(runs, "phi_mae"), ".3f", "—"),
            _fmt(_mean_of(runs, "phi_width"), ".3f", "—"),
            f"{sum(int(r['covered']) for r in runs) / checked:.1%}" if checked else "—",
        )
    return table


def families(scenarios: Sequence[Scenario]) -> dict[str, list[Scenario]]:
    """Scenarios that differ only in their tape's length, by family: names `<family>_<n>`
    (jobs/checklist_sparse_10 ... _300), two or more a family, by steps."""
    out: dict[str, list[Scenario]] = defaultdict(list)
    for s in scenarios:
        family, _, n = s.name.rpartition("_")
        if family and n.isdigit():
            out[family].append(s)
    return {f: sorted(m, key=lambda s: s.steps) for f, m in out.items() if len(m) > 1}


@dataclass(frozen=True)
class Scale:
    """One length of a family: auto with no cap (median forks, how often it stopped on its
    own), and the fewest forks auto and uniform-held reach the accuracy with (None: never on
    the grid; `held_least`: the least uniform-held could spend, one fork an arm, where that
    is above every budget of the grid)."""

    scenario: str
    steps: int
    default_median: float | None
    default_stopped: float | None
    auto: float | None
    held: float | None
    held_least: int | None


def scales(
    rows: Sequence[dict[str, Any]], summary: Summary, family: Sequence[Scenario]
) -> list[Scale]:
    out = []
    for s in family:
        runs = [r for r in rows if r["scenario"] == s.name and r["default_budget"]]
        ran = any(s.uniform_runs(b) for _, b in s.grid)
        out.append(
            Scale(
                s.name,
                s.steps,
                median(float(r["forks"]) for r in runs) if runs else None,
                sum(bool(r["stopped"]) for r in runs) / len(runs) if runs else None,
                summary.fewest[(s.name, "auto")],
                summary.fewest[(s.name, "uniform-held")],
                None if ran else s.arms,
            )
        )
    return out


def scaling_table(family: str, points: Sequence[Scale]) -> Table:
    table = Table(
        title=f"{family}: forks against the tape's steps (auto with no cap: median forks and "
        f"how often it stopped on its own; fewest forks for top-1 accuracy >= {ACCURATE})",
        title_justify="left",
    )
    for column in ("scenario", "steps", "auto, no cap", "stopped", "auto", "uniform-held"):
        table.add_column(column, justify="left" if column == "scenario" else "right")
    for p in points:
        held = _fmt(p.held)
        if p.held is None and p.held_least is not None:
            held = f"at least {p.held_least} (a fork an arm, beyond the grid)"
        table.add_row(
            escape(p.scenario),
            str(p.steps),
            _fmt(p.default_median, ".0f", "—"),
            _fmt(p.default_stopped, ".0%", "—"),
            _fmt(p.auto),
            held,
        )
    return table


def write_scaling_plot(path: Path, by_family: dict[str, list[Scale]]) -> None:
    """Forks against steps, a panel per family: auto with no cap (median), auto's and
    uniform-held's fewest forks for the accuracy; uniform-held's least (one fork an arm) as
    an open marker where the grid could not run it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(by_family), figsize=(4.2 * len(by_family), 3.2), squeeze=False)
    for ax, (family, points) in zip(axes[0], by_family.items(), strict=True):
        lines = (
            ("auto, no cap (median)", "k*-", [p.default_median for p in points]),
            (f"auto, fewest for {ACCURATE:.0%} top-1", "o-", [p.auto for p in points]),
            (f"uniform-held, fewest for {ACCURATE:.0%}", "v-", [p.held for p in points]),
        )
        for label, style, values in lines:
            xy = [(p.steps, v) for p, v in zip(points, values, strict=True) if v is not None]
            if xy:
                ax.plot(*zip(*xy, strict=True), style, markersize=4, linewidth=1, label=label)
        least = [(p.steps, p.held_least) for p in points if p.held is None and p.held_least]
        if least:
            ax.plot(
                *zip(*least, strict=True),
                "v",
                markerfacecolor="none",
                markersize=6,
                label="uniform-held, at least (beyond the grid)",
            )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("steps of the tape", fontsize=8)
        ax.set_ylabel("forks", fontsize=8)
        ax.set_title(family, fontsize=9)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=6, frameon=False)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _show(console: Console, table: Table) -> None:
    """The title on its own line (rich would wrap it to a narrow table's width), then the table."""
    if table.title:
        console.print(f"[bold]{table.title}[/]")
        table.title = None
    console.print(table)


# -- output ---------------------------------------------------------------------------------------


def write_parquet(path: Path, rows: Sequence[dict[str, Any]], config: dict[str, Any]) -> None:
    schema = SCHEMA.with_metadata({"config": json.dumps(config)})
    table = pa.Table.from_pylist(list(rows), schema=schema)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)


def write_plot(path: Path, rows: Sequence[dict[str, Any]], scenarios: Sequence[Scenario]) -> None:
    """Top-1 accuracy against mean forks used, a panel per scenario."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    cells = _cells(rows)
    cols = min(4, max(1, len(scenarios)))
    nrows = math.ceil(len(scenarios) / cols)
    fig, axes = plt.subplots(
        nrows, cols, figsize=(3.2 * cols, 2.6 * nrows), squeeze=False, sharey=True
    )
    markers = {"auto": "o", "uniform-live": "s", "uniform-pinned": "^", "uniform-held": "v"}
    for i, s in enumerate(scenarios):
        ax = axes[i // cols][i % cols]
        for scheme in SCHEMES:
            points = [
                (_mean_forks(cell), _accuracy(cell))
                for _, budget in s.grid
                if (cell := cells.get((s.name, scheme, budget)))
            ]
            if points:
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, marker=markers[scheme], markersize=3, linewidth=1, label=scheme)
        default = [r for r in rows if r["scenario"] == s.name and r["default_budget"]]
        if default:
            ax.plot(
                [_mean_forks(default)],
                [_accuracy(default)],
                "k*",
                markersize=7,
                label="auto, no cap",
            )
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(LogLocator(base=2))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_ylim(-0.05, 1.05)
        ax.axhline(ACCURATE, color="grey", linewidth=0.5, linestyle=":")
        ax.set_title(f"{s.name} ({s.steps} steps, {s.seeds} seeds)", fontsize=8)
        ax.tick_params(labelsize=7)
        if i % cols == 0:
            ax.set_ylabel("top-1 accuracy", fontsize=7)
        if i // cols == nrows - 1:
            ax.set_xlabel("mean forks used", fontsize=7)
    for j in range(len(scenarios), nrows * cols):
        axes[j // cols][j % cols].axis("off")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=5, fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- the command ----------------------------------------------------------------------------------


def main(
    job_files: Sequence[Path] | None = None,
    *,
    quick: bool = False,
    scenarios: Sequence[str] | None = None,
    seeds: int | None = None,
    forks_per_step: Sequence[float] | None = None,
    max_budget: int | None = MAX_BUDGET,
    long_seeds: int | None = None,
    processes: int = 2,
    out: Path = DEFAULT_OUT,
    console: Console | None = None,
    draws: str = "coupled",
    schemes: Sequence[Scheme] = SCHEMES,
) -> int:
    """Accuracy against budget on the scenario suite (see the module docstring); writes
    `out`/accuracy.parquet and `out`/accuracy.png; 0 when every run ran, 1 if one raised
    (its row says why) or there is nothing to run.

    job_files: scenario jobs (default `validate.suite()`); scenarios: keep only the jobs
    whose folder has one of these names; seeds: R, the attribution seeds 0..R-1 (20, quick
    5); forks_per_step: the grid F (0.25 0.5 1 2 4 8, quick 0.5 1 4 8), a budget being F x
    the tape's steps rounded up, at most `max_budget` forks (None: no cap; the uniform
    schemes run only at budgets of one fork a step or more); long_seeds: the most seeds a
    tape over 32 steps runs (default: R; quick 0, i.e. skipped, or 1 when `scenarios` names
    it); processes: worker processes (1: all in this one); draws: what the simulated provider
    does with a seed (`sim_draws`: coupled, seeded, unseeded), every run alike (the exact
    values stay the held game's); schemes: the uniform schemes to run beside auto (all)."""
    if console is None:
        console = Console()
        if not console.is_terminal:  # piped: rich would assume 80 columns and squeeze the tables
            console = Console(width=200)
    began = time.perf_counter()
    paths = [Path(p) for p in job_files] if job_files else suite(heavy=True)
    if scenarios:
        wanted = set(scenarios)
        paths = [p for p in paths if p.parent.name in wanted]
        missing = wanted - {p.parent.name for p in paths}
        if missing:
            console.print(f"[bold red]no such scenario: {escape(', '.join(sorted(missing)))}")
            return 1
    r = seeds if seeds is not None else (QUICK_SEEDS if quick else SEEDS)
    grid = sorted(set(forks_per_step or (QUICK_FORKS_PER_STEP if quick else FORKS_PER_STEP)))
    quick_long = 1 if scenarios else 0  # --quick skips long tapes unless they are named
    long_r = long_seeds if long_seeds is not None else quick_long if quick else r
    plan: list[Scenario] = []
    for path in paths:
        scenario = plan_scenario(path, grid, r, long_r, max_budget)
        if scenario.seeds < 1:
            console.print(
                f"skipping {scenario.name} ({scenario.steps} steps: --long-seeds N to run it)",
                markup=False,
            )
            continue
        plan.append(scenario)
    if not plan:
        console.print("[bold red]no scenario to run: pass job files, or run from the repo")
        return 1
    tasks = [t for s in plan for t in tasks_of(s, draws, schemes)]
    console.print(
        f"{len(plan)} scenarios, {len(tasks)} attribution runs on {processes} process(es): "
        f"{r} seeds, forks a step {grid}, budgets at most {max_budget or 'any'} forks; tapes "
        f"over {LONG_STEPS} steps: {long_r} seeds"
    )
    results: list[Result] = []
    done_by: dict[str, int] = defaultdict(int)
    total_by = {s.name: len(tasks_of(s, draws, schemes)) for s in plan}

    def on_result(result: Result) -> None:
        results.append(result)
        name = result.task.scenario
        done_by[name] += 1
        if result.error is not None:
            line = f"{name} {result.task.scheme} failed: {result.error}"
            console.print(f"[bold red]{escape(line)}")
        if done_by[name] == total_by[name]:
            console.print(
                f"  {name}: {total_by[name]} runs done ({time.perf_counter() - began:.0f} s)",
                markup=False,
            )

    truth_json = _pool_map(processes, [s.job_file for s in plan], tasks, on_result)
    truths = {path: Truth.model_validate_json(text) for path, text in truth_json.items()}
    by_file = {s.job_file: s for s in plan}
    rows = [
        row_of(
            res,
            truths[res.task.job_file],
            by_file[res.task.job_file].steps,
            by_file[res.task.job_file].arms,
        )
        for res in sorted(
            results,
            key=lambda x: (x.task.scenario, x.task.scheme, x.task.budget or 0, x.task.seed),
        )
    ]
    console.print(f"[bold]Definitions[/]: {DEFINITIONS}")
    for table in accuracy_tables(rows, plan):
        _show(console, table)
    summary = summarize(rows, plan)
    ran = [scheme for scheme in SCHEMES if scheme in schemes or scheme == "auto"]
    _show(console, summary_table(summary, plan, ran))
    console.print(
        "median auto / best-uniform fewest forks over the suite: "
        + (
            f"{summary.median_ratio:.2f} (the {summary.median_of} of {len(plan)} scenarios "
            "where both reach the accuracy; negative controls left out; the uniform schemes "
            "run from one fork a step, auto below it too; auto from one fork a step: "
            + _fmt(summary.median_whole, ".2f", "—")
            + ")"
            if summary.median_ratio is not None
            else "— (no scenario other than a negative control where both reach the accuracy)"
        )
    )
    if set(OTHER_TOOLS) <= set(ran):
        console.print(
            "against the schemes other tools use (uniform-live, uniform-pinned): auto reaches the "
            f"accuracy on {len(summary.beats_others)} scenarios with a cause where neither does "
            f"({escape(', '.join(summary.beats_others)) or 'none'})"
            + (
                "; where one does, auto / their best: "
                + ", ".join(f"{escape(k)} {v:.2f}" for k, v in summary.others_ratios.items())
                if summary.others_ratios
                else ""
            )
        )
    console.print(
        f"auto, every capped run: {summary.covered}/{summary.checked} exact values inside "
        "their 95% intervals ("
        + _fmt(summary.coverage, ".1%", "—")
        + f"); of them the phi of the steps Shapley measured {summary.phi_covered}/"
        f"{summary.phi_checked} ("
        + _fmt(
            summary.phi_covered / summary.phi_checked if summary.phi_checked else None, ".1%", "—"
        )
        + "); mean phi-interval width "
        + _fmt(summary.phi_width, ".3f", "—")
    )
    _show(console, default_table(rows, plan))
    by_family = {f: scales(rows, summary, m) for f, m in families(plan).items()}
    for family, points in by_family.items():
        _show(console, scaling_table(family, points))
    wall = time.perf_counter() - began
    config: dict[str, Any] = {
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "scenarios": [s.name for s in plan],
        "quick": quick,
        "seeds": r,
        "long_seeds": long_r,
        "forks_per_step": grid,
        "max_budget": max_budget,
        "processes": processes,
        "tie": TIE,
        "accurate": ACCURATE,
        "wall_s": round(wall, 1),
        "cpu_count": os.cpu_count(),
    }
    parquet = out / "accuracy.parquet"
    write_parquet(parquet, rows, config)
    png = out / "accuracy.png"
    write_plot(png, rows, plan)
    written = [str(parquet), str(png)]
    if by_family:
        scaling = out / "scaling.png"
        write_scaling_plot(scaling, by_family)
        written.append(str(scaling))
    console.print(f"wrote {', '.join(written)}; wall time {wall:.0f} s", markup=False)
    failed = sum(res.error is not None for res in results)
    if failed:
        console.print(f"[bold red]{failed} runs raised: see the 'error' column")
    return 1 if failed else 0
