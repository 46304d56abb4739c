"""`car-ray attribute`: one attribution job, end to end.

Loads the tape, starts (or joins) Ray, resumes from what the output already holds, runs the
scheduler with a live progress display, and writes the attribution table, job.json and the
report."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import structlog
from rich.console import Console
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
    hold_job,
    read_job_json,
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


def _progress_table(p: Progress) -> Table:
    table = Table.grid(padding=(0, 2))
    elapsed = time.monotonic() - p.started
    caps = p.caps
    spend = [f"{p.spent.forks}" + (f"/{caps.max_forks}" if caps.max_forks else "") + " forks"]
    spend.append(f"${p.spent.usd:.4f}" + (f"/${caps.max_usd:g}" if caps.max_usd else ""))
    spend.append(f"{p.spent.tokens} tok" + (f"/{caps.max_tokens}" if caps.max_tokens else ""))
    table.add_row("stage", escape(p.stage))
    table.add_row(
        "forks", f"{p.done} done, {p.in_flight} in flight, {p.resumed} resumed, {p.lost} lost"
    )
    table.add_row("spent", " · ".join(spend))
    table.add_row("leader", escape(p.leader or "—"))
    eta = f"{p.eta_s:.0f} s" if p.eta_s is not None else "—"
    table.add_row("time", f"{elapsed:.1f} s, ETA {eta}")
    return table


def results_table(outcome: JobOutcome) -> Table:
    table = Table(title=f"attribution ({outcome.status})")
    for column in (
        "do",
        "rank",
        "step",
        "what",
        "flip-rate [interval] n",
        "φ [interval]",
        "necessity",
        "sufficiency",
    ):
        table.add_column(escape(column))
    for r in outcome.attribution:

        def span(v: Any, lo: Any, hi: Any) -> str:
            return "—" if v is None else f"{v:.2f} [{lo:.2f}, {hi:.2f}]"

        cells = (
            r["intervention"],
            "—" if r["rank"] is None else str(r["rank"]),
            str(r["step"]),
            r["label"],
            span(r["flip_rate"], r["flip_lo"], r["flip_hi"]) + f" {r['flip_n']}",
            span(r["phi"], r["phi_lo"], r["phi_hi"]),
            span(r["necessity"], r["necessity_lo"], r["necessity_hi"]),
            span(r["sufficiency"], r["sufficiency_lo"], r["sufficiency_hi"]),
        )
        table.add_row(*(escape(cell) for cell in cells))
    return table


def verdict(attribution: list[dict[str, Any]]) -> str:
    """One line: the step to fix (rank 1 by blame among re-drawn steps, what happened there,
    its phi and interval) and each other intervention kind's rank 1 by flip-rate."""

    def span(v: Any, lo: Any, hi: Any) -> str:
        return f"{v:.2f} [{lo:.2f}, {hi:.2f}]" if None not in (v, lo, hi) else "—"

    parts: list[str] = []
    for r in attribution:
        if r["rank"] != 1:
            continue
        where = f"step {r['step']} ({r['label']})"
        if r["intervention"] == "resample":
            parts.insert(0, f"fix {where}: blame φ {span(r['phi'], r['phi_lo'], r['phi_hi'])}")
        else:
            flip = span(r["flip_rate"], r["flip_lo"], r["flip_hi"])
            parts.append(f"{r['intervention']} at {where} flips it {flip}")
    if not any(r["intervention"] == "resample" and r["rank"] for r in attribution):
        measured = any(
            r["intervention"] == "resample" and r["phi"] is not None for r in attribution
        )
        parts.insert(
            0,
            "no step to blame: re-drawing no step changed the run"
            if measured
            else "no step measured",
        )
    return "verdict: " + "; ".join(parts)


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
        "started": started,
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
                info["progress"] = {"done": p.done, "lost": p.lost, "stage": p.stage}
                write_job_json(out, job_id, info)

        try:
            with Live(console=console, refresh_per_second=4, transient=True) as live:
                shown = saved = 0.0

                def show(p: Progress) -> None:
                    nonlocal shown, saved
                    now = time.monotonic()
                    if now - shown > 0.25:
                        live.update(_progress_table(p))
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
        finished=time.time(),
        wall_s=time.time() - started,
        lost_forks=outcome.progress.lost,
        # Forks that ended as provider_error (never scored, each run again), and every row's
        # status: a job whose forks mostly have no outcome is "failed".
        provider_errors=outcome.progress.provider_errors,
        fork_statuses=dict(scheduler.statuses) if scheduler else {},
        stages=scheduler.stage_times if scheduler else {},
        shapley_candidates=scheduler.candidates if scheduler else [],
        recorded_outcome=tape_outcome(job, tape),
        verdict=verdict(outcome.attribution),
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


def tape_outcome(job: Job, tape: Tape) -> float:
    """The scorer's value on the recorded run (for job.json and the report)."""
    from .replay import recorded_trajectory

    assert tape.seal is not None
    return float(job.load("scorer")(tape.seal.result, recorded_trajectory(tape)))


def _versions() -> dict[str, str]:
    import pyarrow
    import ray

    return {"car_ray": __version__, "ray": ray.__version__, "pyarrow": pyarrow.__version__}
