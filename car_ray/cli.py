"""car-ray: which step of a recorded LLM-agent run caused the bad outcome.

Start with `car-ray attribute JOB.toml` (it records the job's tape when missing); `record`,
`inspect`, `replay` and `fork` work on one tape by hand."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import sys
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar, cast, get_args

import structlog
import typer
from pydantic import TypeAdapter, ValidationError
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from typer.core import TyperGroup, TyperOption

from ._aio import run as run_loop
from ._usercode import UserCodeError
from .job import Job, JobFileError, load_job
from .providers import api_keys_from_env
from .replay import (
    INTERVENTION_KINDS,
    AiohttpUpstream,
    BaseUrls,
    DivergenceError,
    ForkRow,
    ForkRunner,
    ForkSpec,
    Intervention,
    InterventionError,
    RecordingRefused,
    is_bad,
    record,
    tripwire,
)
from .tape import LlmEvent, Tape, TapeError, ToolEvent, load_tape

if TYPE_CHECKING:
    from .batch import BatchResult

# The order a new user needs them in: the one command that answers the question first.
_COMMAND_ORDER = (
    "attribute",
    "record",
    "inspect",
    "fork",
    "replay",
    "demo",
    "truth",
    "validate",
    "submit",
    "jobs",
    "status",
    "logs",
    "stop",
    "results",
)
_HELP = {"help_option_names": ["-h", "--help"]}


class _Commands(TyperGroup):
    def list_commands(self, ctx: Any) -> list[str]:
        names = super().list_commands(ctx)
        first = [n for n in _COMMAND_ORDER if n in names]
        return first + [n for n in names if n not in first]


def _flag_type(self: TyperOption, ctx: Any) -> str | None:
    # Typer labels an on/off flag `<bool>`, as if it took a value: a flag has no type.
    return None if self.is_flag else _TYPED_OPTION(self, ctx)


_TYPED_OPTION = TyperOption.display_type_rich
TyperOption.display_type_rich = _flag_type  # type: ignore[method-assign]

app = typer.Typer(
    cls=_Commands,
    no_args_is_help=True,
    add_completion=False,
    help=__doc__,
    context_settings=_HELP,
    rich_markup_mode="markdown",
)
sim_app = typer.Typer(
    no_args_is_help=True, help="The simulated model provider.", context_settings=_HELP
)
app.add_typer(sim_app, name="sim")
# Logs and pipes get a table wide enough to read; a terminal gets its own width.
_WIDTH = None if sys.stdout.isatty() or "COLUMNS" in os.environ else 150
console = Console(width=_WIDTH)
err = Console(stderr=True, width=_WIDTH)
T = TypeVar("T")
_INTERVENTION: TypeAdapter[Intervention] = TypeAdapter(Intervention)


class _Options:
    verbose = False  # --verbose: also the full stack of a failing agent or scorer


def _print_version(value: bool) -> None:
    if value:
        from . import __version__

        print(f"car-ray {__version__}")
        raise typer.Exit()


@app.callback()
def _quiet_logs(
    verbose: Annotated[bool, typer.Option("--verbose", help="log every fork's events")] = False,
    version: Annotated[
        bool,
        typer.Option(
            "--version", is_eager=True, callback=_print_version, help="print the version, exit"
        ),
    ] = False,
) -> None:
    """Logs go to stderr, warnings and worse unless --verbose: a fork's events (a blocked
    effect, a divergence) are in its row, not in the command's output."""
    _Options.verbose = verbose
    level = logging.INFO if verbose else logging.WARNING
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(level),
        # Whatever sys.stderr is when a line is logged (a test runner swaps it).
        logger_factory=_stderr_logger,
        cache_logger_on_first_use=False,
    )


def _stderr_logger(*args: Any) -> structlog.PrintLogger:
    return structlog.PrintLogger(sys.stderr)


Strict = Annotated[
    bool,
    typer.Option(
        "--strict",
        help="exit 3 when the job did not answer (the budget ended before its top separated, "
        "or with steps not examined); without it such a job exits 0 and its verdict line "
        "says so",
    ),
]


StrictMany = Annotated[
    bool,
    typer.Option(
        "--strict", help="exit 3 when a trace's job ran and did not answer (`Answer.answered`)"
    ),
]


def _fail(message: str, code: int = 2) -> typer.Exit:
    err.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
    return typer.Exit(code)


def _user_code_failed(job: Job, exc: UserCodeError) -> typer.Exit:
    """One line: the job file, the agent's or scorer's ref, the exception and the user's
    file:line. The stack is noise unless asked for (--verbose)."""
    if _Options.verbose and exc.stack:
        err.print(exc.stack, markup=False, highlight=False, soft_wrap=True)
    hint = " (car-ray --verbose shows the stack)" if exc.stack and not _Options.verbose else ""
    return _fail(exc.describe(job.path, getattr(job.spec, exc.role)) + hint)


def _plain(line: str) -> None:
    """A line of recorded or user-supplied text to stderr, never read as markup."""
    err.print(line, markup=False, highlight=False, soft_wrap=True)


def _job(path: Path) -> Job:
    try:
        return load_job(path)
    except JobFileError as exc:
        raise _fail(str(exc)) from None


def _tape(path: Path) -> Tape:
    try:
        return load_tape(path)
    except TapeError as exc:
        raise _fail(str(exc)) from None


def _run(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    return run_loop(make())


@contextmanager
def _provider(job: Job, base_url: str | None) -> Iterator[BaseUrls]:
    """The live provider: `--base-url`, else the job's, else the simulated one with the
    job's policy on 127.0.0.1 for as long as the command runs."""
    url = base_url or job.spec.provider.base_url
    if url:
        yield BaseUrls(
            openai=job.spec.provider.openai_base_url or url.rstrip("/") + "/v1",
            anthropic=job.spec.provider.anthropic_base_url or url.rstrip("/"),
        )
        return
    from .sim import SimServer

    try:
        policy = job.load("policy")
    except JobFileError as exc:
        raise _fail(f"{exc} (needed to run the simulated provider; or pass --base-url)") from None
    with SimServer(policy) as sim:
        yield BaseUrls.for_server(sim.url)


def _parse_value(kind: str, value: str | None) -> Intervention:
    """`--value` for each kind: JSON, or a plain string where that is unambiguous."""
    raw: Any = None
    if value is not None:
        try:
            raw = json.loads(value)
        except json.JSONDecodeError:
            raw = value
    data: dict[str, Any]
    if kind == "resample":
        data = {}
    elif kind == "action":
        if raw is None:
            raise _fail('--do action needs --value: a text, or JSON {"tool_calls": [...]}')
        data = raw if isinstance(raw, dict) else {"text": str(raw)}
    elif kind == "observation":
        data = raw if isinstance(raw, dict) and {"result", "error"} & set(raw) else {"result": raw}
    elif kind == "context":
        if raw is None:
            raise _fail(
                "--do context needs --value: JSON edits, e.g. "
                '\'[{"op": "regex", "pattern": "...", "replacement": ""}]\''
            )
        data = {"edits": raw if isinstance(raw, list) else [raw]}
    elif kind == "policy":
        if raw is None:
            raise _fail('--do policy needs --value: a model name, or JSON {"model", "base_url"}')
        data = raw if isinstance(raw, dict) else {"model": str(raw)}
    else:
        raise _fail(f"--do {kind!r}: expected one of {', '.join(INTERVENTION_KINDS)}")
    try:
        return _INTERVENTION.validate_python({"kind": kind, **data})
    except ValidationError as exc:
        first = exc.errors()[0]
        raise _fail(
            f"--value for {kind}: {first['msg']} at {'.'.join(map(str, first['loc']))}"
        ) from None


def _steps_table(tape: Tape) -> Table:
    table = Table(title=f"{escape(str(tape.path))}  ({'sealed' if tape.sealed else 'INCOMPLETE'})")
    for column in ("step", "kind", "tool / model", "preview"):
        table.add_column(column)
    for event in tape.steps:
        if isinstance(event, LlmEvent):
            action = event.action or {}
            calls = ", ".join(c["name"] for c in action.get("tool_calls") or [])
            text = action.get("text") or ""
            preview = (f"→ {calls}  " if calls else "") + text
            table.add_row(
                str(event.step),
                "llm",
                escape(f"{event.provider}:{event.model}"),
                escape(preview[:80]),
            )
        else:
            shown = event.error.message if event.error else json.dumps(event.result)
            flag = " (effect)" if event.effect else ""
            table.add_row(str(event.step), "tool", escape(event.name + flag), escape(shown[:80]))
    return table


def _row_table(row: ForkRow) -> Table:
    """One fork, one field a line."""
    table = Table(title=f"fork {row.task_id}")
    table.add_column("field")
    table.add_column("value", overflow="fold")
    for key, value in row.model_dump().items():
        if value is not None:
            shown = ", ".join(map(str, value)) if isinstance(value, list) else str(value)
            table.add_row(key, escape(shown))
    return table


@app.command("record")
def record_cmd(
    job_file: Annotated[Path, typer.Argument(help="the job's TOML file")],
    out: Annotated[
        Path | None,
        typer.Option("-o", "--out", help="where to write the tape (default: the job's 'tape')"),
    ] = None,
    base_url: Annotated[
        str | None, typer.Option(help="a live provider instead of the simulated one")
    ] = None,
    seed: Annotated[
        int | None, typer.Option(help="seed for the simulated provider's draws")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="overwrite an existing tape")] = False,
    until_bad: Annotated[
        bool,
        typer.Option(
            "--until-bad",
            help="record again (seed, seed+1, ...) until the scorer says the run went bad",
        ),
    ] = False,
    tries: Annotated[int, typer.Option(min=1, help="most runs --until-bad records")] = 20,
    show: Annotated[bool, typer.Option(hidden=True)] = True,
) -> Tape:
    """Run the job's agent live, record its tape and print the run's score."""
    job = _job(job_file)
    with tripwire():
        # A client the agent's module builds at import, without ctx, meets the tripwire.
        agent = job.load("agent")
    path = out or job.tape_path
    if path is None:
        raise _fail(f"{job.path}: no 'tape' in the job file; pass -o TAPE")
    first = job.spec.seed if seed is None else seed

    async def go(run_seed: int | None, overwrite: bool) -> tuple[Tape, Any]:
        with _provider(job, base_url) as urls:
            return await record(
                agent,
                job.spec.agent,
                job.spec.input,
                path,
                base_urls=urls,
                seed=run_seed,
                api_keys=api_keys_from_env(),
                overwrite=overwrite,
            )

    for attempt in range(tries if until_bad else 1):
        run_seed = None if first is None else first + attempt
        try:
            # Later attempts replace the tape this command wrote, never one it found.
            tape, outcome = run_loop(go(run_seed, force or attempt > 0))
        except FileExistsError as exc:
            raise _fail(str(exc)) from None
        except RecordingRefused as exc:
            raise _fail(str(exc)) from None
        score = _recorded_score(job, tape)
        if not until_bad or is_bad(score):
            break
        if outcome.error is not None:
            # A crash is not a run that went well: recording again would hide it.
            console.print(_steps_table(tape))
            raise _fail(
                f"seed {tape.header.seed}: the agent raised {outcome.error!r} (score "
                f"{score:.2f}, not bad); --until-bad stops at an agent's error: fix the agent, "
                f"or see its steps in {path}",
                code=1,
            )
        _plain(f"seed {tape.header.seed}: score {score:.2f}, not bad; recording again")
    if show:
        console.print(_steps_table(tape))
    hint = _unrecorded_hint(tape)
    if hint:
        console.print(f"[yellow]warning: {escape(hint)}[/]", soft_wrap=True)
    status = f"agent raised {escape(repr(outcome.error))}" if outcome.error else "agent returned"
    verdict = "bad" if is_bad(score) else "not bad"
    console.print(
        f"recorded {len(tape.steps)} steps (seed {tape.header.seed}), {status}; "
        f"score {score:.2f} ({verdict}); tape id [bold]{tape.tape_id}[/] → {escape(str(path))}",
        soft_wrap=True,
    )
    if until_bad and not is_bad(score):
        raise _fail(
            f"no bad run in {tries} tries (the scorer gave every run < 0.5): raise --tries, or "
            "check the scorer returns 1 for the outcome you want to explain"
            + (f"; and {hint}" if hint else ""),
            code=1,
        )
    return tape


# Calls a framework answers itself, never a tool the agent runs: the OpenAI Agents SDK's
# handoffs (transfer_to_<agent>) and pydantic-ai's structured output (final_result).
FRAMEWORK_CALLS = re.compile(r"^(transfer_to_.+|final_result)$")


def unrecorded_calls(tape: Tape) -> list[tuple[int, str]]:
    """The tool calls of model steps followed by another model call with no tool step
    between, as (step, tool): tools the agent ran outside car-ray. Only a model step none of
    whose calls was recorded counts (a recorded tool may go by another name than the model
    called it); the last model call's are left out (a run cut off after it ran no tool), and
    so are calls a framework answers itself (`FRAMEWORK_CALLS`)."""
    steps = tape.steps
    found: list[tuple[int, str]] = []
    for i, event in enumerate(steps):
        if not isinstance(event, LlmEvent):
            continue
        calls = [
            str(c.get("name"))
            for c in (event.action or {}).get("tool_calls") or []
            if not FRAMEWORK_CALLS.match(str(c.get("name")))
        ]
        later = steps[i + 1 :]
        nxt = next((j for j, e in enumerate(later) if isinstance(e, LlmEvent)), None)
        if calls and nxt is not None and not any(isinstance(e, ToolEvent) for e in later[:nxt]):
            found += [(event.step, name) for name in calls]
    return found


def _unrecorded_hint(tape: Tape) -> str:
    """What `record` says of `unrecorded_calls`: which tools, and the fix ('' with none)."""
    calls = unrecorded_calls(tape)
    if not calls:
        return ""
    tools = sorted({name for _, name in calls})
    steps = sorted({step for step, _ in calls})
    return (
        f"the model called {', '.join(tools)} (step(s) {', '.join(map(str, steps))}) and no "
        "tool step was recorded before its next call: a tool car-ray does not record is not "
        "replayed, runs live in every fork and cannot be replaced; if the agent runs it, "
        "define it with @car_ray.tool (@car_ray.tool(effect=True) if it changes the world; "
        "the Agents SDK and MCP integrations record their tools themselves)"
    )


def _recorded_score(job: Job, tape: Tape) -> float:
    """The scorer's value on a recorded run (1 the bad outcome), checked as `attribute`
    checks it (in [0, 1], not NaN)."""
    from .attribute import tape_outcome

    try:
        return tape_outcome(job, tape)
    except UserCodeError as exc:
        raise _user_code_failed(job, exc) from None


@app.command("replay")
def replay_cmd(
    tape_file: Annotated[Path, typer.Argument(help="the tape")],
    job_file: Annotated[Path, typer.Option("--job", help="the job whose agent to replay")],
) -> None:
    """Replay a tape with no network: exit 0 if faithful, 1 with the diff if not, 2 if the
    agent raises (where the recorded run did not) or the scorer fails."""
    job = _job(job_file)
    tape = _tape(tape_file)
    try:
        tape.require_sealed()
    except TapeError as exc:
        raise _fail(str(exc)) from None
    runner = ForkRunner(
        job.load("agent"),
        job.load("scorer"),
        base_urls=BaseUrls.recorded_in(tape),
    )
    runner.add_tape(tape)

    async def go() -> float:
        try:
            await runner.replay(tape.tape_id)
            return runner.recorded_outcome(tape.tape_id)
        finally:
            await runner.aclose()

    try:
        outcome = _run(go)
    except UserCodeError as exc:
        raise _user_code_failed(job, exc) from None
    except DivergenceError as exc:
        err.print("[bold red]replay diverged[/]")
        # Printed as is: a diff is read (and grepped) line by line, never re-wrapped.
        err.print(exc.render(), markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    console.print(
        f"[green]faithful[/]: {len(tape.steps)} steps replayed byte for byte, same result; "
        f"recorded outcome {outcome:.2f}"
    )


@app.command("fork")
def fork_cmd(
    tape_file: Annotated[Path, typer.Argument(help="the tape")],
    job_file: Annotated[Path, typer.Option("--job", help="the job (agent, scorer, policy)")],
    step: Annotated[int, typer.Option(help="the step to intervene on")],
    do: Annotated[
        str, typer.Option(help="resample | action | observation | context | policy")
    ] = "resample",
    value: Annotated[
        str | None, typer.Option(help="the intervention's value (JSON or text)")
    ] = None,
    tail: Annotated[str, typer.Option(help="live | pinned | held")] = "live",
    seed: Annotated[int, typer.Option(help="fixes every live draw")] = 0,
    base_url: Annotated[
        str | None, typer.Option(help="a live provider instead of the simulated one")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the row as JSON")] = False,
) -> None:
    """Run one fork of a tape and print its row."""
    if tail not in ("live", "pinned", "held"):
        raise _fail(f"--tail {tail!r}: expected live, pinned or held")
    job = _job(job_file)
    tape = _tape(tape_file)
    _step_of(tape, step)
    intervention = _parse_value(do, value)
    try:
        spec = ForkSpec(
            tape_id=tape.tape_id, interventions={step: intervention}, tail=tail, seed=seed
        )
    except ValidationError as exc:
        raise _fail(f"fork of step {step}: {exc.errors()[0]['msg']}") from None

    async def go() -> tuple[ForkRow, list[dict[str, Any]]]:
        with _provider(job, base_url) as urls:
            runner = ForkRunner(
                job.load("agent"),
                job.load("scorer"),
                base_urls=urls,
                upstream=AiohttpUpstream(),
                api_keys=api_keys_from_env(),
                decisions=job.decisions,
            )
            try:
                runner.add_tape(tape)
                return await runner.fork(spec)
            finally:
                await runner.aclose()

    try:
        row, trajectory = _run(go)
    except (TapeError, InterventionError) as exc:
        raise _fail(str(exc)) from None
    except UserCodeError as exc:
        raise _user_code_failed(job, exc) from None
    if as_json:
        print(row.model_dump_json(indent=2))
    else:
        console.print(_trajectory_table(tape, trajectory))
        console.print(_row_table(row))
        if row.divergence or row.error:
            _plain(row.divergence or row.error or "")
        console.print(_fork_summary(row), markup=False, highlight=False)


def _trajectory_table(tape: Tape, trajectory: list[dict[str, Any]]) -> Table:
    """What a forked run did, step by step, beside what the tape did where they differ."""
    from .results import describe_entry, describe_step

    table = Table(title="the forked run", title_justify="left")
    table.add_column("step", justify="right")
    table.add_column("from")
    table.add_column("what happened", overflow="fold")
    for entry in trajectory:
        k = int(entry["step"])
        what = describe_entry(entry)
        if k < len(tape.steps) and what != describe_step(tape.steps[k]):
            what += f"  (tape: {describe_step(tape.steps[k], 60)})"
        table.add_row(str(k), escape(str(entry.get("source"))), escape(what))
    return table


def _fork_summary(row: ForkRow) -> str:
    if row.outcome is None:
        return f"no outcome ({row.status}): the fork says nothing about step(s) " + ", ".join(
            map(str, row.steps_intervened)
        )
    change = "flipped" if row.flipped else "did not flip"
    return (
        f"outcome {row.outcome:.2f} against the tape's {row.recorded_outcome:.2f}: the outcome "
        f"{change} ({row.status}, ${row.cost_usd:.5f})"
    )


@app.command("attribute")
def attribute_cmd(
    job_file: Annotated[Path, typer.Argument(help="the job's TOML file")],
    out: Annotated[str | None, typer.Option(help="output folder or pyarrow filesystem URI")] = None,
    max_usd: Annotated[float | None, typer.Option(help="dollar cap (overrides the job)")] = None,
    max_forks: Annotated[int | None, typer.Option(help="fork cap (overrides the job)")] = None,
    address: Annotated[
        str | None,
        typer.Option(
            help="join this Ray cluster (host:port, or 'auto': RAY_ADDRESS or the last "
            "`ray start` here); without it the job starts its own local Ray, whatever "
            "RAY_ADDRESS says"
        ),
    ] = None,
    seed: Annotated[
        int | None, typer.Option(help="the attribution's seed (independent reruns; job id)")
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="print the caps and worst-case cost, run nothing")
    ] = False,
    more: Annotated[
        bool,
        typer.Option(
            "--more",
            help="on a complete job: run on, under as much budget again, until every interval "
            "is half the target width",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
    strict: Strict = False,
) -> None:
    """Find which step caused the bad outcome: forks on Ray, under the budget. A complete
    job is not run again: its results are printed (see --more)."""
    from ._scenario import ensure_tape
    from .attribute import Interrupted, attribute, with_seed
    from .attribute import dry_run as estimate
    from .execute import NoWorkers
    from .results import OutputError

    job = with_seed(_job(job_file), seed)
    try:
        tape = ensure_tape(job, on_record=_plain)
    except (TapeError, JobFileError) as exc:
        raise _fail(str(exc)) from None
    if dry_run:
        try:
            console.print(estimate(job, tape, max_usd, max_forks), markup=False)
        except ValueError as exc:
            raise _fail(str(exc)) from None
        return
    try:
        folder, outcome = attribute(
            job,
            tape=tape,
            out=out,
            address=address,
            max_usd=max_usd,
            max_forks=max_forks,
            console=err if as_json else console,
            more=more,
        )
    except UserCodeError as exc:
        raise _user_code_failed(job, exc) from None
    except (TapeError, JobFileError, ValueError) as exc:
        raise _fail(str(exc)) from None
    except OutputError as exc:  # another run holds the output, or its disk is full
        raise _fail(str(exc)) from None
    except NoWorkers as exc:  # every fork worker died for good: rows and spend are kept
        raise _fail(f"{exc}; rerun the same command to resume") from None
    except Interrupted as exc:
        err.print(escape(str(exc)))
        raise typer.Exit(130) from None
    _finish_outcome(folder, outcome, as_json, tape, strict)


@app.command("batch")
def batch_cmd(
    tapes: Annotated[
        list[str] | None, typer.Argument(help="tape files (besides --from's)", show_default=False)
    ] = None,
    job_files: Annotated[
        list[Path] | None,
        typer.Option(
            "--job",
            help="the job file traces are attributed with; repeat it for traces of several "
            "agents (each trace goes to its agent's job file) [default: job.toml]",
            show_default=False,
        ),
    ] = None,
    source: Annotated[
        str | None,
        typer.Option(
            "--from",
            help="a folder of recorded runs (car_ray.recording's), local or a URI such as "
            "s3://bucket/runs: those marked failed; without marks, every *.tape",
        ),
    ] = None,
    budget_usd: Annotated[
        float | None, typer.Option(help="dollars over every trace of the batch")
    ] = None,
    max_forks: Annotated[int | None, typer.Option(help="forks over every trace")] = None,
    split: Annotated[
        str,
        typer.Option(
            help="how the budget is split: adaptive (an equal share of what is left as each "
            "trace starts: traces that separate early give back the rest), equal, or "
            "priority (by the manifest's priorities)"
        ),
    ] = "adaptive",
    manifest: Annotated[
        Path | None,
        typer.Option(help="manifest.json of priorities and planted causes (default: --from's)"),
    ] = None,
    out: Annotated[str | None, typer.Option(help="output folder or pyarrow filesystem URI")] = None,
    address: Annotated[str | None, typer.Option(help="join this Ray cluster")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
    strict: StrictMany = False,
) -> None:
    """Attribute many failure traces under one budget, in one shared worker pool; output
    partitioned by trace (<out>/<batch_id>/trace=<id>/), a summary and a batch page."""
    from .batch import find_tapes, read_manifest_for, run_batch

    if split not in ("adaptive", "equal", "priority"):
        raise _fail(f"--split {split!r}: give adaptive, equal or priority")
    jobs = [_job(path) for path in job_files or [Path("job.toml")]]

    def start(shown: Console) -> BatchResult:
        return run_batch(
            jobs,
            find_tapes(source, tapes or []),
            out=out,
            budget_usd=budget_usd,
            max_forks=max_forks,
            split=split,  # type: ignore[arg-type]
            manifest=read_manifest_for(manifest, source),
            address=address,
            console=shown,
        )

    _run_many("batch", jobs, start, as_json, strict)


@app.command("sweep")
def sweep_cmd(
    sweep_file: Annotated[Path, typer.Argument(help="the sweep's TOML file (a grid of settings)")],
    out: Annotated[str | None, typer.Option(help="output folder or pyarrow filesystem URI")] = None,
    address: Annotated[str | None, typer.Option(help="join this Ray cluster")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
    strict: StrictMany = False,
) -> None:
    """Run a grid of settings over one or more tapes under one global cap, in one shared
    pool; output partitioned by cell; a comparison table at the end. The same command on
    the same output continues a sweep the cap or a kill stopped."""
    from .sweep import load_sweep, run_sweep

    try:
        _, job = load_sweep(sweep_file)
    except JobFileError as exc:
        raise _fail(str(exc)) from None

    def start(shown: Console) -> BatchResult:
        return run_sweep(sweep_file, out=out, address=address, console=shown)

    _run_many("sweep", [job], start, as_json, strict)


def _run_many(
    kind: str,
    jobs: list[Job],
    start: Callable[[Console], BatchResult],
    as_json: bool,
    strict: bool = False,
) -> None:
    """Run a batch or a sweep (`start`, given where its progress goes), print how it ended
    (a sweep's comparison table first; or --json) and exit with its verdict (`--strict`:
    3 when a trace's job did not answer)."""
    from .batch import batch_text, rows_json
    from .execute import NoWorkers
    from .results import OutputError
    from .sweep import comparison

    try:
        result = start(err if as_json else console)
    except UserCodeError as exc:  # named by the job file whose code it was in
        where = exc.where.rpartition(":")[0]
        job = next(
            (
                j
                for j in jobs
                if where and any(Path(where).is_relative_to(p) for p in j.code_path())
            ),
            jobs[0],
        )
        raise _user_code_failed(job, exc) from None
    except (TapeError, JobFileError, ValueError, OutputError) as exc:
        raise _fail(str(exc)) from None
    except NoWorkers as exc:
        raise _fail(f"{exc}; rerun the same command to continue the {kind}") from None
    if as_json:
        print(rows_json(result))
    else:
        if kind == "sweep":
            console.print(comparison(result))
        console.print(batch_text(result), markup=False, highlight=False)
    raise typer.Exit(result.strict_exit_code() if strict else result.exit_code)


def _finish_outcome(
    folder: str, outcome: Any, as_json: bool, tape: Tape | None = None, strict: bool = False
) -> None:
    """Print a job's outcome (a table and lines, or --json) and exit with its verdict: 1 for
    a failed job (130 interrupted); with `strict`, EXIT_UNANSWERED for one that did not
    answer (`unanswered`)."""
    from .attribute import EXIT_FAILED, EXIT_UNANSWERED, summary, unanswered

    if as_json:
        print(json.dumps(summary(folder, outcome, tape), indent=2, ensure_ascii=False, default=str))
    else:
        _print_outcome(folder, outcome, tape)
    if outcome.status in EXIT_FAILED:
        raise typer.Exit(130 if outcome.status == "interrupted" else 1)
    if strict and unanswered(outcome):
        raise typer.Exit(EXIT_UNANSWERED)


def _print_outcome(folder: str, outcome: Any, tape: Tape | None = None) -> None:
    from .attribute import SavedOutcome, results_table
    from .results import verdict

    console.print(results_table(outcome, tape))
    for note in outcome.notes:
        style = "bold red" if note.severity == "error" else "yellow"
        # A pipe or log gets each note on one line: a path in it is never broken.
        console.print(f"[{style}]{escape(note.text)}[/]", soft_wrap=not console.is_terminal)
    p = outcome.progress
    unfinished = outcome.status == "running"  # a saved job that never wrote its table
    if isinstance(outcome, SavedOutcome):
        held = outcome.carried
        console.print(
            f"saved results: spent {p.spent.forks} forks, ${p.spent.usd:.4f}, "
            f"{p.spent.tokens} tokens in all"
            + (
                f", and ${held.usd:.4f} ({held.forks} forks) reserved by forks in flight "
                "when it stopped, which may have been spent"
                if held.forks
                else ""
            )
        )
    else:
        console.print(
            f"{p.done} forks run ({p.resumed} resumed, {p.lost} lost and retried, "
            f"{p.provider_errors} provider failures retried); spent "
            f"{p.spent.forks} forks, ${p.spent.usd:.4f}, {p.spent.tokens} tokens"
        )
    from .results import JobDir, shown, split_job_location

    if isinstance(outcome, SavedOutcome):
        # Read back: the files there are (a job stopped hard wrote no table or report).
        out, job_id = split_job_location(folder)
        there = JobDir.of(out, job_id)
        names = ("attribution.parquet", "job.json", "report.html")
        files = ", ".join(n for n in names if there.info(n).is_file)
    else:
        files = "attribution.parquet, job.json, report.html"
    console.print(f"results: {shown(folder)}/forks/*.parquet, {files}", markup=False)
    # The last line, whole: a log or a pipe greps it.
    if unfinished:
        line = "verdict: none yet: the job has not finished (run it again on the same output)"
    else:
        line = verdict(outcome.attribution, tape, outcome.status, outcome.notes, outcome.answer)
    console.print(line, markup=False, highlight=False, soft_wrap=True)


@app.command("show")
def show_cmd(
    target: Annotated[str, typer.Argument(help="a job's output folder, or its job id / name")],
    out: Annotated[str, typer.Option(help="where to look for a job id")] = "out",
    as_json: Annotated[bool, typer.Option("--json", help="print the job as JSON")] = False,
    strict: Strict = False,
) -> None:
    """Reprint a past job's table and verdict from its files (nothing runs); exits as the
    job did."""
    from .attribute import find_job
    from .results import OutputError

    try:
        folder = find_job(target, out)
    except (ValueError, OutputError) as exc:  # OutputError: a URI that cannot be opened
        raise _fail(str(exc)) from None
    _show_saved(folder, as_json, strict=strict)


def _show_saved(
    folder: str, as_json: bool, tape_path: str | None = None, *, strict: bool = False
) -> None:
    """A past job's table and verdict from its output folder; exits as the job did. A folder
    whose job never finished (killed, or still running) says it is partial and exits 1.
    `tape_path`: where else the job's tape may be (a submitted job's ran from a copy)."""
    from .attribute import load_saved
    from .cluster import partial_note
    from .results import OutputError

    try:
        outcome = load_saved(folder)
    except (ValueError, OutputError) as exc:
        raise _fail(str(exc)) from None
    partial = partial_note(folder, outcome)
    if partial:
        outcome.notes.insert(0, partial)
    tape = None
    recorded = outcome.info.tape
    for path in (recorded.path if recorded else None, tape_path):
        # The verdict names what happened at the step when the tape is still there.
        with contextlib.suppress(TapeError, OSError):
            found = load_tape(path) if path else None
            if found is not None and (recorded is None or recorded.id == found.tape_id):
                tape = found
                break
    _finish_outcome(folder, outcome, as_json, tape, strict)
    if partial:
        raise typer.Exit(1)


_ADDRESS_HELP = (
    "the Ray head's dashboard, http://HOST:8265 (default: RAY_API_SERVER_ADDRESS, else RAY_ADDRESS)"
)
Address = Annotated[str | None, typer.Option("--address", help=_ADDRESS_HELP)]


@contextmanager
def _cluster_errors() -> Iterator[None]:
    """A cluster that cannot be reached, refuses or has no such job: one line, exit 2."""
    from .cluster import ClusterError

    try:
        yield
    except ClusterError as exc:
        raise _fail(str(exc)) from None


@app.command("submit")
def submit_cmd(
    job_file: Annotated[Path, typer.Argument(help="the job's TOML file")],
    address: Address = None,
    out: Annotated[
        str | None,
        typer.Option(help="output folder on the cluster's head (default: the job's 'out')"),
    ] = None,
    max_usd: Annotated[float | None, typer.Option(help="dollar cap (total across runs)")] = None,
    max_forks: Annotated[int | None, typer.Option(help="fork cap (total across runs)")] = None,
    seed: Annotated[
        int | None, typer.Option(help="the attribution's seed (independent reruns; job id)")
    ] = None,
    more: Annotated[
        bool, typer.Option("--more", help="on a complete job: run on for tighter intervals")
    ] = False,
) -> None:
    """Run `car-ray attribute` of the job on a Ray cluster as a Ray Job: the job's folder goes
    with it. Prints the submission id (stdout) and what to run next (stderr)."""
    from ._scenario import ensure_tape
    from .attribute import check_tape, with_seed
    from .cluster import submit

    job = with_seed(_job(job_file), seed)
    try:
        tape = ensure_tape(job, on_record=_plain)
        tape.require_sealed()
        check_tape(job, tape)
    except UserCodeError as exc:
        raise _user_code_failed(job, exc) from None
    except (TapeError, JobFileError, ValueError) as exc:
        raise _fail(str(exc)) from None
    extra = [
        *(["--max-usd", str(max_usd)] if max_usd is not None else []),
        *(["--max-forks", str(max_forks)] if max_forks is not None else []),
        *(["--seed", str(seed)] if seed is not None else []),
        *(["--more"] if more else []),
    ]
    with _cluster_errors():
        done = submit(job, tape, address=address, out=out, extra=extra)
    sid, where = done.submission_id, done.address
    _plain(f"submitted job {done.job_id} to {where} as {sid}; its output: {done.folder}")
    _plain(f"  car-ray logs {sid} --follow --address {where}")
    _plain(f"  car-ray results {sid} --address {where}")
    print(sid)


@app.command("jobs")
def jobs_cmd(address: Address = None) -> None:
    """The jobs submitted to the cluster, oldest first."""
    from .cluster import connect, describe, list_jobs

    with _cluster_errors():
        client = connect(address)
        jobs = [describe(j) for j in list_jobs(client)]
    if not jobs:
        console.print(f"no jobs submitted to {client.get_address()} yet", markup=False)
        return
    table = Table(title=f"jobs on {escape(client.get_address())}", title_justify="left")
    for column in ("submission id", "status", "car-ray job", "started (UTC)", "output"):
        table.add_column(column, overflow="fold")
    for j in jobs:
        cells = (j["submission_id"], j["status"], j["job_id"] or "—", j["started"] or "—")
        table.add_row(*(escape(c) for c in cells), escape(j["folder"] or "—"))
    console.print(table)


@app.command("status")
def status_cmd(
    submission_id: Annotated[str, typer.Argument(help="the id `car-ray submit` printed")],
    address: Address = None,
) -> None:
    """A submitted job's status (PENDING, RUNNING, SUCCEEDED, FAILED or STOPPED), Ray's
    message, and where its output is."""
    from .cluster import connect, describe, job_info

    with _cluster_errors():
        j = describe(job_info(connect(address), submission_id))
    message = f" ({j['message']})" if j["message"] else ""
    lines = [f"{j['submission_id']}: {j['status']}{message}"]
    if j["job_id"]:
        lines.append(f"car-ray job {j['job_id']}, output {j['folder']}")
    lines.append(f"started {j['started'] or '—'}, ended {j['ended'] or '—'} (UTC)")
    for line in lines:
        console.print(line, markup=False, highlight=False, soft_wrap=True)


@app.command("logs")
def logs_cmd(
    submission_id: Annotated[str, typer.Argument(help="the id `car-ray submit` printed")],
    address: Address = None,
    follow: Annotated[
        bool,
        typer.Option("--follow", "-f", help="go on until the job ends; exit 1 unless it succeeded"),
    ] = False,
) -> None:
    """A submitted job's output: the `car-ray attribute` lines its driver printed."""
    from .cluster import connect, follow_logs, logs

    def write(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    with _cluster_errors():
        client = connect(address)
        if not follow:
            write(logs(client, submission_id))
            return
        status = follow_logs(client, submission_id, write)
    _plain(f"{submission_id}: {status}")
    if status != "SUCCEEDED":
        raise typer.Exit(1)


@app.command("stop")
def stop_cmd(
    submission_id: Annotated[str, typer.Argument(help="the id `car-ray submit` printed")],
    address: Address = None,
    wait: Annotated[
        bool, typer.Option(help="wait until the job has saved its rows and stopped")
    ] = True,
) -> None:
    """Stop a submitted job as Ctrl-C stops `car-ray attribute`: forks in flight settle, the
    rows and the table so far are saved, and the same job resumes when submitted again."""
    from .cluster import STOP_WAIT_S, connect, stop, wait_for

    with _cluster_errors():
        client = connect(address)
        running = stop(client, submission_id)
        status = wait_for(client, submission_id, STOP_WAIT_S) if wait and running else None
    if not running:
        _plain(f"{submission_id} had already ended")
    elif status is None:
        _plain(f"{submission_id}: stopping (car-ray status {submission_id} says when it has)")
    else:
        _plain(f"{submission_id}: {status}")
        if status not in ("STOPPED", "SUCCEEDED", "FAILED"):
            raise typer.Exit(1)


@app.command("results")
def results_cmd(
    target: Annotated[
        str, typer.Argument(help="a submission id, a job's output folder, or its job id / name")
    ],
    address: Address = None,
    out: Annotated[str, typer.Option(help="where to look for a job id")] = "out",
    as_json: Annotated[bool, typer.Option("--json", help="print the job as JSON")] = False,
    strict: Strict = False,
) -> None:
    """The ranked table and verdict of a job, local or submitted, from its Parquet and
    job.json (nothing runs); exits as the job did, 1 if it never finished."""
    from .cluster import results_folder
    from .results import OutputError

    try:
        found = results_folder(target, out, address)
    except (ValueError, OutputError) as exc:  # ClusterError too; a URI that cannot be opened
        raise _fail(str(exc)) from None
    _show_saved(found.folder, as_json, found.tape_path, strict=strict)


@app.command("inspect")
def inspect_cmd(
    tape_file: Annotated[Path, typer.Argument(help="the tape")],
    step: Annotated[int | None, typer.Option(help="show this step in full")] = None,
) -> None:
    """Show a tape's steps (works on incomplete tapes too)."""
    tape = _tape(tape_file)
    if step is not None:
        _show_step(tape, _step_of(tape, step))
        return
    console.print(_steps_table(tape))
    for note in tape.notes:
        console.print(f"[yellow]note:[/] {escape(note)}")
    console.print(
        f"tape id {tape.tape_id}; agent {tape.header.agent}; created {tape.header.created}",
        markup=False,
    )


def _step_of(tape: Tape, step: int) -> LlmEvent | ToolEvent:
    """The tape's step `step`, or a one-line error saying which steps there are."""
    if not 0 <= step < len(tape.steps):
        raise _fail(
            f"--step {step}: {tape.path} has {len(tape.steps)} steps, numbered 0 to "
            f"{len(tape.steps) - 1} (car-ray inspect {tape.path} lists them)"
        )
    return tape.steps[step]


def _show_step(tape: Tape, event: LlmEvent | ToolEvent) -> None:
    """One step in full: what happened, then the recorded action or result as JSON."""
    from .results import describe_step

    console.print(
        f"step {event.step} of {len(tape.steps)} ({event.type}): "
        + describe_step(event, limit=10**9),
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    fields: dict[str, Any]
    if isinstance(event, LlmEvent):
        fields = {
            "model": f"{event.provider}:{event.model}",
            "action": event.action,
            "usage": event.usage,
            "messages in the request": len((event.request.body or {}).get("messages") or []),
            "latency_s": event.latency_s,
        }
    else:
        fields = {
            "tool": event.name,
            "effect": event.effect,
            "arguments": event.arguments,
            "result": event.result,
            "error": event.error.model_dump() if event.error else None,
            "latency_s": event.latency_s,
        }
    for key, value in fields.items():
        shown = value if isinstance(value, str) else json.dumps(value, indent=2, ensure_ascii=False)
        console.print(f"{key}: {shown}", markup=False, highlight=False, soft_wrap=True)


@sim_app.command("serve")
def sim_serve(
    policy: Annotated[str, typer.Option(help="the scenario policy, MODULE:ATTR")],
    port: Annotated[int, typer.Option(help="port on 127.0.0.1 (0: any free port)")] = 8765,
    host: Annotated[str, typer.Option(help="interface to bind")] = "127.0.0.1",
    latency_ms: Annotated[float, typer.Option(help="added to every answer")] = 0.0,
    rate_429: Annotated[float, typer.Option(help="share of requests answered 429")] = 0.0,
    rate_5xx: Annotated[float, typer.Option(help="share of requests answered 5xx")] = 0.0,
    fault_seed: Annotated[int, typer.Option(help="seed of the fault draws")] = 0,
    draws: Annotated[
        str,
        typer.Option(
            help="what a seed does: coupled (common random numbers), seeded (an identical "
            "request reproduces, as OpenAI), unseeded (never, as Anthropic)"
        ),
    ] = "coupled",
) -> None:
    """Serve the simulated OpenAI- and Anthropic-compatible provider."""
    from .providers import Draws
    from .sim import serve

    if draws not in get_args(Draws):
        raise _fail(f"--draws {draws!r}: expected coupled, seeded or unseeded")
    sys.path.insert(0, os.getcwd())
    serve(policy, host, port, latency_ms, rate_429, rate_5xx, fault_seed, draws=cast(Draws, draws))


@app.command("demo")
def demo_cmd(
    job_file: Annotated[Path, typer.Option("--job")] = Path("jobs/support_refund/job.toml"),
    out: Annotated[str | None, typer.Option(help="output folder")] = None,
) -> None:
    """Record the demo job if its tape is missing, then attribute it on the embedded Ray."""
    from .attribute import Interrupted, attribute

    job = _job(job_file)
    tape_path = job.tape_path
    if tape_path is None:
        raise _fail(f"{job.path}: the demo needs a 'tape' path")
    if not tape_path.exists():
        console.print(f"recording {job.spec.agent} → {tape_path}", markup=False)
        # The tape table is printed once, below.
        record_cmd(job_file, tape_path, show=False)
    tape = _tape(tape_path)
    console.print(_steps_table(tape))
    try:
        folder, outcome = attribute(job, tape=tape, out=out, console=console)
    except UserCodeError as exc:
        raise _user_code_failed(job, exc) from None
    except (TapeError, JobFileError, ValueError) as exc:
        raise _fail(str(exc)) from None
    except Interrupted as exc:
        err.print(escape(str(exc)))
        raise typer.Exit(130) from None
    _finish_outcome(folder, outcome, False, tape)


@app.command("truth")
def truth_cmd(
    job_file: Annotated[Path, typer.Argument(help="the scenario's job file (it needs 'policy')")],
    as_json: Annotated[bool, typer.Option("--json", help="print the values as JSON")] = False,
    game: Annotated[
        str,
        typer.Option(
            "--game",
            help="held: a held step whose request changed lands the recorded draw on its new "
            "distribution (the coupled provider); maximal: it keeps its recorded decision as "
            "a maximal coupling would (what a job estimates off the coupled provider)",
        ),
    ] = "held",
) -> None:
    """The scenario's exact values by enumerating its branches: Shapley blame, necessity,
    sufficiency and each arm's flip probability (records the tape first if missing)."""
    from ._scenario import ensure_tape
    from .truth import BranchingTooLarge, solve

    if game not in ("held", "maximal"):
        raise _fail(f"--game {game!r}: give held or maximal")
    job = _job(job_file)
    try:
        tape = ensure_tape(job, on_record=_plain)
        truth = _run(lambda: solve(job, tape, game="maximal" if game == "maximal" else "held"))
    except (BranchingTooLarge, JobFileError, TapeError) as exc:
        raise _fail(str(exc)) from None
    except UserCodeError as exc:
        raise _user_code_failed(job, exc) from None
    if as_json:
        print(truth.model_dump_json(indent=2))
        return
    title = f"exact values of the {truth.game} game ({truth.runs} enumerated runs)"
    table = Table(title=title, title_justify="left")
    for column in ("step", "kind", "what happened", "φ", "necessity", "sufficiency", "live flip"):
        table.add_column(column, justify="left" if column == "what happened" else "right")
    for s in truth.steps:
        table.add_row(
            str(s.step),
            s.kind,
            escape(s.label),
            f"{s.phi:+.4f}" if s.player else "0 (no choice)",
            f"{s.necessity:.4f}",
            f"{s.sufficiency:.4f}",
            "—" if s.live_flip is None else f"{s.live_flip:.4f}",
        )
    console.print(table)
    for arm in truth.arms:
        if arm.kind != "resample":
            console.print(f"{arm.kind} at step {arm.step}: flip {arm.flip:.4f} ({arm.tail} tail)")
    top = ", ".join(map(str, truth.top)) or "none (nothing to blame)"
    console.print(
        f"recorded outcome {truth.recorded_outcome:.2f}; base rate (everything re-drawn) "
        f"{truth.base_rate:.4f}; players {truth.players}; top cause: step {top}"
    )


def _scenario_jobs(job_files: list[Path] | None) -> list[Path]:
    """The job files given, or every scenario under jobs/; each one checked to load."""
    from .validate import suite

    paths = job_files or suite()
    if not paths:
        raise _fail("no scenario job files: pass some, or run from the repo (jobs/*/job.toml)")
    return [_job(p).path for p in paths]


@app.command("validate")
def validate_cmd(
    job_files: Annotated[
        list[Path] | None, typer.Argument(help="scenario job files (default: jobs/*/job.toml)")
    ] = None,
    forks_per_step: Annotated[
        int, typer.Option(help="each scenario's fork cap, per step of its tape")
    ] = 10,
    seed: Annotated[int, typer.Option(help="the attributions' seed")] = 0,
    min_coverage: Annotated[
        float, typer.Option(help="--check fails below this share of exact values covered")
    ] = 0.9,
    check: Annotated[
        bool, typer.Option("--check", help="exit 1 if a scenario fails or coverage is low")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the summary as JSON")] = False,
    draws: Annotated[
        list[str] | None,
        typer.Option(
            help="what the simulated provider does with a seed: coupled (the default), seeded "
            "(as OpenAI), unseeded (as Anthropic); repeat it to run the suite under each"
        ),
    ] = None,
) -> None:
    """Every scenario through the real runner (embedded Ray, Parquet), scored against its
    exact values: top cause, negative controls, interval coverage."""
    from .providers import Draws
    from .validate import dumps, summary, validate

    modes = draws or ["coupled"]
    bad = [m for m in modes if m not in get_args(Draws)]
    if bad:
        raise _fail(f"--draws {bad[0]!r}: expected coupled, seeded or unseeded")
    jobs = _scenario_jobs(job_files)
    checks = []
    failed = False
    lines = []
    for mode in modes:
        err.print(f"[bold]provider draws: {mode}[/]")
        these = validate(
            jobs, forks_per_step=forks_per_step, seed=seed, console=err, draws=cast(Draws, mode)
        )
        checks += these
        result = summary(these)
        coverage = result["coverage"]
        lines.append(
            f"{result['passed']} of {result['scenarios']} scenarios passed; "
            f"{result['covered']}/{result['checked']} exact values covered "
            f"({'—' if coverage is None else f'{coverage:.1%}'}); {result['forks']} forks"
            + (f" (provider draws: {mode})" if modes != ["coupled"] else "")
        )
        low = result["coverage"] is not None and result["coverage"] < min_coverage
        failed = failed or result["passed"] < result["scenarios"] or low
    if as_json:
        print(dumps(checks))
    else:
        for line in lines:
            console.print(line, markup=False)
    if check and failed:
        raise typer.Exit(1)


@app.command("bench")
def bench_cmd(
    job_files: Annotated[
        list[Path] | None, typer.Argument(help="scenario job files (default: jobs/*/job.toml)")
    ] = None,
    quick: Annotated[
        bool, typer.Option("--quick", help="forks a step 0.5 1 4 8, 5 seeds, no long tape")
    ] = False,
    scenario: Annotated[
        list[str] | None, typer.Option("--scenario", help="only jobs/NAME (repeatable)")
    ] = None,
    seeds: Annotated[
        int | None, typer.Option(min=1, help="attribution seeds (default 20, quick 5)")
    ] = None,
    forks_per_step: Annotated[
        list[float] | None,
        typer.Option(
            "--forks-per-step",
            min=0.01,
            help="a budget on the grid, F forks a step (repeatable; uniform from F = 1)",
        ),
    ] = None,
    long_seeds: Annotated[
        int | None,
        typer.Option(
            "--long-seeds",
            min=0,
            help="the most seeds a tape over 32 steps runs (default: --seeds; quick 0, or 1 "
            "when --scenario names it)",
        ),
    ] = None,
    scheme: Annotated[
        list[str] | None,
        typer.Option(
            "--scheme",
            help="a uniform scheme to run beside auto: uniform-live, uniform-pinned, "
            "uniform-held (repeatable; default all three)",
        ),
    ] = None,
    processes: Annotated[int, typer.Option(min=1, help="worker processes")] = 2,
    out: Annotated[Path, typer.Option(help="folder for accuracy.parquet and accuracy.png")] = Path(
        "benchmarks/results"
    ),
    draws: Annotated[
        str,
        typer.Option(
            help="what the simulated provider does with a seed: coupled, seeded (as OpenAI), "
            "unseeded (as Anthropic); benchmarks/draws.py puts two side by side"
        ),
    ] = "coupled",
) -> None:
    """Accuracy against budget: car-ray's adaptive scheduler against uniform allocation
    (live, pinned and held tails) on every scenario with exact values; writes Parquet and a
    plot, prints the forks each scheme needs for 95% top-1."""
    from . import bench
    from .providers import Draws

    if draws not in get_args(Draws):
        raise _fail(f"--draws {draws!r}: expected coupled, seeded or unseeded")
    uniform = bench.SCHEMES[1:]
    bad = [s for s in scheme or () if s not in uniform]
    if bad:
        raise _fail(f"--scheme {bad[0]!r}: expected one of {', '.join(uniform)}")
    schemes = ["auto", *(s for s in uniform if s in (scheme or uniform))]
    code = bench.main(
        _scenario_jobs(job_files),
        quick=quick,
        scenarios=scenario,
        seeds=seeds,
        forks_per_step=forks_per_step,
        long_seeds=long_seeds,
        schemes=schemes,
        processes=processes,
        out=out,
        console=console,
        draws=draws,
    )
    if code:
        raise typer.Exit(code)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
