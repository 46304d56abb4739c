"""`car-ray sweep SWEEP.toml`: a grid over a job's settings, across one or more tapes, under
one global cap; every cell is a job (the job file with the cell's settings) run in the
batch's shared pool (`batch._run`), in `<out>/<sweep_id>/cell=<id>/`, compared at the end.

    job = "jobs/support_refund/job.toml"   # relative to the sweep file
    tapes = ["runs/a.tape"]                # default: the job's tape
    max_usd = 2.0                          # over every cell (and/or max_forks)
    [grid]
    method = ["auto", "uniform"]
    confidence = [0.9, 0.95]
    "budget.max_forks" = [100, 400]        # a cap per cell
    interventions = [[{kind = "resample"}], [{kind = "policy", model = "claude-sonnet-4-5"}]]

Stopped by the cap, the table says which cells completed and which did not; the same
command on the same output continues."""

from __future__ import annotations

import itertools
import json
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ._canon import digest_of
from .batch import MAX_ACTIVE, BatchResult, Trace, _load, _run
from .job import Job, JobFileError, JobSpec, load_job
from .results import Split, hold_job, job_location
from .schedule import Budget

# What a grid may vary: the attribution's settings. The agent, scorer, policy, input and
# provider are one pool's (every cell runs on the same workers); tapes are `tapes`.
GRID_KEYS = {
    "method",
    "forks_per_step",
    "uniform_tail",
    "confidence",
    "target_half_width",
    "attribution_seed",
    "interventions",
    "budget.max_forks",
    "budget.max_usd",
    "budget.max_tokens",
    "budget.max_wall_s",
}


class SweepSpec(BaseModel):
    """A sweep file."""

    model_config = ConfigDict(extra="forbid")

    job: str
    tapes: list[str] = Field(default_factory=list)
    out: str | None = None
    max_usd: float | None = Field(default=None, gt=0)
    max_forks: int | None = Field(default=None, ge=1)
    split: Split = "adaptive"
    grid: dict[str, list[Any]] = Field(default_factory=dict)


def load_sweep(path: Path) -> tuple[SweepSpec, Job]:
    """The sweep file and its job; a clear error naming the file and key otherwise."""
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise JobFileError(f"{path}: cannot read the sweep file ({exc.strerror})") from None
    except tomllib.TOMLDecodeError as exc:
        raise JobFileError(f"{path}: not valid TOML ({exc})") from None
    try:
        spec = SweepSpec.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise JobFileError(f"{path}: key {where!r}: {first['msg']}") from None
    for key, values in spec.grid.items():
        if key not in GRID_KEYS:
            raise JobFileError(
                f"{path}: grid key {key!r} cannot vary in a sweep (its cells share one pool "
                f"of workers: one agent, scorer, policy and provider); vary one of "
                f"{', '.join(sorted(GRID_KEYS))}"
            )
        if not values:
            raise JobFileError(f"{path}: grid key {key!r} has no values")
    if spec.max_usd is None and spec.max_forks is None:
        raise JobFileError(f"{path}: set max_usd and/or max_forks (the sweep's global cap)")
    return spec, load_job(path.parent / spec.job)


def cells(spec: SweepSpec) -> list[dict[str, Any]]:
    """Every combination of the grid's values (keys in sorted order), as settings."""
    keys = sorted(spec.grid)
    return [
        dict(zip(keys, combo, strict=True))
        for combo in itertools.product(*(spec.grid[k] for k in keys))
    ]


def cell_job(job: Job, settings: dict[str, Any], where: str) -> Job:
    """The job with a cell's settings; an invalid combination names the cell and key."""
    data = job.spec.model_dump(mode="json")
    for key, value in settings.items():
        target = data
        *parents, leaf = key.split(".")
        for p in parents:
            target = target.setdefault(p, {})
        target[leaf] = value
    try:
        return Job(job.path, JobSpec.model_validate(data))
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(p) for p in first["loc"])
        raise JobFileError(f"{where}: cell {settings}: key {key!r}: {first['msg']}") from None


def run_sweep(
    path: Path,
    *,
    out: str | None = None,
    address: str | None = None,
    console: Console | None = None,
) -> BatchResult:
    console = console or Console()
    spec, job = load_sweep(path)
    tapes = [str(path.parent / t) for t in spec.tapes]
    if not tapes:
        if job.tape_path is None:
            raise JobFileError(f"{path}: no tapes: set 'tapes' (or 'tape' in {job.path})")
        from ._scenario import ensure_tape  # a scenario's tape is recorded on first use

        tapes = [str(ensure_tape(job).path)]
    out = out or spec.out or job.spec.out
    loaded = {t: _load([job], t) for t in tapes}
    traces: list[Trace] = []
    for settings in cells(spec):
        cjob = cell_job(job, settings, str(path))
        for given, base in loaded.items():
            ident = {"settings": settings, "tape": base.tape.tape_id if base.tape else given}
            traces.append(
                Trace(
                    given,
                    digest_of(ident)[:12],
                    cjob,
                    tape=base.tape,
                    recorded=base.recorded,
                    status=base.status,
                    reason=base.reason,
                    part="cell",
                    settings=settings if len(loaded) == 1 else {**settings, "tape": given},
                )
            )
    identity = {
        "request": job.request_identity(),
        "code": job.source_digests(),
        "grid": spec.grid,
        "tapes": sorted(t.tape.tape_id if t.tape else t.given for t in loaded.values()),
        "split": spec.split,
    }
    name = path.stem.replace(" ", "_")[:40] or "sweep"
    sweep_id = f"{name}-sweep-{digest_of(identity)[:12]}"
    folder = job_location(out, sweep_id)
    budget = Budget(max_forks=spec.max_forks, max_usd=spec.max_usd)
    with hold_job(out, sweep_id) as held:
        return _run(
            [job], traces, out, sweep_id, folder, budget, spec.split, address, console, held,
            MAX_ACTIVE, "sweep",
        )  # fmt: skip


def comparison(result: BatchResult) -> Table:
    """The cells side by side: settings, status, rank-1 cause with its interval, spend."""
    table = Table(title=f"sweep {result.info.batch_id}: {result.info.status}")
    for col in ("cell", "settings", "status", "top cause", "value [lo, hi]", "forks", "$"):
        table.add_column(col)
    for r in result.rows:
        settings = json.loads(r.settings) if r.settings else {}
        shown = ", ".join(f"{k}={json.dumps(v)}" for k, v in settings.items())
        top = "—" if r.top_step is None else f"step {r.top_step} ({r.top_kind or '?'})"
        value = (
            "—"
            if r.top_value is None or r.top_lo is None or r.top_hi is None
            else f"{r.top_value:.2f} [{r.top_lo:.2f}, {r.top_hi:.2f}]"
        )
        table.add_row(
            escape(r.trace),
            escape(shown),
            escape(r.status + (f": {r.reason}" if r.reason and r.top_step is None else "")),
            escape(top),
            value,
            str(r.forks),
            f"{r.usd:.4f}",
        )
    return table
