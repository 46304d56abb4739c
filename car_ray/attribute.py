"""`car-ray attribute`: one attribution job, end to end.

Loads the tape, starts (or joins) Ray, resumes from what the output already holds, runs the
scheduler with a live progress display, and writes the attribution table, job.json and the
report."""

from __future__ import annotations

import contextlib
import glob
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import structlog
from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from . import __version__
from ._notes import Note
from .execute import (
    AgentCode,
    Executor,
    MemorySink,
    NoExecutor,
    RayExecutor,
    WorkerConfig,
    cluster_info,
    init_ray,
)
from .job import Job, request_identity
from .providers import PriceTable
from .replay import BaseUrls, is_bad
from .results import (
    Caps,
    ForkSink,
    Held,
    JobDir,
    JobInfo,
    Ledger,
    OutputError,
    ProgressInfo,
    RayInfo,
    Spend,
    StageState,
    StageTime,
    TapeRef,
    answer_of,
    describe_step,
    find_jobs,
    has_job,
    hold_job,
    is_uri,
    job_location,
    read_attribution,
    shown,
    split_job_location,
    top_cause,
    verdict,
    write_attribution,
)
from .schedule import (
    FAILED_STATUSES,
    Budget,
    Cost,
    JobOutcome,
    Progress,
    Scheduler,
    effective_budget,
    job_id_of,
)
from .tape import LlmEvent, Tape, load_tape

log = structlog.get_logger("car_ray.attribute")

# Job statuses that exit non-zero: a failed job, one that measured nothing, an interrupted one.
EXIT_FAILED = FAILED_STATUSES | {"nothing_measured", "interrupted"}
# `--strict`: the exit status of a job that ran as asked and did not answer (`unanswered`).
EXIT_UNANSWERED = 3


def unanswered(outcome: JobOutcome) -> bool:
    """Whether a job that was not a failure left its question open (`Answer.answered`): its
    budget ended before its top separated, or with no blame shown and steps not examined. A
    job.json written before answers were kept is judged by its notes (`answer_of`)."""
    answer = answer_of(outcome.answer, outcome.status, outcome.notes)
    return answer is not None and not answer.answered


# After Ctrl-C, how long forks in flight may take to settle before the driver stops anyway.
INTERRUPT_GRACE_S = 5.0
# A scorer that gave every one of at least this many scored forks the same value (the
# recorded one) may not read the run at all: said in a warning.
CONSTANT_SCORER_FORKS = 10


class Interrupted(Exception):
    """The job was stopped by Ctrl-C: what it wrote and spent is kept; the message says how
    many rows are saved and how to resume."""


def _interrupted_text(rows: int) -> str:
    return f"interrupted: {rows} rows saved; rerun the same command to resume"


def _interrupted_note(note: Note) -> Note:
    """The Shapley note of an interrupted job whose top did not separate (`held_notes` marks
    it `unseparated`, as if its budget had ended): the interrupt ended it, and the same
    command goes on (its projection of the forks a separation needs, made for a budget that
    ended, is left out)."""
    if note.kind != "shapley" or not note.figures.get("unseparated"):
        return note
    seeds = note.figures.get("seeds", 0)
    text = (
        f"shapley: {seeds} seeds; the job was interrupted before the top separated; rerun the "
        "same command"
    )
    return note.model_copy(update={"text": text, "figures": {"seeds": seeds, "unseparated": True}})


def check_tape(job: Job, tape: Tape) -> float:
    """Before anything starts: the tape was recorded by the job's agent, and its recorded
    outcome is bad (there is something to explain), and it has a model step (what car-ray
    re-draws). Returns the recorded outcome; one-line `ValueError` otherwise."""
    refused = tape.seal.error if tape.seal is not None else None
    if refused is not None and refused.type == "UnreadableCall":
        raise ValueError(
            f"{tape.path}: its recording was refused ({refused.message}); record it again "
            "once every model call goes through ctx"
        )
    if not any(isinstance(step, LlmEvent) for step in tape.steps):
        raise ValueError(
            f"{tape.path} has no model step ({len(tape.steps)} tool steps): car-ray blames a "
            "run's model calls, and none reached it. Build the agent's client with ctx "
            "(ctx.openai(), ctx.anthropic(), or http_client=ctx.http_client and "
            "base_url=ctx.base_url(...) for a framework's), then record the tape again"
        )
    if tape.header.agent != job.spec.agent and not _replays(job, tape):
        raise ValueError(
            f"{tape.path} was recorded by agent {tape.header.agent!r}, but {job.path} runs "
            f"{job.spec.agent!r}: point 'tape' at a tape of this agent, or record one "
            f"(car-ray record {job.path} -o TAPE)"
        )
    outcome = tape_outcome(job, tape)
    if not is_bad(outcome):
        raise ValueError(
            f"{tape.path}: the recorded outcome is {outcome:.2f} by scorer {job.spec.scorer!r} "
            "(below 0.5: not the bad outcome), so there is nothing to explain; attribute a "
            "tape of a run that went wrong, or check the scorer (1 is the bad outcome)"
        )
    return outcome


@contextmanager
def live_provider(job: Job) -> Iterator[BaseUrls]:
    """The job's provider, or the simulated one in its own process (out of the driver's
    way) with the job's policy."""
    settings = job.spec.provider
    if settings.base_url:
        url = settings.base_url.rstrip("/")
        yield BaseUrls(
            openai=settings.openai_base_url or url + "/v1",
            anthropic=settings.anthropic_base_url or url,
        )
        return
    from .sim import SimProcess

    if job.spec.policy is None:
        raise ValueError(f"{job.path}: set 'policy' (simulated provider) or [provider] base_url")
    with SimProcess(
        job.spec.policy,
        latency_s=settings.sim_latency_ms / 1000,
        rate_429=settings.sim_rate_429,
        rate_5xx=settings.sim_rate_5xx,
        draws=settings.sim_draws,
        search_path=job.code_path(),
    ) as sim:
        yield BaseUrls.for_server(sim.url)


def _replays(job: Job, tape: Tape) -> bool:
    """Whether the job's agent replays the tape faithfully, in this process and with no
    network (a renamed agent may still be the one that recorded it). An agent that raises
    is a `UserCodeError` naming its file and line."""
    from ._aio import run as run_loop
    from .replay import DivergenceError, ForkRunner

    runner = ForkRunner(job.load("agent"), job.load("scorer"), base_urls=BaseUrls.recorded_in(tape))
    runner.add_tape(tape)

    async def go() -> None:
        try:
            await runner.replay(tape.tape_id)
        finally:
            await runner.aclose()

    try:
        run_loop(go())
    except DivergenceError:
        return False
    return True


def _budget(job: Job, tape: Tape, max_usd: float | None, max_forks: int | None) -> Budget:
    """The job file's caps, overridden by the command line's, as the job will run them."""
    # As in a job file: a zero cap is no job at all (leave a cap out for none).
    if max_usd is not None and not max_usd > 0:
        raise ValueError(
            f"--max-usd {max_usd:g}: a dollar cap must be more than 0 (leave it out for the "
            "job file's cap)"
        )
    if max_forks is not None and max_forks < 1:
        raise ValueError(
            f"--max-forks {max_forks}: a fork cap must be at least 1 (leave it out for the "
            "job file's cap)"
        )
    b = job.spec.budget
    return effective_budget(
        Budget(
            max_forks=max_forks if max_forks is not None else b.max_forks,
            max_usd=max_usd if max_usd is not None else b.max_usd,
            max_tokens=b.max_tokens,
            max_wall_s=b.max_wall_s,
        ),
        len(tape.steps) if job.spec.method == "auto" else None,
    )


def with_seed(job: Job, seed: int | None) -> Job:
    """The job with `--seed` as its attribution seed (part of the job id)."""
    if seed is None:
        return job
    return Job(job.path, job.spec.model_copy(update={"attribution_seed": seed}))


def dry_run(job: Job, tape: Tape, max_usd: float | None, max_forks: int | None) -> str:
    """What the job may spend, before it starts: its caps, and the most one fork can cost
    (every model call from the first step live again, at configs/pricing.toml's prices)."""
    budget = _budget(job, tape, max_usd, max_forks)
    worst = worst_fork(job, tape)
    models = sorted({e.model for e in tape.steps if isinstance(e, LlmEvent)})
    lines = [
        f"{len(tape.steps)} steps ({', '.join(models) or 'no model calls'}); method "
        f"{job.spec.method}",
        f"caps: {budget.max_forks or '∞'} forks, "
        + (f"${budget.max_usd:g}" if budget.max_usd else "no dollar cap")
        + (f", {budget.max_tokens} tokens" if budget.max_tokens else ""),
        f"one fork costs at most ${worst.usd:.4f} ({worst.tokens} tokens) at the listed prices",
    ]
    if budget.max_forks:
        most = worst.usd * budget.max_forks
        if budget.max_usd:
            most = min(most, budget.max_usd)
        lines.append(f"the job spends at most ${most:.4f}; nothing runs on --dry-run")
    return "\n".join(lines)


def worst_fork(job: Job, tape: Tape) -> Cost:
    """The most one fork of the job can cost: every model call from the first step live
    again, at configs/pricing.toml's prices (the worst-case reservation)."""
    from .replay import ForkSpec, Resample

    prices = PriceTable.load(Path(job.spec.provider.pricing) if job.spec.provider.pricing else None)
    budget = _budget(job, tape, None, None)
    scheduler = Scheduler(
        job,
        tape,
        job_id="dry-run",
        executor=NoExecutor(),
        sink=MemorySink(),
        budget=budget,
        prices=prices,
    )
    everything = ForkSpec(
        tape_id=tape.tape_id, interventions={k: Resample() for k in range(len(tape.steps))}
    )
    return scheduler.estimate(everything, worst=True)


def answer_budget(job: Job, tape: Tape) -> str:
    """What budget gives this job an answer: the default of forks a step of its tape, and
    what that many forks cost at most (the worst-case estimate)."""
    forks = effective_budget(Budget(), len(tape.steps)).max_forks or 1
    usd = forks * worst_fork(job, tape).usd
    return f"--max-forks {forks} --max-usd {usd:.4g} (at most ${usd:.4f} at the listed prices)"


def measured(attribution: list[dict[str, Any]]) -> bool:
    """Whether the job measured anything: a ranked row (only measured rows are ranked)."""
    return any(r["rank"] is not None for r in attribution)


def _spend_text(p: Progress) -> str:
    caps = p.caps
    spend = [f"{p.spent.forks}" + (f"/{caps.max_forks}" if caps.max_forks else "") + " forks"]
    spend.append(f"${p.spent.usd:.4f}" + (f"/${caps.max_usd:g}" if caps.max_usd else ""))
    spend.append(f"{p.spent.tokens} tok" + (f"/{caps.max_tokens}" if caps.max_tokens else ""))
    return " · ".join(spend)


def leader_text(scheduler: Scheduler | None, tape: Tape, p: Progress) -> str:
    """The leading cause so far, named by its step and what happened there: the re-drawn step
    with the most blame once two seeds are complete (`Scheduler.lead`)."""
    lead = scheduler.lead() if scheduler is not None else None
    if lead is None:
        return ""
    step, phi = lead
    bounds = (
        f" [{phi.low:.2f}, {phi.high:.2f}]" if phi.low is not None and phi.high is not None else ""
    )
    return f"step {step}, where {describe_step(tape.steps[step], 60)} (φ {phi.value:.2f}{bounds})"


def progress_line(p: Progress, leader: str, stage: str | None = None) -> str:
    """One plain line of progress, for logs and pipes."""
    elapsed = time.monotonic() - p.started
    return (
        f"[{elapsed:6.1f} s] {stage or p.stage}: {p.done} forks done ({p.in_flight} in flight, "
        f"{p.resumed} resumed, {p.lost} lost); spent {_spend_text(p)}; "
        f"leader {leader or '—'}"
    )


def _progress_table(p: Progress, leader: str = "") -> Table:
    table = Table.grid(padding=(0, 2))
    elapsed = time.monotonic() - p.started
    table.add_row("stage", escape(p.stage))
    table.add_row(
        "forks", f"{p.done} done, {p.in_flight} in flight, {p.resumed} resumed, {p.lost} lost"
    )
    table.add_row("spent", escape(_spend_text(p)))
    table.add_row("leader", escape(leader or "—"))
    eta = f"{p.eta_s:.0f} s" if p.eta_s is not None else "—"
    table.add_row("time", f"{elapsed:.1f} s, ETA {eta}")
    return table


def results_table(outcome: JobOutcome, tape: Tape | None = None) -> Group:
    """The ranked table, one per intervention kind (re-drawn steps by blame first, then each
    other kind by flip-rate); each value over its interval, so it reads at 80 columns."""

    def span(v: Any, lo: Any, hi: Any) -> str:
        return "—" if v is None else f"{v:.2f}\n[{lo:.2f}, {hi:.2f}]"

    def what(r: dict[str, Any]) -> str:
        step = r["step"]
        if tape is not None and 0 <= step < len(tape.steps):
            return describe_step(tape.steps[step], 200)
        return str(r["label"])

    tables: list[Table] = []
    kinds = list(dict.fromkeys(r["intervention"] for r in outcome.attribution))
    for kind in kinds:
        rows = [r for r in outcome.attribution if r["intervention"] == kind]
        redrawn = kind == "resample"
        title = (
            "re-drawn steps, by blame (the steps to fix)"
            if redrawn
            else f"{kind} interventions, by flip-rate"
        )
        table = Table(
            title=f"{escape(title)} ({escape(outcome.status)})",
            title_justify="left",
            box=box.SIMPLE_HEAD,
            padding=(0, 1),
        )
        table.add_column("rank", justify="right")
        table.add_column("step", justify="right")
        table.add_column("what happened", overflow="fold", ratio=1)
        measures: tuple[tuple[str, str, str, str], ...] = (
            ("blame φ", "phi", "phi_lo", "phi_hi"),
            ("necessity", "necessity", "necessity_lo", "necessity_hi"),
            ("sufficiency", "sufficiency", "sufficiency_lo", "sufficiency_hi"),
        )
        if not redrawn:
            measures = (("flip-rate", "flip_rate", "flip_lo", "flip_hi"),)
        for name, *_ in measures:
            table.add_column(escape(name), justify="right", no_wrap=True)
        if not redrawn:
            table.add_column("forks", justify="right")
        for r in rows:
            cells = [
                "—" if r["rank"] is None else str(r["rank"]),
                str(r["step"]),
                what(r),
                *(span(r[v], r[lo], r[hi]) for _, v, lo, hi in measures),
            ]
            if not redrawn:
                cells.append(str(r["flip_n"]))
            table.add_row(*(escape(cell) for cell in cells))
        tables.append(table)
    return Group(*tables)


@dataclass
class SavedOutcome(JobOutcome):
    """A job's outcome read back from its files (nothing ran): `info` is its job.json."""

    info: JobInfo = field(kw_only=True)
    # A job that did not finish: what its ledger had reserved for forks that left no row.
    carried: Cost = field(kw_only=True, default_factory=Cost)


def load_saved(folder: str) -> SavedOutcome:
    """The outcome of the job whose output is `folder` (`<out>/<job_id>`), from its
    job.json and attribution.parquet; `ValueError` naming the folder if it holds no job."""
    out, job_id = split_job_location(folder)
    info = JobInfo.read(out, job_id)
    if info is None:
        raise ValueError(f"{shown(folder)}: no job.json here (not a car-ray job's output folder)")
    attribution = read_attribution(out, job_id) or []
    spent = _cost(info.ledger.spent if info.ledger else None)
    carried = Cost()
    if info.status == "running":
        # Not finished (it runs, or was killed): its rows on disk may be ahead of the ledger
        # job.json last wrote, and forks then in flight may have been spent. As a resume
        # reads them (`JobRun`).
        existing = ForkSink.existing(out, job_id).to_pylist()
        spent = _already(spent, existing)
        carried = _carried(info.ledger, existing)
    progress = Progress(
        stage="aggregate",
        resumed=spent.forks,
        lost=info.lost_forks,
        provider_errors=info.provider_errors,
        spent=spent,
    )
    return SavedOutcome(
        job_id,
        info.status,
        attribution,
        list(info.notes),
        progress,
        info.answer,
        info=info,
        carried=carried,
    )


def _already(spent: Cost, existing: list[dict[str, Any]]) -> Cost:
    """What a job spent before this run: the rows on disk are the truth for the forks that
    finished, the ledger adds attempts it counted that left no row."""
    return Cost(
        max(len(existing), spent.forks),
        max(sum(r["cost_usd"] for r in existing), spent.usd),
        max(sum(r["tokens_in"] + r["tokens_out"] for r in existing), spent.tokens),
    )


def _cost(spend: Spend | None) -> Cost:
    return Cost() if spend is None else Cost(spend.forks, spend.usd, spend.tokens)


def find_job(target: str, out: str = "out") -> str:
    """The output folder `target` names: a folder with a job.json (a path or a URI), or a job
    id (or its readable name, or a prefix of either: the newest such job) under `out`."""
    if has_job(target):
        return target
    found = [] if is_uri(target) else find_jobs(out, target)
    if not found:
        raise ValueError(
            f"{shown(target)}: no job output folder of that name, and no job id starting so "
            f"under {shown(out)}/ (pass the folder, or --out where the job wrote)"
        )
    return found[-1].folder


def summary(folder: str, outcome: JobOutcome, tape: Tape | None = None) -> dict[str, Any]:
    """The job as one JSON document (`--json`): status, verdict, spend, notes, the table."""
    p = outcome.progress
    return {
        "job_id": outcome.job_id,
        "folder": shown(folder),
        "status": outcome.status,
        "measured": measured(outcome.attribution),
        "verdict": verdict(
            outcome.attribution, tape, outcome.status, outcome.notes, outcome.answer
        ),
        "answer": outcome.answer.model_dump() if outcome.answer is not None else None,
        "forks_run": p.done,
        "resumed": p.resumed,
        "spent": p.spent.as_dict(),
        "notes": [n.model_dump() for n in outcome.notes],
        "attribution": outcome.attribution,
    }


def _stale_code(out: str, job: Job, tape: Tape, job_id: str) -> str | None:
    """A note when this job's request and tape were attributed before with other agent,
    scorer or policy source (a local output folder only): which changed, and where the
    old results are."""
    request = job.request_identity()
    code = job.source_digests()
    for path in sorted(glob.glob(os.path.join(glob.escape(out), "*", "job.json"))):
        if os.path.basename(os.path.dirname(path)) == job_id:
            continue
        folder = os.path.dirname(path)
        try:
            info = JobInfo.read(os.path.dirname(folder), os.path.basename(folder))
        except (OSError, ValueError):
            continue
        if info is None or info.tape is None or info.tape.id != tape.tape_id:
            continue
        if request_identity(info.request) != request:
            continue
        old = info.code
        if not old:
            continue  # written before job ids covered the code: nothing to compare
        changed = [k for k in code if old.get(k) != code[k]]
        files = job.source_files()
        what = ", ".join(f"the {k} ({files[k]})" for k in changed) or "the code"
        return (
            f"{what} changed since {folder} was run: its forks were scored by "
            "the old code, so this is a new job that runs fresh (the old results stay)"
        )
    return None


def attribute(
    job: Job,
    *,
    tape: Tape | None = None,
    out: str | None = None,
    address: str | None = None,
    max_usd: float | None = None,
    max_forks: int | None = None,
    console: Console | None = None,
    more: bool = False,
) -> tuple[str, JobOutcome]:
    """Run the job; returns its output folder and outcome. One run at a time per output
    folder (`JobBusy` names the other); a full or read-only disk is an `OutputError` that
    says the same command resumes the job. A job that is complete is not run again: its
    saved outcome comes back (`SavedOutcome`) unless `more` asks for tighter intervals.
    Ctrl-C stops it cleanly (`Interrupted`)."""
    console = console or Console()
    if tape is None:
        paths = job.tape_paths
        if not paths:
            raise ValueError(f"{job.path}: no 'tape' to attribute")
        tape = load_tape(paths[0])
    tape.require_sealed()
    # Everything that can be known wrong before Ray starts, in one line each.
    recorded = check_tape(job, tape)
    _budget(job, tape, max_usd, max_forks)
    out = out or job.spec.out
    job_id = job_id_of(job, tape)
    folder = job_location(out, job_id)
    previous = JobInfo.read(out, job_id)
    if previous is not None and previous.status == "complete" and not more:
        saved = load_saved(folder)
        spent = saved.progress.spent
        saved.notes.append(
            Note(
                kind="complete",
                text=f"this job was complete: nothing run, nothing spent now (it spent "
                f"{spent.forks} forks, ${spent.usd:.4f} in all). `--more` runs on to halve the "
                f"target interval width (±{job.spec.target_half_width / 2:g}) under as much "
                "budget again",
            )
        )
        return folder, saved
    stale = None if is_uri(out) or previous else _stale_code(out, job, tape, job_id)
    if stale:
        console.print(f"[yellow]note: {escape(stale)}[/]", soft_wrap=not console.is_terminal)
    # A second run on the same output would run forks twice and under-report the spend.
    with hold_job(out, job_id) as held:
        folder, outcome = _run_job(
            job, tape, out, job_id, address, max_usd, max_forks, console, recorded, more, held
        )
    if stale:
        outcome.notes.insert(0, Note(kind="stale_code", severity="warning", text=stale))
    return folder, outcome


def _carried(ledger: Ledger | None, existing: list[dict[str, Any]]) -> Cost:
    """What an earlier run had reserved for forks that never left a row (it died with them
    in flight): they may have been spent. Earlier carried amounts stay carried."""
    if ledger is None:
        return Cost()
    carried = _cost(ledger.carried)
    if ledger.open is None:  # a job.json from before open reservations were saved: all of them
        return carried + _cost(ledger.reserved)
    written = {r["task_id"] for r in existing}
    for key, cost in ledger.open.items():
        if key.rpartition("#")[0] not in written:
            carried += _cost(cost)
    return carried


class JobRun:
    """One job's side of a run on a shared executor: what it resumes from (rows on disk,
    the last ledger), its job.json, its sink and scheduler, and what it writes when it
    ends. `attribute` runs one; `car-ray batch` and `car-ray sweep` run many at once.
    `budget` is the job's caps (the command line's over the job file's unless given)."""

    def __init__(
        self,
        job: Job,
        tape: Tape,
        out: str,
        job_id: str,
        *,
        recorded: float,
        held: Held,
        console: Console,
        max_usd: float | None = None,
        max_forks: int | None = None,
        more: bool = False,
        budget: Budget | None = None,
    ) -> None:
        self.job, self.tape, self.out, self.job_id = job, tape, out, job_id
        self.recorded, self.held = recorded, held
        budget = budget or _budget(job, tape, max_usd, max_forks)
        self.existing = ForkSink.existing(out, job_id).to_pylist()
        self.previous = JobInfo.read(out, job_id)
        self.ledger = self.previous.ledger if self.previous else None
        ledger = self.ledger
        spent = _cost(ledger.spent if ledger else None)
        # Rows are the truth for forks that finished; the ledger adds lost attempts.
        existing = self.existing
        self.already = _already(spent, existing)
        self.carried = _carried(ledger, existing)
        self.run_job = job
        previous = self.previous
        if more and previous is not None and previous.status == "complete":
            # As much budget again as the caps allow, for intervals half as wide.
            used = self.already + self.carried
            budget = Budget(
                max_forks=None if budget.max_forks is None else budget.max_forks + used.forks,
                max_usd=None if budget.max_usd is None else budget.max_usd + used.usd,
                max_tokens=None if budget.max_tokens is None else budget.max_tokens + used.tokens,
                max_wall_s=budget.max_wall_s,
            )
            half = job.spec.target_half_width / 2
            self.run_job = Job(job.path, job.spec.model_copy(update={"target_half_width": half}))
            console.print(
                f"--more: running on until every interval is within ±{half:g} (half the job's "
                f"target_half_width); caps now {budget.max_forks or '∞'} forks"
                + (f", ${budget.max_usd:g}" if budget.max_usd else "")
                + f" in all ({used.forks} forks, ${used.usd:.4f} already spent)",
                markup=False,
            )
        elif existing:
            unreported = f" and ${self.carried.usd:.4f} reserved by forks that never reported"
            console.print(
                f"resuming: {len(existing)} rows on disk, ${self.already.usd:.4f} spent"
                + (unreported if self.carried.forks else "")
                + "; caps are the job's total across runs",
                markup=False,
            )
        self.budget = budget
        self.started = time.time()
        self.info = JobInfo(
            job_id=job_id,
            name=job.name,
            status="running",
            request=job.spec.model_dump(mode="json"),
            job_file=str(job.path),
            code=job.source_digests(),
            tape=TapeRef(id=tape.tape_id, path=str(tape.path), steps=len(tape.steps)),
            budget=Caps(**budget.as_dict()),
            started=_iso(self.started),
            versions=_versions(),
            resumed_rows=len(existing),
            runs=(previous.runs if previous else 0) + 1,
        )
        self.sink: ForkSink | None = None
        self.scheduler: Scheduler | None = None

    def cap(self, budget: Budget) -> None:
        """Run under `budget` instead (a batch's share for this trace), before `start`."""
        self.budget = budget
        self.info.budget = Caps(**budget.as_dict())

    def start(
        self,
        executor: Executor,
        ray: RayInfo,
        workers: list[int],
        on_progress: Callable[[Progress], None] | None = None,
        on_submit: Callable[[], None] | None = None,
    ) -> Scheduler:
        """Write the first job.json and make the scheduler (its first rows go to the sink)."""
        info, previous = self.info, self.previous
        info.ray = ray
        info.workers = workers
        if self.ledger:
            # Until this run's ledger is written, the last one stands (with its reserved).
            info.ledger = self.ledger
        if previous is not None and previous.shapley_candidates:
            info.shapley_candidates = previous.shapley_candidates
        info.write(self.out)
        self.sink = ForkSink(self.out, self.job_id, guard=self.held.check)
        spec = self.job.spec
        prices = PriceTable.load(Path(spec.provider.pricing) if spec.provider.pricing else None)
        self.scheduler = Scheduler(
            self.run_job,
            self.tape,
            job_id=self.job_id,
            executor=executor,
            sink=self.sink,
            budget=self.budget,
            prices=prices,
            already=self.existing,
            already_spent=self.already,
            carried=self.carried,
            already_elapsed_s=(self.ledger.elapsed_s if self.ledger else None) or 0.0,
            precise_only=self.run_job is not self.job,  # --more on a complete job
            on_progress=on_progress,
            on_submit=on_submit or (lambda: self.checkpoint()),
            recorded=self.recorded,
        )
        return self.scheduler

    def checkpoint(self, p: Progress | None = None) -> None:
        """job.json follows the ledger: a killed driver's successor reads it."""
        scheduler = self.scheduler
        if scheduler is None:
            return
        self.info.ledger = Ledger.model_validate(scheduler.governor.snapshot())
        if scheduler.candidates:
            self.info.shapley_candidates = scheduler.candidates
        if scheduler.stage is not None:
            stage = scheduler.stage
            self.info.stage = StageState(name=stage.name, state=stage.state())
        self.info.progress = _progress_json(p or scheduler.progress)
        self.info.write(self.out)

    def settle(self, outcome: JobOutcome, interrupted: bool = False) -> None:
        """The status the scheduler cannot know: interrupted, or nothing measured (either
        answers nothing)."""
        if interrupted:
            outcome.status = "interrupted"
            text = _interrupted_text(len(self.existing) + outcome.progress.done)
            # The scheduler ended as if its budget had: its Shapley note says why it did not.
            outcome.notes[:] = [_interrupted_note(n) for n in outcome.notes]
            outcome.notes.append(Note(kind="interrupted", severity="warning", text=text))
        elif outcome.status == "budget_exhausted" and not measured(outcome.attribution):
            budget = self.budget
            outcome.status = "nothing_measured"
            outcome.notes.append(
                Note(
                    kind="nothing_measured",
                    severity="error",
                    text="NOTHING MEASURED: the budget ended before any step or arm had a "
                    f"value (caps: {budget.max_forks or '∞'} forks"
                    + (f", ${budget.max_usd:g}" if budget.max_usd else "")
                    + f"); a budget that gives an answer: {answer_budget(self.job, self.tape)}",
                )
            )
        else:
            return
        if outcome.answer is not None:
            outcome.answer = outcome.answer.model_copy(update={"kind": "unanswered"})

    def stop(self) -> int:
        """The run stopped before the job ended (Ctrl-C, a stopped batch): close the sink,
        keep the ledger (forks in flight keep their reservations, carried over by the next
        run); returns the rows saved in all."""
        with contextlib.suppress(OutputError):
            if self.sink is not None:
                self.sink.close()
        if self.scheduler is not None:
            self.info.ledger = Ledger.model_validate(self.scheduler.governor.snapshot())
        self.info.status, self.info.finished = "interrupted", _iso(time.time())
        self.info.write(self.out)
        done = self.scheduler.progress.done if self.scheduler else 0
        return len(self.existing) + done

    def close(self) -> None:
        if self.sink is not None:
            self.sink.close()

    def finish(self, outcome: JobOutcome) -> str:
        """Write what the job ended with: attribution.parquet, job.json and report.html;
        returns the job's folder."""
        self.close()
        scheduler, info, carried = self.scheduler, self.info, self.carried
        if scheduler is not None:
            warning = _constant_scorer(self.job, scheduler, self.recorded)
            if warning:
                outcome.notes.append(Note(kind="constant_scorer", severity="warning", text=warning))
        if carried.forks:
            outcome.notes.append(
                Note(
                    kind="carried",
                    text=f"carried over: ${carried.usd:.4f} ({carried.forks} forks) reserved by "
                    "forks an earlier run left in flight: counted against the caps, not shown "
                    "as spent",
                    figures={"forks": carried.forks, "usd": carried.usd},
                )
            )
        info.status = outcome.status
        info.notes = outcome.notes
        if scheduler is not None:
            info.ledger = Ledger.model_validate(scheduler.governor.snapshot())
            info.fork_statuses = dict(scheduler.statuses)
            stages = scheduler.stage_times.items()
            info.stages = {k: StageTime.model_validate(v) for k, v in stages}
            info.shapley_candidates = scheduler.candidates
        info.finished = _iso(time.time())
        info.progress = _progress_json(outcome.progress)
        info.wall_s = time.time() - self.started
        info.lost_forks = outcome.progress.lost
        # Forks that ended as provider_error (never scored, each run again), and every row's
        # status (fork_statuses): a job whose forks mostly have no outcome is "failed".
        info.provider_errors = outcome.progress.provider_errors
        info.recorded_outcome = self.recorded
        info.verdict = verdict(
            outcome.attribution, self.tape, outcome.status, outcome.notes, outcome.answer
        )
        info.top_cause = top_cause(outcome.attribution, self.tape)
        info.answer = outcome.answer
        write_attribution(self.out, self.job_id, outcome.attribution)
        info.write(self.out)
        try:
            from .report import render_report

            page = render_report(tape=self.tape, attribution=outcome.attribution, job=info)
            JobDir.of(self.out, self.job_id).write_atomic(page.encode("utf-8"), "report.html")
        except ImportError:  # pragma: no cover - the report is optional on minimal installs
            pass
        return job_location(self.out, self.job_id)


def make_executor(
    job: Job, urls: BaseUrls, more: Sequence[tuple[Job, BaseUrls]] = ()
) -> RayExecutor:
    """The job's pool of fork workers (Ray must be up), sized by its `[provider]`; `more`
    jobs' agents run in the same workers (their tapes added with `agent=` their ref)."""
    settings = job.spec.provider
    return RayExecutor(
        WorkerConfig(
            agent_ref=job.spec.agent,
            scorer_ref=job.spec.scorer,
            search_path=tuple(str(p) for p in job.code_path()),
            base_urls=urls.as_dict(),
            pricing=settings.pricing,
            requests_per_minute=settings.requests_per_minute,
            tokens_per_minute=settings.tokens_per_minute,
            max_attempts=settings.max_attempts,
            hold=job.spec.hold,
            decision_text=tuple(job.spec.decision_text),
            more_agents=tuple(
                AgentCode(
                    agent_ref=other.spec.agent,
                    scorer_ref=other.spec.scorer,
                    search_path=tuple(str(p) for p in other.code_path()),
                    base_urls=other_urls.as_dict(),
                    pricing=other.spec.provider.pricing,
                    hold=other.spec.hold,
                    decision_text=tuple(other.spec.decision_text),
                )
                for other, other_urls in more
            ),
        ),
        workers=settings.workers,
        per_worker_in_flight=max(1, settings.concurrency // settings.workers),
    )


def _run_job(
    job: Job,
    tape: Tape,
    out: str,
    job_id: str,
    address: str | None,
    max_usd: float | None,
    max_forks: int | None,
    console: Console,
    recorded: float,
    more: bool,
    held: Held,
) -> tuple[str, JobOutcome]:
    run = JobRun(
        job,
        tape,
        out,
        job_id,
        recorded=recorded,
        held=held,
        console=console,
        max_usd=max_usd,
        max_forks=max_forks,
        more=more,
    )
    interrupted: list[float] = []
    with live_provider(job) as urls:
        ray_info = RayInfo.model_validate(cluster_info(init_ray(address)))
        executor = make_executor(job, urls)
        executor.add_tape(tape.tape_id, tape.path.read_bytes())

        def on_interrupt(signum: int, frame: Any) -> None:
            # The first Ctrl-C stops new forks and lets those in flight settle; a second one
            # (or the grace period passing) stops at once.
            if run.scheduler is None or interrupted:
                raise KeyboardInterrupt
            interrupted.append(time.monotonic())
            run.scheduler.governor.stop("interrupted (Ctrl-C)")

        main = threading.current_thread() is threading.main_thread()
        before = signal.signal(signal.SIGINT, on_interrupt) if main else None
        try:
            # A terminal keeps the last display on screen; a pipe or log gets a line a stage.
            with Live(console=console, refresh_per_second=4, transient=False) as live:
                shown = saved = 0.0
                stage = ""

                def show(p: Progress) -> None:
                    nonlocal shown, saved, stage
                    now = time.monotonic()
                    if interrupted and now - interrupted[0] > INTERRUPT_GRACE_S:
                        raise KeyboardInterrupt
                    # The aggregate stage takes no time: the finished line follows.
                    if not console.is_terminal and p.stage not in (stage, "aggregate"):
                        stage = p.stage
                        line = progress_line(p, leader_text(run.scheduler, tape, p))
                        console.print(line, markup=False, highlight=False, soft_wrap=True)
                    if console.is_terminal and now - shown > 0.25:
                        live.update(_progress_table(p, leader_text(run.scheduler, tape, p)))
                        shown = now
                    if now - saved > 1.0:
                        run.checkpoint(p)
                        saved = now

                scheduler = run.start(executor, ray_info, executor.worker_pids(), show)
                outcome = scheduler.run()
                run.settle(outcome, bool(interrupted))
                final = leader_text(scheduler, tape, outcome.progress)
                if console.is_terminal:
                    live.update(_progress_table(outcome.progress, final))
                else:
                    line = progress_line(outcome.progress, final, f"finished ({outcome.status})")
                    console.print(line, markup=False, highlight=False, soft_wrap=True)
        except KeyboardInterrupt:
            raise Interrupted(_interrupted_text(run.stop())) from None
        except BaseException:
            # A full disk fails the close's flush too: report the first error; the journal
            # keeps every row the sink took, for the run that resumes the job.
            with contextlib.suppress(OutputError):
                run.close()
            raise
        finally:
            if before is not None:
                signal.signal(signal.SIGINT, before)
            run.close()
            executor.shutdown()
    return run.finish(outcome), outcome


def _iso(epoch_s: float) -> str:
    """A time in job.json: ISO 8601 in UTC, with its offset."""
    return datetime.fromtimestamp(epoch_s, UTC).isoformat()


def _progress_json(p: Progress) -> ProgressInfo:
    """The progress as job.json keeps it (`ProgressInfo`'s fields of `Progress`)."""
    fields = ProgressInfo.model_fields
    return ProgressInfo.model_validate({k: v for k, v in asdict(p).items() if k in fields})


def _constant_scorer(job: Job, scheduler: Scheduler, recorded: float) -> str | None:
    """A warning when the scorer gave every scored fork the recorded value, forks whose run
    left the tape included: it may not read the run at all."""
    rows = [r for r in scheduler.rows_by_task.values() if r["outcome"] is not None]
    # A re-draw that drew the recorded action again is the recorded run: not evidence.
    intervened = [r for r in rows if r.get("first_deviation") is not None]
    if len(rows) < CONSTANT_SCORER_FORKS or not intervened:
        return None
    if any(r["outcome"] != recorded for r in rows):
        return None
    return (
        f"WARNING: scorer {job.spec.scorer!r} gave all {len(rows)} scored forks "
        f"{recorded:.2f}, the recorded outcome, {len(intervened)} of them with a step "
        "changed: if a changed step should have changed the outcome, check that the scorer "
        "reads the result and trajectory it is given"
    )


def tape_outcome(job: Job, tape: Tape) -> float:
    """The scorer's value on the recorded run (for job.json and the report); a scorer that
    raises is a `UserCodeError` naming its file and line."""
    from .replay import recorded_trajectory, score_run

    assert tape.seal is not None
    return score_run(job.load("scorer"), tape.seal.result, recorded_trajectory(tape))


def _versions() -> dict[str, str]:
    import pyarrow
    import ray

    return {"car_ray": __version__, "ray": ray.__version__, "pyarrow": pyarrow.__version__}
