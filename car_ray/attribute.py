"""`car-ray attribute`: one attribution job, end to end.

Loads the tape, starts (or joins) Ray, resumes from what the output already holds, runs the
scheduler with a live progress display, and writes the attribution table, job.json and the
report."""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
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
from .execute import RayExecutor, WorkerConfig, cluster_info, init_ray
from .job import Job
from .providers import PriceTable
from .replay import BaseUrls
from .results import (
    ForkSink,
    OutputError,
    describe_step,
    hold_job,
    read_job_json,
    top_cause,
    verdict,
    write_attribution,
    write_job_json,
    writing,
)
from .schedule import (
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
        search_path=job.code_path(),
    ) as sim:
        yield BaseUrls.for_server(sim.url)


def _budget(job: Job, tape: Tape, max_usd: float | None, max_forks: int | None) -> Budget:
    """The job file's caps, overridden by the command line's, as the job will run them."""
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
    prices = PriceTable.load(Path(job.spec.provider.pricing) if job.spec.provider.pricing else None)
    scheduler = Scheduler(
        job, tape, job_id="dry-run", executor=None, sink=None, budget=budget, prices=prices
    )
    from .replay import ForkSpec, Resample

    everything = ForkSpec(
        tape_id=tape.tape_id, interventions={k: Resample() for k in range(len(tape.steps))}
    )
    worst = scheduler.estimate(everything, worst=True)
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


def _spend_text(p: Progress) -> str:
    caps = p.caps
    spend = [f"{p.spent.forks}" + (f"/{caps.max_forks}" if caps.max_forks else "") + " forks"]
    spend.append(f"${p.spent.usd:.4f}" + (f"/${caps.max_usd:g}" if caps.max_usd else ""))
    spend.append(f"{p.spent.tokens} tok" + (f"/{caps.max_tokens}" if caps.max_tokens else ""))
    return " · ".join(spend)


_ARM = re.compile(r"\b([a-z]+)@(\d+)\b")


def leader_text(scheduler: Scheduler | None, tape: Tape, p: Progress) -> str:
    """The leading cause so far, named by its step and what happened there: the re-drawn step
    with the most blame once two seeds are complete, else the race's leaders with every
    `kind@step` spelled out."""
    shap = scheduler.seed_shapley if scheduler is not None else None
    if shap is not None and shap.candidates and len(shap.complete_seeds()) >= 2:
        phis = {k: e[0] for k, e in shap.estimates().items() if e[0].value is not None}
        if phis:
            step = max(phis, key=lambda k: phis[k].value or 0.0)
            phi = phis[step]
            bounds = f" [{phi.low:.2f}, {phi.high:.2f}]" if phi.low is not None else ""
            return (
                f"step {step}, where {describe_step(tape.steps[step], 60)} "
                f"(φ {phi.value:.2f}{bounds})"
            )

    def spelled(m: re.Match[str]) -> str:
        kind, step = m.group(1), int(m.group(2))
        if not 0 <= step < len(tape.steps):
            return m.group(0)
        what = describe_step(tape.steps[step], 60)
        return f"step {step}, where {what}" + ("" if kind == "resample" else f" ({kind})")

    return _ARM.sub(spelled, p.leader)


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
    table.add_row("leader", escape(leader or p.leader or "—"))
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


def attribute(
    job: Job,
    *,
    tape: Tape | None = None,
    out: str | None = None,
    address: str | None = None,
    max_usd: float | None = None,
    max_forks: int | None = None,
    console: Console | None = None,
) -> tuple[str, JobOutcome]:
    """Run the job; returns its output folder and outcome. One run at a time per output
    folder (`JobBusy` names the other); a full or read-only disk is an `OutputError` that
    says the same command resumes the job."""
    console = console or Console()
    if tape is None:
        paths = job.tape_paths
        if not paths:
            raise ValueError(f"{job.path}: no 'tape' to attribute")
        tape = load_tape(paths[0])
    tape.require_sealed()
    out = out or job.spec.out
    job_id = job_id_of(job, tape)
    # A second run on the same output would run forks twice and under-report the spend.
    with hold_job(out, job_id):
        return _run_job(job, tape, out, job_id, address, max_usd, max_forks, console)


def _run_job(
    job: Job,
    tape: Tape,
    out: str,
    job_id: str,
    address: str | None,
    max_usd: float | None,
    max_forks: int | None,
    console: Console,
) -> tuple[str, JobOutcome]:
    budget = _budget(job, tape, max_usd, max_forks)
    existing = ForkSink.existing(out, job_id).to_pylist()
    previous = read_job_json(out, job_id) or {}
    ledger = previous.get("ledger", {})
    from_rows = Cost(
        forks=len(existing),
        usd=sum(r["cost_usd"] for r in existing),
        tokens=sum(r["tokens_in"] + r["tokens_out"] for r in existing),
    )
    # What a killed driver had reserved may have been spent: count it (conservative).
    spent, reserved = ledger.get("spent", {}), ledger.get("reserved", {})
    from_ledger = Cost(
        forks=int(spent.get("forks", 0) + reserved.get("forks", 0)),
        usd=float(spent.get("usd", 0.0) + reserved.get("usd", 0.0)),
        tokens=int(spent.get("tokens", 0) + reserved.get("tokens", 0)),
    )
    already = Cost(
        max(from_rows.forks, from_ledger.forks),
        max(from_rows.usd, from_ledger.usd),
        max(from_rows.tokens, from_ledger.tokens),
    )
    prices = PriceTable.load(Path(job.spec.provider.pricing) if job.spec.provider.pricing else None)
    started = time.time()
    info: dict[str, Any] = {
        "job_id": job_id,
        "status": "running",
        "request": job.spec.model_dump(mode="json"),
        "job_file": str(job.path),
        "tape": {"id": tape.tape_id, "path": str(tape.path), "steps": len(tape.steps)},
        "budget": asdict(budget),
        "started": _iso(started),
        "versions": _versions(),
        "resumed_rows": len(existing),
        "runs": previous.get("runs", 0) + 1,
    }
    with live_provider(job) as urls:
        info["ray"] = cluster_info(init_ray(address))
        settings = job.spec.provider
        executor = RayExecutor(
            WorkerConfig(
                agent_ref=job.spec.agent,
                scorer_ref=job.spec.scorer,
                search_path=tuple(str(p) for p in job.code_path()),
                base_urls=urls.as_dict(),
                pricing=settings.pricing,
                requests_per_minute=settings.requests_per_minute,
                tokens_per_minute=settings.tokens_per_minute,
                max_attempts=settings.max_attempts,
            ),
            workers=settings.workers,
            per_worker_in_flight=max(1, settings.concurrency // settings.workers),
        )
        executor.add_tape(tape.tape_id, tape.path.read_bytes())
        info["workers"] = executor.worker_pids()
        if ledger:
            # Until this run's ledger is written, the last one stands (with its reserved).
            info["ledger"] = ledger
        if previous.get("shapley_candidates"):
            info["shapley_candidates"] = previous["shapley_candidates"]
        write_job_json(out, job_id, info)
        sink = ForkSink(out, job_id)
        scheduler: Scheduler | None = None

        def checkpoint(p: Progress) -> None:
            # job.json follows the ledger at every flush: a killed driver's successor reads it.
            if scheduler is not None:
                info["ledger"] = scheduler.governor.snapshot()
                if scheduler.candidates:
                    info["shapley_candidates"] = scheduler.candidates
                info["progress"] = _progress_json(p)
                write_job_json(out, job_id, info)

        try:
            # A terminal keeps the last display on screen; a pipe or log gets a line a stage.
            with Live(console=console, refresh_per_second=4, transient=False) as live:
                shown = saved = 0.0
                stage = ""

                def show(p: Progress) -> None:
                    nonlocal shown, saved, stage
                    now = time.monotonic()
                    # The aggregate stage takes no time: the finished line follows.
                    if not console.is_terminal and p.stage not in (stage, "aggregate"):
                        stage = p.stage
                        line = progress_line(p, leader_text(scheduler, tape, p))
                        console.print(line, markup=False, highlight=False, soft_wrap=True)
                    if console.is_terminal and now - shown > 0.25:
                        live.update(_progress_table(p, leader_text(scheduler, tape, p)))
                        shown = now
                    if now - saved > 1.0:
                        checkpoint(p)
                        saved = now

                scheduler = Scheduler(
                    job,
                    tape,
                    job_id=job_id,
                    executor=executor,
                    sink=sink,
                    budget=budget,
                    prices=prices,
                    already=existing,
                    already_spent=already,
                    already_elapsed_s=float(ledger.get("elapsed_s") or 0.0),
                    candidates=[int(k) for k in previous.get("shapley_candidates", [])],
                    on_progress=show,
                    on_submit=lambda: checkpoint(scheduler.progress) if scheduler else None,
                )
                outcome = scheduler.run()
                final = leader_text(scheduler, tape, outcome.progress)
                if console.is_terminal:
                    live.update(_progress_table(outcome.progress, final))
                else:
                    line = progress_line(outcome.progress, final, f"finished ({outcome.status})")
                    console.print(line, markup=False, highlight=False, soft_wrap=True)
        except BaseException:
            # A full disk fails the close's flush too: report the first error; the journal
            # keeps every row the sink took, for the run that resumes the job.
            with contextlib.suppress(OutputError):
                sink.close()
            raise
        finally:
            sink.close()
            executor.shutdown()
    info.update(
        status=outcome.status,
        notes=outcome.notes,
        ledger=scheduler.governor.snapshot() if scheduler else {},
        finished=_iso(time.time()),
        progress=_progress_json(outcome.progress),
        wall_s=time.time() - started,
        lost_forks=outcome.progress.lost,
        # Forks that ended as provider_error (never scored, each run again), and every row's
        # status: a job whose forks mostly have no outcome is "failed".
        provider_errors=outcome.progress.provider_errors,
        fork_statuses=dict(scheduler.statuses) if scheduler else {},
        stages=scheduler.stage_times if scheduler else {},
        shapley_candidates=scheduler.candidates if scheduler else [],
        recorded_outcome=tape_outcome(job, tape),
        verdict=verdict(outcome.attribution, tape),
        top_cause=top_cause(outcome.attribution, tape),
    )
    write_attribution(out, job_id, outcome.attribution)
    write_job_json(out, job_id, info)
    try:
        from .report import write_report

        report = Path(out) / job_id / "report.html"
        with writing(str(report)):
            write_report(report, tape=tape, attribution=outcome.attribution, job=info)
    except ImportError:  # pragma: no cover - the report is optional on minimal installs
        pass
    return os.path.join(out, job_id), outcome


def _iso(epoch_s: float) -> str:
    """A time in job.json: ISO 8601 in UTC, with its offset."""
    return datetime.fromtimestamp(epoch_s, UTC).isoformat()


def _progress_json(p: Progress) -> dict[str, Any]:
    return {
        "stage": p.stage,
        "done": p.done,
        "in_flight": p.in_flight,
        "resumed": p.resumed,
        "lost": p.lost,
        "provider_errors": p.provider_errors,
        "spent": asdict(p.spent),
    }


def tape_outcome(job: Job, tape: Tape) -> float:
    """The scorer's value on the recorded run (for job.json and the report)."""
    from .replay import recorded_trajectory

    assert tape.seal is not None
    return float(job.load("scorer")(tape.seal.result, recorded_trajectory(tape)))


def _versions() -> dict[str, str]:
    import pyarrow
    import ray

    return {"car_ray": __version__, "ray": ray.__version__, "pyarrow": pyarrow.__version__}
