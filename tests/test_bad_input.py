"""Bad input a user hands car-ray: recorded text that looks like markup, paths that are not
tape files, an agent or scorer that fails, and tool arguments named like car-ray's own."""

from __future__ import annotations

import io
import os
import textwrap
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

import car_ray.cli as cli_module
from car_ray import AgentContext
from car_ray._notes import Note
from car_ray.attribute import results_table
from car_ray.cli import _print_outcome, _row_table, app
from car_ray.job import load_job
from car_ray.replay import BaseUrls, ForkRow, ForkRunner, record
from car_ray.schedule import JobOutcome, Progress
from car_ray.sim import SimServer
from car_ray.tape import ToolEvent

from .conftest import record_job, run

cli = CliRunner()

# Looks like rich markup: a closing tag with nothing open, then a style.
MARKUP = "[/bold] [red]x"

# One module for the whole session: the CLI runs in this process and imports it once.
USER_CODE = f'''
"""A one-step agent whose model answers {MARKUP!r}, and scorers that break the contract."""

from car_ray.providers import Action

TEXT = {MARKUP!r}


class Policy:
    def distribution(self, request):
        return [(1.0, Action(text=TEXT))]


POLICY = Policy()


def agent(ctx):
    reply = ctx.openai().chat.completions.create(
        model="gpt-4o-mini", messages=[{{"role": "user", "content": "hi"}}]
    )
    return {{"text": reply.choices[0].message.content}}


def agent_raises(ctx):
    customer = ctx.input["customer"]  # AGENT
    return {{"customer": customer}}


def scorer(result, trajectory):
    return 1.0


def scorer_two(result, trajectory):  # TWO
    return 2.0


def scorer_nan(result, trajectory):  # NAN
    return float("nan")


def scorer_raises(result, trajectory):
    return {{"good": 1.0}}[result["verdict"]]  # RAISES
'''


def _line(marker: str) -> int:
    """The line of USER_CODE that carries `# marker`."""
    return next(i for i, text in enumerate(USER_CODE.splitlines(), 1) if f"# {marker}" in text)


@pytest.fixture(scope="session")
def user_job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A job folder: the user's module, a job file for each agent and scorer, and the tape."""
    folder = tmp_path_factory.mktemp("bad_input")
    (folder / "bad_input_user.py").write_text(USER_CODE)
    for name, (agent, scorer) in {
        "job": ("agent", "scorer"),
        "two": ("agent", "scorer_two"),
        "nan": ("agent", "scorer_nan"),
        "raises": ("agent", "scorer_raises"),
        "agent_raises": ("agent_raises", "scorer"),
    }.items():
        # One worker; the failing jobs stop at the replay, which needs no provider at all.
        provider = "workers = 1" + ("" if name == "job" else '\nbase_url = "http://127.0.0.1:9"')
        (folder / f"{name}.toml").write_text(
            textwrap.dedent(f"""\
                agent = "bad_input_user:{agent}"
                scorer = "bad_input_user:{scorer}"
                policy = "bad_input_user:POLICY"
                tape = "answer.tape"
                input = {{ ticket = "T-1" }}

                [provider]
                """)
            + provider
            + "\n"
        )
    job = load_job(folder / "job.toml")
    with SimServer(job.load("policy")) as sim:
        record_job(job, sim, folder / "answer.tape")
    return folder


# -- (7) recorded text is data ---------------------------------------------------------------


def test_record_and_inspect_show_an_answer_that_looks_like_markup(
    user_job: Path, tmp_path: Path
) -> None:
    tape = tmp_path / "answer.tape"
    recorded = cli.invoke(app, ["record", str(user_job / "job.toml"), "-o", str(tape)])
    assert recorded.exit_code == 0, recorded.output
    assert MARKUP in recorded.output
    inspected = cli.invoke(app, ["inspect", str(tape)])
    assert inspected.exit_code == 0, inspected.output
    assert MARKUP in inspected.output


def _printed(renderable: Any) -> str:
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(renderable)
    return out.getvalue()


def test_the_attribution_table_keeps_its_headers_and_labels() -> None:
    row = {
        "intervention": "resample",
        "rank": 1,
        "step": 0,
        "label": MARKUP,
        "flip_rate": 0.5,
        "flip_lo": 0.25,
        "flip_hi": 0.75,
        "flip_n": 8,
        "phi": 0.5,
        "phi_lo": -0.25,
        "phi_hi": 0.75,
        "necessity": None,
        "necessity_lo": None,
        "necessity_hi": None,
        "sufficiency": None,
        "sufficiency_lo": None,
        "sufficiency_hi": None,
    }
    notes = [Note(kind="note", text=f"divergence at step 0: {MARKUP}")]
    outcome = JobOutcome("j", "complete", [row], notes, Progress())
    table = _printed(results_table(outcome))
    assert "blame φ" in table and "necessity" in table
    assert MARKUP in table and "0.50" in table and "[-0.25, 0.75]" in table


def test_notes_rows_and_paths_that_look_like_markup_are_printed_as_they_are(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import car_ray.cli as cli_module

    out = io.StringIO()
    monkeypatch.setattr(cli_module, "console", Console(file=out, width=200, color_system=None))
    notes = [Note(kind="note", text=f"divergence at step 0: {MARKUP}")]
    outcome = JobOutcome("j", "complete", [], notes, Progress())
    _print_outcome(f"out/{MARKUP}", outcome)
    row = ForkRow(
        task_id="t",
        tape_id="tape",
        status="error",
        outcome=None,
        recorded_outcome=1.0,
        flipped=None,
        steps_intervened=[0],
        interventions=["resample"],
        tail="live",
        seed=0,
        tail_calls=0,
        retries=0,
        tokens_in=0,
        tokens_out=0,
        cost_usd=0.0,
        latency_s=0.0,
        error=f"KeyError: {MARKUP}",
    )
    cli_module.console.print(_row_table(row))
    printed = out.getvalue()
    assert printed.count(MARKUP) == 3, printed

    # A path the user typed, in an error message.
    missing = tmp_path / MARKUP / "job.toml"
    failed = cli.invoke(app, ["record", str(missing), "-o", str(tmp_path / "t.tape")])
    assert failed.exit_code == 2
    assert f"{missing}: no such file" in failed.output


# -- (8) a path that is not a tape file ------------------------------------------------------


def _not_a_file(tmp_path: Path, case: str) -> tuple[Path, str]:
    """A path of the kind `case` and the words the error must use."""
    path = tmp_path / case
    if case == "directory":
        path.mkdir()
        return path, "is a directory"
    if case == "fifo":
        os.mkfifo(path)
        return path, "is a FIFO (named pipe)"
    if case == "unreadable":
        path.write_text("{}\n")
        path.chmod(0)
        return path, "permission denied"
    return path, "no such file"


CASES = [
    "directory",
    "fifo",
    pytest.param(
        "unreadable",
        marks=pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file"),
    ),
    "missing",
]


@pytest.mark.timeout(60)  # a FIFO nobody writes to blocked a reader forever
@pytest.mark.parametrize("case", CASES)
def test_inspect_and_replay_of_a_path_that_is_no_tape_say_what_is_wrong(
    tmp_path: Path, user_job: Path, case: str
) -> None:
    path, problem = _not_a_file(tmp_path, case)
    for command in (
        ["inspect", str(path)],
        ["replay", str(path), "--job", str(user_job / "job.toml")],
        ["replay", str(user_job / "answer.tape"), "--job", str(path)],
    ):
        result = cli.invoke(app, command)
        assert result.exit_code == 2, (command, result.output)
        assert f"error: {path}: {problem}" in result.output, (command, result.output)
        assert "Traceback" not in result.output and len(result.output.splitlines()) == 1


def test_a_tape_this_user_may_not_read_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The same as chmod 000 for a user who is not root (root reads anything).
    path = tmp_path / "locked.tape"
    path.write_text("{}\n")
    read_bytes = Path.read_bytes

    def refuse(self: Path) -> bytes:
        if self == path:
            raise PermissionError(13, "Permission denied", str(self))
        return read_bytes(self)

    monkeypatch.setattr(Path, "read_bytes", refuse)
    result = cli.invoke(app, ["inspect", str(path)])
    assert result.exit_code == 2
    assert f"error: {path}: permission denied" in result.output
    assert "Traceback" not in result.output


def test_a_job_folder_given_for_its_job_file_is_pointed_to_it(user_job: Path) -> None:
    result = cli.invoke(app, ["record", str(user_job), "-o", str(user_job / "x.tape")])
    assert result.exit_code == 2
    assert f"{user_job}: is a directory, not a file; did you mean {user_job / 'job.toml'}?" in (
        result.output
    )


# -- (9) an agent or scorer that fails ---------------------------------------------------------

FAILURES = {
    "two": (
        "scorer 'bad_input_user:scorer_two' failed: ValueError: the scorer returned 2.0; "
        "outcomes must lie in [0, 1]",
        _line("TWO"),
    ),
    "nan": (
        "scorer 'bad_input_user:scorer_nan' failed: ValueError: the scorer returned nan; "
        "outcomes must lie in [0, 1]",
        _line("NAN"),
    ),
    "raises": (
        "scorer 'bad_input_user:scorer_raises' failed: KeyError: 'verdict'",
        _line("RAISES"),
    ),
    "agent_raises": (
        "agent 'bad_input_user:agent_raises' failed on the tape's input (after 0 of its 1 "
        "steps): KeyError: 'customer'",
        _line("AGENT"),
    ),
}


def _assert_one_line(output: str, job: Path, case: str) -> None:
    said, line = FAILURES[case]
    where = f"{job.parent / 'bad_input_user.py'}:{line}"
    assert output.count("error: ") == 1, output
    assert f"error: {job}: {said} (at {where})" in output, output
    for noise in ("Traceback", "ray::", "actor_id", "ForkWorker", "RayTaskError", "\x1b["):
        assert noise not in output, output


@pytest.mark.parametrize("case", list(FAILURES))
def test_replay_names_the_failing_agent_or_scorer_in_one_line(user_job: Path, case: str) -> None:
    job = user_job / f"{case}.toml"
    result = cli.invoke(app, ["replay", str(user_job / "answer.tape"), "--job", str(job)])
    assert result.exit_code == 2, result.output
    _assert_one_line(result.output, job, case)


@pytest.mark.usefixtures("ray_local")
@pytest.mark.parametrize("case", list(FAILURES))
def test_attribute_names_the_failing_agent_or_scorer_in_one_line(
    user_job: Path, tmp_path: Path, case: str
) -> None:
    job = user_job / f"{case}.toml"
    result = cli.invoke(app, ["attribute", str(job), "--max-forks", "5", "--out", str(tmp_path)])
    assert result.exit_code == 2, result.output
    _assert_one_line(result.output, job, case)


@pytest.mark.usefixtures("ray_local")
def test_attribute_prints_an_answer_that_looks_like_markup(
    user_job: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The table as wide as a log gets it (150 columns), whatever COLUMNS the test process
    # was started with: at 80 the label wraps inside its cell and the text is split.
    monkeypatch.setattr(cli_module.console, "_width", 150)
    result = cli.invoke(
        app, ["attribute", str(user_job / "job.toml"), "--max-forks", "5", "--out", str(tmp_path)]
    )
    # Five forks measure nothing here: the job says so and exits 1 (issue 11).
    assert result.exit_code == 1 and "nothing_measured" in result.output, result.output
    assert MARKUP in result.output


def test_verbose_shows_the_stack_of_the_users_code(user_job: Path) -> None:
    job = user_job / "agent_raises.toml"
    quiet = cli.invoke(app, ["replay", str(user_job / "answer.tape"), "--job", str(job)])
    assert "car-ray --verbose shows the stack" in quiet.output
    result = cli.invoke(
        app, ["--verbose", "replay", str(user_job / "answer.tape"), "--job", str(job)]
    )
    assert result.exit_code == 2
    assert "Traceback" in result.output and 'ctx.input["customer"]' in result.output
    _assert_one_line(result.output.split("KeyError: 'customer'\n", 1)[1], job, "agent_raises")


# -- (12) tool arguments named like ctx.tool's own -------------------------------------------


def lookup(name: str, fn: str, *, limit: int = 1) -> dict[str, Any]:
    return {"name": name, "fn": fn, "limit": limit}


async def alookup(name: str, fn: str) -> dict[str, Any]:
    return {"name": name, "fn": fn}


def _tool_agent(ctx: AgentContext) -> list[Any]:
    return [
        ctx.tool("lookup", lookup, name="a name", fn="a fn", limit=2),
        ctx.tool("lookup", lookup, "positional", fn="f"),
    ]


async def _async_tool_agent(ctx: AgentContext) -> Any:
    return await ctx.tool("alookup", alookup, name="a name", fn="a fn")


@pytest.mark.parametrize(
    ("agent", "expected"),
    [
        (
            _tool_agent,
            [
                {"name": "a name", "fn": "a fn", "limit": 2},
                {"name": "positional", "fn": "f", "limit": 1},
            ],
        ),
        (_async_tool_agent, {"name": "a name", "fn": "a fn"}),
    ],
)
def test_a_tool_gets_arguments_called_name_and_fn(
    tmp_path: Path, agent: Any, expected: Any
) -> None:
    urls = BaseUrls.for_server("http://127.0.0.1:9")  # no model call: never connected
    tape, outcome = run(record(agent, "tests:agent", None, tmp_path / "t.tape", base_urls=urls))
    assert outcome.error is None, outcome.error
    assert outcome.result == expected
    first = tape.steps[0]
    assert isinstance(first, ToolEvent) and first.arguments["kwargs"]["name"] == "a name"

    async def replay() -> Any:
        runner = ForkRunner(agent, lambda result, trajectory: 0.0, base_urls=urls)
        runner.add_tape(tape)
        try:
            return (await runner.replay(tape.tape_id)).result
        finally:
            await runner.aclose()

    assert run(replay()) == expected
