"""`car-ray batch`: many failure traces attributed under one budget, in one run loop.

Every trace is a job of the same job file on its own tape (`JobRun`), in its own folder
`<out>/<batch_id>/trace=<id>`; the traces share one Ray worker pool, one window and one
ledger (`SharedBudget`), and at most `MAX_ACTIVE` of them are begun at once, so the pool is
never idle while a trace waits on its stage. A trace that cannot be attributed (a corrupt
or incomplete tape, one whose outcome is not bad, another agent's, a prefix that no longer
replays) is reported with its reason and the batch goes on. A rerun of the same command on
the same output continues: finished traces are read back, interrupted ones resume from
their rows, and the batch's budget counts what every earlier run spent."""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pyarrow.dataset as pads
import structlog
from rich.console import Console

from ._answer import ANSWERED
from ._canon import digest_of
from ._usercode import UserCodeError
from .attribute import (
    EXIT_FAILED,
    EXIT_UNANSWERED,
    JobRun,
    _iso,
    check_tape,
    live_provider,
    make_executor,
)
from .execute import cluster_info, init_ray
from .job import Job
from .results import (
    SUMMARY_ROWS,
    TRACE_ROWS,
    BatchInfo,
    Caps,
    Held,
    JobInfo,
    RayInfo,
    Spend,
    Split,
    TraceRow,
    TraceState,
    answer_of,
    hold_job,
    job_location,
    shown,
    summarize,
    write_rows,
)
from .results._output import (
    OutputError,
    is_uri,
    list_location,
    location_name,
    read_location,
    staged_copy,
)
from .schedule import Budget, Cost, Scheduler, effective_budget
from .schedule._loop import JobSource, RunLoop, SharedBudget, Window
from .tape import LlmEvent, Tape, ToolEvent, load_tape

log = structlog.get_logger("car_ray.batch")

# Traces begun at once: enough that the window stays full while some wait on a stage's
# turn (a trace's stage often wants a handful of forks, then waits for their rows).
MAX_ACTIVE = 24
# A batch whose traces mostly end without an answer is a failed batch (exit 1).
FAILED_SHARE = 0.5
# Job statuses of a trace that has ended for good: a rerun reads it back. A trace its share
# of the budget stopped (STOPPED) ended too, but a rerun with room left continues it, as it
# does an interrupted one.
FINAL = {"complete", "failed", "control_failed", "verify_failed"}
STOPPED = {"budget_exhausted", "nothing_measured"}
ENDED = FINAL | STOPPED
UNATTRIBUTABLE = {"corrupt", "not_failing", "other_agent", "divergent", "agent_error"}


@dataclass
class Trace:
    """A trace of the batch: its tape (loaded, or the reason it could not be), where its
    job lives in the batch folder, and what the manifest says of it."""

    given: str  # the tape's path as given
    name: str  # the partition value: the tape id's first 16 hex digits, or the file's stem
    job: Job  # the job it runs (a sweep cell's: the job file with the cell's settings)
    tape: Tape | None = None
    recorded: float | None = None
    status: str = "pending"
    reason: str | None = None
    priority: float | None = None
    planted: str | None = None
    planted_step: int | None = None
    cap: Budget | None = None
    run: JobRun | None = None
    row: TraceRow | None = None
    part: str = "trace"  # the partition key: trace, or a sweep's cell
    settings: dict[str, Any] | None = None  # a sweep cell's settings

    @property
    def job_id(self) -> str:
        return f"{self.part}={self.name}"


@dataclass
class BatchResult:
    """What `run_batch` ended with: the batch's folder, its batch.json and a row a trace."""

    folder: str
    info: BatchInfo
    rows: list[TraceRow] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        """0 when every trace ended and most have an answer; 1 otherwise (traces the budget
        never reached, or mostly failed ones); 130 interrupted."""
        if self.info.status == "interrupted":
            return 130
        if self.info.status != "complete":
            return 1
        bad = [r for r in self.rows if r.status in EXIT_FAILED or r.status in UNATTRIBUTABLE]
        return 1 if self.rows and len(bad) / len(self.rows) > FAILED_SHARE else 0

    def strict_exit_code(self) -> int:
        """`exit_code`, and EXIT_UNANSWERED where it is 0 but a trace's job ran and did not
        answer (`--strict`)."""
        code = self.exit_code
        if code == 0 and self.unanswered():
            return EXIT_UNANSWERED
        return code

    def unanswered(self) -> list[TraceRow]:
        """The traces whose job ran and did not answer (`Answer.answered`)."""
        return [r for r in self.rows if r.answer is not None and r.answer not in ANSWERED]


def find_tapes(source: str | None, tapes: Sequence[str]) -> list[str]:
    """The tapes a batch attributes: `source`'s failing runs (a recording folder, local or a
    URI such as s3://bucket/runs, whose tapes carry marks: those marked failed; without any
    mark: every `*.tape`), then `tapes` (paths or URIs)."""
    found: list[str] = []
    if source is not None:
        found = _remote_runs(source) if is_uri(source) else _local_runs(source)
    found += [str(t) for t in tapes]
    if not found:
        raise ValueError(
            f"no tapes to attribute{f' in {shown(source)}' if source else ''}: give --from a "
            "folder of recorded runs (marked failed) or tape files"
        )
    return list(dict.fromkeys(found))


def _local_runs(source: str) -> list[str]:
    from .recorder import failing_tapes

    folder = Path(source)
    if not folder.is_dir():
        raise ValueError(
            f"--from {source}: no such folder (give the folder car_ray.recording writes "
            "its tapes to, or list tapes after the options)"
        )
    if any(folder.glob("*.mark.json")):
        return [str(p) for p in failing_tapes(folder)]
    return [str(p) for p in sorted(folder.glob("*.tape")) if not p.name.startswith(".")]


def _remote_runs(source: str) -> list[str]:
    """`_local_runs` of a folder at a URI (a recording folder copied to an object store):
    its marks are read there, and only the tapes a batch attributes are fetched later."""
    from .recorder import MARK_SUFFIX, TAPE_SUFFIX, parse_mark

    names = list_location(source)
    if names is None:
        raise ValueError(
            f"--from {shown(source)}: nothing there (give the URI of a folder holding "
            "recorded runs: their .tape and .mark.json files)"
        )
    tapes = [n for n in names if n.endswith(TAPE_SUFFIX) and not n.startswith(".")]
    if not any(n.endswith(MARK_SUFFIX) for n in names):
        return [job_location(source, n) for n in tapes]
    failing = []
    for name in tapes:
        mark = name.removesuffix(TAPE_SUFFIX) + MARK_SUFFIX
        if mark not in names:
            continue  # a run still going, or killed before its end: not a failure yet
        where = job_location(source, mark)
        try:
            if parse_mark(read_location(where) or b"", shown(where)).failing:
                failing.append(job_location(source, name))
        except ValueError as exc:
            log.warning("mark_unreadable", mark=shown(where), error=_line(exc))
    return failing


def check_jobs(jobs: Sequence[Job]) -> None:
    """A batch's job files: at least one, and one per agent (a tape goes to the job file of
    the agent that recorded it)."""
    if not jobs:
        raise ValueError("a batch needs a job file: give --job JOB.toml (one per agent)")
    by_agent: dict[str, Job] = {}
    for job in jobs:
        other = by_agent.setdefault(job.spec.agent, job)
        if other is not job:
            raise ValueError(
                f"--job {job.path} and --job {other.path} both attribute agent "
                f"{job.spec.agent!r}: give one job file per agent"
            )


def _load(jobs: Sequence[Job], given: str) -> Trace:
    """The trace of tape `given` with the job file of the agent that recorded it (the first
    job when none is: it says why it cannot run it), or one that says why it cannot be
    attributed."""
    try:
        tape = load_tape(staged_copy(given) if is_uri(given) else Path(given))
        tape.require_sealed()
    except (OSError, ValueError, OutputError) as exc:
        stem = location_name(given).removesuffix(".tape")
        return Trace(given, stem, jobs[0], status="corrupt", reason=_line(exc))
    job = next((j for j in jobs if j.spec.agent == tape.header.agent), jobs[0])
    trace = Trace(given, tape.tape_id[:16], job, tape=tape)
    try:
        trace.recorded = check_tape(job, tape)
    except (ValueError, UserCodeError) as exc:
        # Another agent's tape (no job file's agent replays it), or not a failure.
        other = tape.header.agent != job.spec.agent
        trace.status, trace.reason = ("other_agent" if other else "not_failing"), _line(exc)
        if other:
            agents = ", ".join(f"{j.spec.agent!r} ({j.path})" for j in jobs)
            trace.reason = _line(
                ValueError(
                    f"recorded by agent {tape.header.agent!r}, which no job file of the batch "
                    f"attributes ({agents}); add its job file with another --job"
                )
            )
    return trace


def read_manifest_for(manifest: Path | None, source: str | None) -> dict[str, dict[str, Any]]:
    """Priorities and planted causes by tape file name: `manifest` (a manifest.json), else
    `source`'s manifest.json if it has one (a folder or a URI), else none."""
    from .recorder import MANIFEST_NAME, parse_manifest

    if manifest is not None:
        where = str(manifest)
        try:
            data = manifest.read_bytes()
        except OSError as exc:
            raise ValueError(f"{manifest}: cannot read the manifest ({exc.strerror})") from None
    elif source is not None:
        where = job_location(source, MANIFEST_NAME)
        try:
            found = read_location(where)
        except OSError as exc:
            raise ValueError(f"{shown(where)}: cannot read the manifest ({exc})") from None
        if found is None:
            return {}
        data = found
    else:
        return {}
    entries = parse_manifest(data, shown(where))
    return {name: e.model_dump() for name, e in entries.items()}


def _line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:500]


def batch_id_of(jobs: Sequence[Job], traces: Sequence[Trace], split: Split) -> str:
    """The same job files and code over the same tapes, split the same way, is the same
    batch (budget aside: a rerun with a larger one continues it)."""
    identity: dict[str, Any] = {
        "request": jobs[0].request_identity(),
        "code": jobs[0].source_digests(),
        "tapes": sorted(t.tape.tape_id if t.tape else t.given for t in traces),
        "split": split,
    }
    if len(jobs) > 1:  # (one job's batch keeps the id it had before batches had many)
        identity["more"] = [[j.request_identity(), j.source_digests()] for j in jobs[1:]]
    name = ".".join(dict.fromkeys(j.name for j in jobs))[:60]
    return f"{name}-batch-{digest_of(identity)[:12]}"


def _min(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


class Shares:
    """A trace's caps when it begins: the job's own (`effective_budget`), within its share
    of the batch's budget by the split policy (`Split`)."""

    def __init__(self, split: Split, budget: Budget, traces: list[Trace]) -> None:
        self.split, self.budget = split, budget
        runnable = [t for t in traces if t.tape is not None and t.status == "pending"]
        self.weights = {
            t.name: (t.priority or 1.0) if split == "priority" else 1.0 for t in runnable
        }
        self.total = sum(self.weights.values()) or 1.0

    def cap(
        self, trace: Trace, shared: SharedBudget, running: Sequence[Trace], waiting: int
    ) -> Budget:
        """`trace`'s caps as it begins, with `running` traces begun and `waiting` traces
        (this one too) not yet."""
        assert trace.tape is not None
        job = trace.job
        own = job.spec.budget
        steps = len(trace.tape.steps) if job.spec.method == "auto" else None
        base = effective_budget(
            Budget(own.max_forks, own.max_usd, own.max_tokens, own.max_wall_s), steps
        )
        b = self.budget
        if self.split == "adaptive":
            # An equal share of what is left: the spend so far, and what running traces may
            # still spend up to their caps, is not left.
            held = Cost()
            for other in running:
                if other.cap is not None and other.run is not None and other.run.scheduler:
                    spent = other.run.scheduler.governor.spent
                    held += Cost(
                        max(0, (other.cap.max_forks or 0) - spent.forks),
                        max(0.0, (other.cap.max_usd or 0.0) - spent.usd),
                        0,
                    )
            g = shared.governor.spent + shared.governor.carried
            n = max(1, waiting)
            usd = None if b.max_usd is None else max(0.0, (b.max_usd - g.usd - held.usd) / n)
            forks = None if b.max_forks is None else (b.max_forks - g.forks - held.forks) // n
        else:
            part = self.weights.get(trace.name, 1.0) / self.total
            usd = None if b.max_usd is None else b.max_usd * part
            forks = None if b.max_forks is None else int(b.max_forks * part)
        # A resumed trace's caps are its total across runs: what it spent is on top.
        already = trace.run.already + trace.run.carried if trace.run else Cost()
        if forks is not None:
            forks = max(1, forks) + already.forks
        if usd is not None:
            usd = max(usd, 1e-9) + already.usd
        max_forks = _min(base.max_forks, forks)
        return Budget(
            max_forks=None if max_forks is None else int(max_forks),
            max_usd=_min(base.max_usd, usd),
            max_tokens=base.max_tokens,
            max_wall_s=base.max_wall_s,
        )


def _top_fields(tape: Tape | None, top: dict[str, Any] | None) -> dict[str, Any]:
    """TraceRow's top_* fields from job.json's `top_cause`, and its root_* fields from the
    root it names."""
    if not top or not top.get("steps"):
        return {}
    first = top["steps"][0]
    step = int(first["step"])
    out: dict[str, Any] = {
        "top_step": step,
        "top_intervention": top.get("intervention"),
        "top_measure": top.get("measure"),
        "top_value": first.get("value"),
        "top_lo": first.get("low"),
        "top_hi": first.get("high"),
        "top_what": first.get("what"),
        "top_alone": len(top["steps"]) == 1,
    }
    if tape is not None and 0 <= step < len(tape.steps):
        event = tape.steps[step]
        if isinstance(event, LlmEvent):
            calls = (event.action or {}).get("tool_calls") or []
            out["top_kind"] = "llm"
            out["top_model"] = f"{event.provider}:{event.model}"
            out["top_tool"] = calls[0].get("name") if calls else None
        elif isinstance(event, ToolEvent):
            out["top_kind"] = "tool"
            out["top_tool"] = event.name
    root = top.get("root")
    if root:
        step = int(root["step"])
        out |= {
            "root_step": step,
            "root_intervention": root.get("intervention"),
            "root_value": root.get("value"),
            "root_lo": root.get("low"),
            "root_hi": root.get("high"),
            "root_what": root.get("what"),
        }
        out["root_tool"] = root.get("tool")
        if out["root_tool"] is None and tape is not None and 0 <= step < len(tape.steps):
            # A job.json written before the root kept its tool: the tape names it.
            event = tape.steps[step]
            if isinstance(event, ToolEvent):
                out["root_tool"] = event.name
    return out


def trace_row(trace: Trace, info: JobInfo | None) -> TraceRow:
    """A trace's row of traces.parquet, from its job.json (None: it never ran)."""
    spend = info.ledger.spent if info is not None and info.ledger else Spend()
    cap = trace.cap
    return TraceRow(
        trace=trace.name,
        tape=trace.given,
        tape_id=trace.tape.tape_id if trace.tape else None,
        folder=trace.job_id,
        status=info.status if info is not None else trace.status,
        reason=trace.reason or _reason(info),
        priority=trace.priority,
        cap_usd=cap.max_usd if cap else None,
        cap_forks=cap.max_forks if cap else None,
        forks=spend.forks,
        usd=spend.usd,
        tokens=spend.tokens,
        wall_s=info.wall_s if info is not None else None,
        verdict=info.verdict if info is not None else None,
        answer=_answer_kind(info),
        planted=trace.planted,
        planted_step=trace.planted_step,
        settings=json.dumps(trace.settings, sort_keys=True) if trace.settings else None,
        **_top_fields(trace.tape, info.top_cause if info is not None else None),
    )


def _answer_kind(info: JobInfo | None) -> str | None:
    """A trace's `Answer.kind` (from job.json; an older job.json's, from its notes)."""
    if info is None or info.status not in ("complete", "budget_exhausted"):
        return None
    answer = answer_of(info.answer, info.status, info.notes)
    return answer.kind if answer is not None else None


def _reason(info: JobInfo | None) -> str | None:
    """What a trace whose job did not give an answer says: its first error note, else its
    first note."""
    if info is None or info.status in ("complete", "budget_exhausted") or not info.notes:
        return None
    note = next((n for n in info.notes if n.severity == "error"), info.notes[0])
    return " ".join(note.text.split())[:500]


def batch_forks(folder: str) -> pads.Dataset:
    """Every trace's fork rows of a batch folder as one dataset, `trace` a column (hive
    partitioning on `trace=<id>`)."""
    import pyarrow.fs as pafs

    from .results._output import open_location

    fs, root = open_location(folder)

    files = [
        f.path
        for f in fs.get_file_info(pafs.FileSelector(root, recursive=True))
        if f.type == pafs.FileType.File
        and "/forks/" in f.path
        and f.base_name.startswith("part-")
        and f.base_name.endswith(".parquet")
    ]
    return pads.dataset(
        sorted(files),
        filesystem=fs,
        format="parquet",
        partitioning=pads.partitioning(flavor="hive"),
        partition_base_dir=root,
    )


ProgressFn = Callable[[str], None]


def run_batch(
    jobs: Job | Sequence[Job],
    tapes: Sequence[str],
    *,
    out: str | None = None,
    budget_usd: float | None = None,
    max_forks: int | None = None,
    split: Split = "adaptive",
    manifest: dict[str, dict[str, Any]] | None = None,
    address: str | None = None,
    console: Console | None = None,
    max_active: int = MAX_ACTIVE,
) -> BatchResult:
    """Attribute `tapes` (paths), each with the job file of the agent that recorded it
    (`jobs`: one per agent), under one budget; see the module's text. `manifest` maps a
    tape's file name to its `priority` and `planted` cause."""
    console = console or Console()
    given_jobs: dict[Path, Job] = {}  # a job file given twice counts once
    for job in [jobs] if isinstance(jobs, Job) else jobs:
        given_jobs.setdefault(job.path.resolve(), job)
    jobs = list(given_jobs.values())
    check_jobs(jobs)
    if budget_usd is None and max_forks is None:
        raise ValueError(
            "a batch needs a budget: give --budget-usd (dollars over every trace) and/or "
            "--max-forks"
        )
    if budget_usd is not None and not budget_usd > 0:
        raise ValueError(f"--budget-usd {budget_usd:g}: must be more than 0")
    if max_forks is not None and max_forks < 1:
        raise ValueError(f"--max-forks {max_forks}: must be at least 1")
    out = out or jobs[0].spec.out
    traces = [_load(jobs, t) for t in tapes]
    for trace in traces:
        entry = (manifest or {}).get(location_name(trace.given), {})
        trace.priority = entry.get("priority")
        trace.planted = entry.get("planted")
        trace.planted_step = entry.get("step")
    # The same tape twice (a copy under another name) is one trace: the first given.
    first: dict[str, Trace] = {}
    for trace in traces:
        first.setdefault(trace.name, trace)
    traces = list(first.values())
    batch_id = batch_id_of(jobs, traces, split)
    folder = job_location(out, batch_id)
    budget = Budget(max_forks=max_forks, max_usd=budget_usd)
    with hold_job(out, batch_id) as held:
        return _run(
            jobs, traces, out, batch_id, folder, budget, split, address, console, held, max_active
        )


def _run(
    jobs: Sequence[Job],
    traces: list[Trace],
    out: str,
    batch_id: str,
    folder: str,
    budget: Budget,
    split: Split,
    address: str | None,
    console: Console,
    held: Held,
    max_active: int,
    kind: Literal["batch", "sweep"] = "batch",
) -> BatchResult:
    """Run `traces` (a batch's, or a sweep's cells) to their end under `budget`, the batch's
    lock `held`; see the module's text."""
    run = _BatchRun(jobs, traces, out, batch_id, folder, budget, split, console, held, kind)
    return run.run(address, max_active)


class _BatchRun:
    """One run of a batch: what earlier runs left (`_resume`), the loop's feed, done and
    tick, and what the run ends with (`_end`)."""

    def __init__(
        self,
        jobs: Sequence[Job],
        traces: list[Trace],
        out: str,
        batch_id: str,
        folder: str,
        budget: Budget,
        split: Split,
        console: Console,
        held: Held,
        kind: Literal["batch", "sweep"],
    ) -> None:
        # The first job's [provider] sizes the pool and its window, for every agent.
        self.jobs, self.job = list(jobs), jobs[0]
        self.traces, self.out, self.folder = traces, out, folder
        self.budget, self.split, self.console, self.held = budget, split, console, held
        self.kind = kind
        self.previous = BatchInfo.read(out, batch_id)
        self.started = time.time()
        self.info = BatchInfo(
            batch_id=batch_id,
            kind=kind,
            job_file=str(self.job.path),
            job_files=[str(j.path) for j in jobs],
            request=self.job.spec.model_dump(mode="json"),
            split=split,
            budget=Caps(**budget.as_dict()),
            runs=(self.previous.runs if self.previous else 0) + 1,
            started=_iso(self.started),
        )
        self.interrupted: float | None = None  # when Ctrl-C came
        self.running: dict[str, Trace] = {}  # by job id
        self.busy_s = 0.0  # seconds with forks in flight
        self.looked = time.monotonic()
        self.printed = 0.0
        done_before, spent, carried = self._resume()
        self.queue = [t for t in traces if t.tape is not None and t.status == "pending"]
        self.shared = SharedBudget(budget, already_spent=spent, carried=carried)
        self.shares = Shares(split, budget, self.queue)
        bad = len([t for t in traces if t.status in UNATTRIBUTABLE])
        console.print(
            f"{kind} {batch_id}: {len(traces)} {trace_word(kind, len(traces))} "
            f"({len(self.queue)} to run, {done_before} done before, {bad} not attributable) "
            f"→ {shown(folder)}",
            markup=False,
            highlight=False,
        )
        if self.previous is not None and self.queue:
            console.print(
                f"continuing: {spent.forks} forks, ${spent.usd:.4f} spent by earlier runs; "
                "the budget is the batch's total across runs",
                markup=False,
            )

    def _resume(self) -> tuple[int, Cost, Cost]:
        """Read back what earlier runs of the batch left: traces that ended for good (their
        rows), the caps still standing, interrupted traces' jobs. Returns how many traces
        ended before, what every earlier run spent, and reservations it carried."""
        previous, info = self.previous, self.info
        same_budget = previous is not None and previous.budget == info.budget
        done_before, spent_total, carried_total = 0, Cost(), Cost()
        for trace in self.traces:
            if trace.tape is None or trace.status != "pending":
                continue
            old = JobInfo.read(self.folder, trace.job_id)
            state = previous.traces.get(trace.name) if previous else None
            ended = old is not None and old.status in FINAL
            if state is not None and state.cap is not None and (same_budget or ended):
                # Its share stands while the batch's budget does (a larger one is shared
                # anew); a trace that ended keeps the cap it ran under, in every later run.
                c = state.cap
                trace.cap = Budget(c.max_forks, c.max_usd, c.max_tokens, c.max_wall_s)
            if old is not None and ended:
                trace.status = old.status
                trace.row = trace_row(trace, old)
                spent = old.ledger.spent if old.ledger else Spend()
                spent_total += Cost(spent.forks, spent.usd, spent.tokens)
                done_before += 1
            elif old is not None:
                trace.run = _job_run(trace, self.folder, self.held)
                spent_total += trace.run.already
                carried_total += trace.run.carried
        for trace in self.traces:
            info.traces[trace.name] = TraceState(
                tape=trace.given,
                tape_id=trace.tape.tape_id if trace.tape else None,
                folder=trace.job_id,
                job_id=trace.job_id,
                priority=trace.priority,
                planted=trace.planted,
                status=trace.status,
                reason=trace.reason,
                cap=Caps(**trace.cap.as_dict()) if trace.cap is not None else None,
                settings=trace.settings,
            )
        return done_before, spent_total, carried_total

    def run(self, address: str | None, max_active: int) -> BatchResult:
        self.info.write(self.out)
        if not self.queue:  # every trace ended before, or cannot be attributed: start nothing
            return self._end()
        main = threading.current_thread() is threading.main_thread()
        with contextlib.ExitStack() as providers:
            # Each job's provider (a simulated one: its own policy), its agent in every worker.
            urls = [providers.enter_context(live_provider(j)) for j in self.jobs]
            self.ray_info = RayInfo.model_validate(cluster_info(init_ray(address)))
            more = list(zip(self.jobs[1:], urls[1:], strict=True))
            self.executor = make_executor(self.job, urls[0], more)
            self.workers = self.executor.worker_pids()
            window = Window(self.job.spec.provider.concurrency)
            self.loop = RunLoop(
                self.executor,
                [window, self.shared],
                max_active=max_active,
                on_done=self._done,
                on_wait=self._tick,
                feed=self._feed,
            )
            before = signal.signal(signal.SIGINT, self._on_interrupt) if main else None
            try:
                self.loop.run()
            except KeyboardInterrupt:
                for trace in self.running.values():
                    if trace.run is not None:
                        trace.run.stop()
                if self.interrupted is None:
                    self.interrupted = time.monotonic()
            finally:
                if before is not None:
                    signal.signal(signal.SIGINT, before)
                for trace in self.running.values():
                    if trace.run is not None:
                        trace.run.close()
                self.executor.shutdown()
        return self._end()

    def _feed(self) -> JobSource | None:
        """The next trace's scheduler, begun with its share; None while the batch's budget
        has no room (or Ctrl-C came, or none is left)."""
        if not self.queue or self.interrupted is not None:
            return None
        left = self.shared.governor.remaining()
        if left.forks == 0 or (left.usd is not None and left.usd <= 0):
            return None
        waiting = len(self.queue)
        trace = self.queue.pop(0)
        assert trace.tape is not None and trace.recorded is not None
        if trace.run is None:
            trace.run = _job_run(trace, self.folder, self.held)
        if trace.cap is None or self.split == "adaptive":
            running = list(self.running.values())
            trace.cap = self.shares.cap(trace, self.shared, running, waiting)
        trace.run.cap(trace.cap)
        agent = trace.job.spec.agent
        self.executor.add_tape(
            trace.tape.tape_id,
            trace.tape.path.read_bytes(),
            agent=None if agent == self.job.spec.agent else agent,
        )
        scheduler = trace.run.start(self.executor, self.ray_info, self.workers)
        self.running[trace.job_id] = trace
        state = self.info.traces[trace.name]
        state.status = "running"
        state.cap = Caps(**trace.cap.as_dict())
        return scheduler

    def _done(self, source: JobSource) -> None:
        """A trace's job ended: its files, its row, batch.json."""
        trace = self.running.pop(source.job_id)
        assert isinstance(source, Scheduler) and trace.run is not None
        outcome = source.outcome
        assert outcome is not None
        trace.run.settle(outcome, self.interrupted is not None)
        trace.run.finish(outcome)
        trace.status = outcome.status
        trace.row = trace_row(trace, trace.run.info)
        if outcome.status == "verify_failed":
            trace.row.reason = trace.row.reason or "the recorded prefix no longer replays"
        state = self.info.traces[trace.name]
        state.status, state.reason = trace.status, trace.row.reason
        if trace.tape is not None:
            self.executor.drop_tape(trace.tape.tape_id)
        trace.run = None  # its rows and estimators are on disk now
        self.info.spent = _spend(self.shared)
        self.info.write(self.out)

    def _tick(self) -> None:
        """While the loop waits: the pool's busy time, a progress line and a checkpoint
        every 2 s, and a Ctrl-C that did not stop the run within 5 s."""
        now = time.monotonic()
        if self.executor.in_flight:
            self.busy_s += now - self.looked
        self.looked = now
        if self.interrupted is not None and now - self.interrupted > 5.0:
            raise KeyboardInterrupt
        if now - self.printed < 2.0:
            return
        self.printed = now
        ended = [t for t in self.traces if t.status in ENDED or t.status in UNATTRIBUTABLE]
        spent = self.shared.governor.spent
        cap = f" of ${self.budget.max_usd:g}" if self.budget.max_usd else ""
        self.console.print(
            f"  {len(ended)}/{len(self.traces)} {trace_word(self.kind, len(self.traces))} ended, "
            f"{len(self.running)} running, {spent.forks} forks, ${spent.usd:.4f}{cap} spent",
            markup=False,
            highlight=False,
        )
        self.info.spent = _spend(self.shared)
        for trace in self.running.values():
            if trace.run is not None:
                trace.run.checkpoint()
        self.info.write(self.out)

    def _on_interrupt(self, signum: int, frame: Any) -> None:
        """The first Ctrl-C stops admitting forks and lets those in flight land; a second
        one stops at once."""
        if self.interrupted is not None:
            raise KeyboardInterrupt
        self.interrupted = time.monotonic()
        self.loop.stop()
        for trace in self.running.values():
            if trace.run is not None and trace.run.scheduler is not None:
                trace.run.scheduler.governor.stop("interrupted (Ctrl-C)")

    def _end(self) -> BatchResult:
        """Every trace's row (those not run say why), traces.parquet, the summary and page,
        and batch.json's last word."""
        info, interrupted = self.info, self.interrupted is not None
        for trace in self.traces:
            if trace.row is None:
                old = JobInfo.read(self.folder, trace.job_id) if trace.tape is not None else None
                ended = old if old is not None and old.status in ENDED else None
                trace.row = trace_row(trace, ended)
                if trace.row.status in ("pending", "running"):
                    trace.row.status = "interrupted" if interrupted and old else "pending"
                    trace.row.reason = (
                        "not run: interrupted; rerun the same command to continue"
                        if interrupted
                        else "not run: the batch's budget ran out first; rerun with a larger "
                        "--budget-usd/--max-forks on the same output to continue"
                    )
            info.traces[trace.name].status = trace.row.status
            info.traces[trace.name].reason = trace.row.reason
        rows = [t.row for t in self.traces if t.row is not None]
        unfinished = [r for r in rows if r.status in ("pending", "interrupted", "running")]
        info.status = (
            "interrupted" if interrupted else "budget_exhausted" if unfinished else "complete"
        )
        info.spent = _spend(self.shared)
        info.finished = _iso(time.time())
        info.wall_s = time.time() - self.started
        info.busy_share = self.busy_s / info.wall_s if info.wall_s else None
        if self.shared.overspent:
            info.notes.extend(f"OVERSPENT: {o}" for o in self.shared.overspent)
        batch_id = info.batch_id
        write_rows(self.out, batch_id, "traces.parquet", TRACE_ROWS, [r.model_dump() for r in rows])
        _write_summary(self.out, batch_id, info, rows)
        info.write(self.out)
        return BatchResult(self.folder, info, rows)


def _job_run(trace: Trace, folder: str, held: Held) -> JobRun:
    """The trace's job in the batch folder, resumed from what it holds there (its own
    "resuming" line unsaid: the batch says it once)."""
    assert trace.tape is not None and trace.recorded is not None
    return JobRun(
        trace.job,
        trace.tape,
        folder,
        trace.job_id,
        recorded=trace.recorded,
        held=held,
        console=Console(quiet=True),
    )


def trace_word(kind: str, n: int = 2) -> str:
    """What a batch's units are called: traces (a sweep's: cells), or one of them."""
    word = "cells" if kind == "sweep" else "traces"
    return word if n != 1 else word[:-1]


def _spend(shared: SharedBudget) -> Spend:
    s = shared.governor.spent
    return Spend(forks=s.forks, usd=s.usd, tokens=s.tokens)


def _write_summary(out: str, batch_id: str, info: BatchInfo, rows: list[TraceRow]) -> None:
    """summary.parquet: what carries the blame across the traces, with intervals; and the
    batch's report page."""
    confidence = float(info.request.get("confidence") or 0.95)
    summary = summarize([r.model_dump() for r in rows], confidence)
    write_rows(out, batch_id, "summary.parquet", SUMMARY_ROWS, summary)
    try:
        from .report import write_batch_report
    except ImportError:  # pragma: no cover - the report is optional on minimal installs
        return
    write_batch_report(out, info, rows, summary)


# The keys of each blame dimension the terminal names after a batch (`batch_text`).
MOST_NAMED = 3


def batch_text(result: BatchResult) -> str:
    """The batch's outcome for the terminal: counts by status and where it all is; then, where
    traces were attributed, the root and the rank-1 step most of them name (`summarize`)."""
    counts: dict[str, int] = {}
    for r in result.rows:
        counts[r.status] = counts.get(r.status, 0) + 1
    s = result.info.spent
    ran = [r for r in result.rows if r.answer is not None]
    open_ = len(result.unanswered())
    answers = f"; {len(ran) - open_} of {len(ran)} answered" if ran else ""
    return (
        f"{result.info.kind} {result.info.status}: "
        + ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
        + answers
        + f"; {s.forks} forks, ${s.usd:.4f} spent in {result.info.wall_s or 0:.1f} s → "
        + shown(result.folder)
        + _most_named(result)
    )


def _most_named(result: BatchResult) -> str:
    """What carries the blame, as lines after the batch's outcome ('' with no attributed
    trace): the roots the traces name and their rank-1 causes, the MOST_NAMED most named of
    each, with how many of the attributed traces name each ('roots: step 1 (lookup_order
    result) in 2 (of 3 attributed traces)')."""
    confidence = float(result.info.request.get("confidence") or 0.95)
    summary = summarize([r.model_dump() for r in result.rows], confidence)
    lines = []
    for dimension, what in (("root", "roots"), ("step", "rank-1 causes")):
        named = [row for row in summary if row["dimension"] == dimension]
        if not named:
            continue
        shown_ = [f"{row['key']} in {row['traces']}" for row in named[:MOST_NAMED]]
        more = f", {len(named) - MOST_NAMED} more" if len(named) > MOST_NAMED else ""
        of = int(named[0]["of"])
        word = trace_word(result.info.kind, of)
        lines.append(f"{what}: {', '.join(shown_)}{more} (of {of} attributed {word})")
    return "".join(f"\n{line}" for line in lines)


def rows_json(result: BatchResult) -> str:
    return json.dumps(
        {
            "batch": result.info.model_dump(mode="json"),
            "traces": [r.model_dump() for r in result.rows],
        },
        indent=2,
    )
