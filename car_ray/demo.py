"""`car-ray demo`: record the demo job if needed, replay it, fork it, print what happened."""

from __future__ import annotations

import asyncio
from collections import defaultdict

from rich.console import Console
from rich.table import Table

from .job import Job
from .replay import (
    AiohttpUpstream,
    BaseUrls,
    ContextEdit,
    EditContext,
    ForceAction,
    ForkRow,
    ForkRunner,
    ForkSpec,
    Intervention,
    ReplaceObservation,
    Resample,
    SwapPolicy,
    record,
)
from .sim import SimServer
from .tape import LlmEvent, Tape, ToolEvent, load_tape


async def run_demo(job: Job, console: Console, forks_per_step: int) -> None:
    from .cli import _rows_table, _steps_table

    agent, scorer, policy = job.load("agent"), job.load("scorer"), job.load("policy")
    tape_path = job.tape_path or job.folder / "demo.tape"
    with SimServer(policy) as sim:
        urls = BaseUrls.for_server(sim.url)
        if not tape_path.exists():
            console.print(f"recording {job.spec.agent} → {tape_path}")
            await record(
                agent, job.spec.agent, job.spec.input, tape_path, base_urls=urls, seed=job.spec.seed
            )
        tape = load_tape(tape_path)
        console.print(_steps_table(tape))
        runner = ForkRunner(agent, scorer, base_urls=urls, upstream=AiohttpUpstream())
        try:
            tape_id = runner.add_tape(tape)
            await runner.replay(tape_id)
            recorded = runner.recorded_outcome(tape_id)
            console.print(
                f"[green]replay faithful[/]: {len(tape.steps)} steps byte for byte; "
                f"recorded outcome {recorded:.2f} ({'bad' if recorded >= 0.5 else 'good'})"
            )
            specs = [
                ForkSpec(tape_id=tape_id, interventions={k: Resample()}, seed=s)
                for k in range(len(tape.steps))
                for s in range(forks_per_step)
            ]
            rows = await asyncio.gather(*(runner.run(spec) for spec in specs))
            table = Table(title=f"resample flip-rates ({forks_per_step} forks a step, live tail)")
            for column in ("step", "kind", "what", "forks", "flipped", "flip-rate"):
                table.add_column(column)
            by_step: dict[int, list[bool]] = defaultdict(list)
            for row in rows:
                by_step[row.steps_intervened[0]].append(bool(row.flipped))
            for event in tape.steps:
                flips = by_step[event.step]
                what = (
                    f"{event.provider}:{event.model}" if isinstance(event, LlmEvent) else event.name
                )
                table.add_row(
                    str(event.step),
                    event.type,
                    what,
                    str(len(flips)),
                    str(sum(flips)),
                    f"{sum(flips) / len(flips):.2f}",
                )
            console.print(table)
            console.print(
                _rows_table(await _other_forks(runner, tape_id, tape), "the other interventions")
            )
            console.print(f"simulated provider served {sim.requests_served} requests")
        finally:
            await runner.aclose()


async def _other_forks(runner: ForkRunner, tape_id: str, tape: Tape) -> list[ForkRow]:
    tools = [e for e in tape.steps if isinstance(e, ToolEvent)]
    llms = [e for e in tape.steps if isinstance(e, LlmEvent)]
    plans: list[dict[int, Intervention]] = []
    injected = next((e for e in tools if e.name == "lookup_order"), None)
    if injected is not None and isinstance(injected.result, dict):
        clean = {**injected.result, "notes": ""}
        plans.append({injected.step: ReplaceObservation(result=clean)})
    decision = next(
        (
            e
            for e in llms
            if any(c["name"] == "issue_refund" for c in (e.action or {}).get("tool_calls", []))
        ),
        None,
    )
    if decision is not None:
        plans.append(
            {decision.step: ForceAction(text="Sorry, this order is not eligible for a refund.")}
        )
        plans.append(
            {
                decision.step: EditContext(
                    edits=[
                        ContextEdit(op="regex", pattern=r"SYSTEM OVERRIDE:[^\"]*", replacement="")
                    ]
                )
            }
        )
        plans.append({decision.step: SwapPolicy(model="gpt-4o")})
    specs = [ForkSpec(tape_id=tape_id, interventions=p, seed=s) for p in plans for s in range(2)]
    return list(await asyncio.gather(*(runner.run(s) for s in specs)))
