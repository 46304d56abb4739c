"""The verdict line never claims more than the forks showed: "no step to blame" only when
every step was cleared. tests/scenarios/wordy is a payout review whose every note varies its
wording (five wordings, as a real model's would) and whose failure is decided at step 11:
under a small cap the budget ends before step 11 is ever reached, and every path a user reads
(the CLI's last line, `show`, the report, job.json, a batch's rows and summary, the exit
status under --strict) says the job did not answer, never that nothing is to blame."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from car_ray._answer import Answer
from car_ray.batch import batch_text, run_batch
from car_ray.bench import _job_and_tape
from car_ray.cli import app
from car_ray.job import Job
from car_ray.results import verdict
from car_ray.schedule import Budget
from car_ray.tape import Tape
from car_ray.truth import run_local

from .conftest import ROOT

WORDY = ROOT / "tests" / "scenarios" / "wordy" / "job.toml"
DECISION = 11  # the step that decides the payout (tests/scenarios/wordy/agent.py)
CAP = 40
cli = CliRunner()


@pytest.fixture(scope="module")
def wordy() -> tuple[Job, Tape]:
    job, tape = _job_and_tape(str(WORDY))
    assert len(tape.steps) == 14
    return job, tape


def test_a_budget_that_ends_before_the_cause_is_examined_is_not_answered(
    wordy: tuple[Job, Tape],
) -> None:
    """Under 40 forks the screen finds the first notes (every re-draw changes their words),
    Shapley over them shows no blame, and the budget ends with the decision never reached.
    The answer says which steps were examined and which never were, the verdict line says
    "not answered" with them and a cap that would go on, and never "no step to blame"."""
    base, tape = wordy
    for seed in range(2):
        job = Job(base.path, base.spec.model_copy(update={"attribution_seed": seed}))
        outcome, _ = run_local(job, tape, Budget(max_forks=CAP))
        answer = outcome.answer
        assert outcome.status == "budget_exhausted" and answer is not None
        assert answer.kind == "unanswered" and not answer.answered
        assert DECISION in answer.unexamined and DECISION in answer.never
        assert sorted(answer.examined + answer.cleared + answer.unexamined) == list(range(14))
        line = verdict(outcome.attribution, tape, outcome.status, outcome.notes, answer)
        assert "no step to blame" not in line
        assert line.startswith("verdict: not answered: the budget ended with steps "), line
        assert "never examined" in line and "no blame shown among step" in line
        more = re.search(
            r"about (\d+) more forks would examine what is left \(--max-forks (\d+)\)", line
        )
        assert more is not None, line
        assert int(more[1]) > 0 and int(more[2]) > outcome.progress.spent.forks + int(more[1])


def test_every_path_a_user_reads_says_the_job_did_not_answer(
    ray_local: None, wordy: tuple[Job, Tape], tmp_path: Path
) -> None:
    """`car-ray attribute --strict` exits 3 and ends on the "not answered" line; job.json
    keeps the answer and names no top cause; the report opens with the same line; `show`
    prints it again and exits as the job did (3 with --strict, 0 without)."""
    out = tmp_path / "out"
    args = ["attribute", str(WORDY), "--max-forks", str(CAP), "--out", str(out)]
    ran = cli.invoke(app, [*args, "--strict"])
    assert ran.exit_code == 3, ran.output
    line = ran.output.strip().splitlines()[-1]
    assert line.startswith("verdict: not answered: the budget ended with steps "), line
    assert "no step to blame" not in ran.output

    (folder,) = [p for p in out.iterdir() if (p / "job.json").exists()]
    info = json.loads((folder / "job.json").read_text())
    assert info["status"] == "budget_exhausted" and info["top_cause"] is None
    assert info["verdict"] == line
    assert info["answer"]["kind"] == "unanswered" and DECISION in info["answer"]["never"]
    page = (folder / "report.html").read_text()
    assert line.replace('"', "&quot;").removeprefix("verdict: ") in page

    shown = cli.invoke(app, ["show", str(folder), "--strict"])
    assert shown.exit_code == 3 and shown.output.strip().splitlines()[-1] == line
    assert cli.invoke(app, ["show", str(folder)]).exit_code == 0


def test_a_job_whose_screen_cleared_every_step_answers_nothing_to_blame(
    ray_local: None, tmp_path: Path
) -> None:
    """jobs/null_control, as a user runs it: no step ever leaves the tape, the screen gives
    every step its 20 clean re-draws, and the job answers "no step to blame" (even under
    --strict), with nothing ranked: an answer is not the same as a ranked row."""
    job = ROOT / "jobs" / "null_control" / "job.toml"
    ran = cli.invoke(app, ["attribute", str(job), "--out", str(tmp_path), "--strict"])
    assert ran.exit_code == 0, ran.output
    assert ran.output.strip().splitlines()[-1].startswith("verdict: no step to blame")
    (folder,) = [p for p in tmp_path.iterdir() if (p / "job.json").exists()]
    info = json.loads((folder / "job.json").read_text())
    assert info["answer"]["kind"] == "nothing" and info["answer"]["unexamined"] == []


def test_a_batch_counts_a_trace_that_could_not_answer_as_unanswered(
    ray_local: None, wordy: tuple[Job, Tape], tmp_path: Path
) -> None:
    """In a batch, the trace whose job ran out of budget is counted as not answered in its
    row, the summary and the batch's line, never as one with nothing to blame; --strict
    turns that into exit status 3."""
    job, tape = wordy
    result = run_batch(job, [str(tape.path)], out=str(tmp_path), max_forks=CAP)
    (row,) = result.rows
    assert row.status == "budget_exhausted" and row.answer == "unanswered"
    assert row.top_step is None and (row.verdict or "").startswith("verdict: not answered")
    assert result.exit_code == 0 and result.strict_exit_code() == 3
    summary = pq.read_table(Path(result.folder) / "summary.parquet").to_pylist()
    answers = [(s["key"], s["traces"], s["of"]) for s in summary if s["dimension"] == "answer"]
    assert answers == [("unanswered", 1, 1)]
    assert "0 of 1 answered" in batch_text(result)
    page = (Path(result.folder) / "report.html").read_text()
    assert "1 not answered" in page


def test_a_lead_with_steps_never_examined_says_so(support_tape: Tape) -> None:
    """A job whose budget ended with a leader shown but steps never examined names the
    leader as the most likely step and the steps it never reached."""
    rows = [
        {
            "step": 4,
            "label": "openai:gpt-4o-mini",
            "intervention": "resample",
            "rank": 1,
            "phi": 0.3,
            "phi_lo": 0.1,
            "phi_hi": 0.5,
            "necessity": 0.3,
            "confidence": 0.95,
        }
    ]
    answer = Answer(kind="lead", steps=[0, 2, 4, 6], examined=[4], unexamined=[0, 2, 6], never=[6])
    line = verdict(rows, support_tape, "budget_exhausted", [], answer)
    assert line.startswith("verdict: most likely step 4, where"), line
    assert line.endswith(
        "not separated from the other steps: the budget ended first, with step 6 never "
        "examined and steps 0 and 2 re-drawn too few times to clear (see the notes)"
    ), line


def test_a_uniform_scheme_names_the_step_its_flip_rates_show() -> None:
    """The uniform scheme measures flip-rates only (no phi): a re-drawn step whose flip-rate
    is shown above 0 is its top, not "no step to blame" (jobs/and_conj, 4 forks a step,
    held tail: steps 2 and 4 each flip the outcome; exact necessity 0.7 each)."""
    job, tape = _job_and_tape("jobs/and_conj/job.toml")
    spec = job.spec.model_copy(
        update={"method": "uniform", "forks_per_step": 4, "uniform_tail": "held"}
    )
    outcome, _ = run_local(Job(job.path, spec), tape, Budget())
    line = verdict(outcome.attribution, tape, outcome.status, outcome.notes, outcome.answer)
    assert outcome.answer is not None and outcome.answer.kind == "measured"
    assert re.match(r"verdict: the resample intervention at step [24], where", line), line


def test_a_screen_that_stopped_on_stray_forks_clears_no_step_it_did_not_draw() -> None:
    """A screen that gave up on forks leaving the tape where nothing was re-drawn (three
    strays) after one clean draw of each step says no step was seen to choose, and the job
    ends with no answer: its steps were re-drawn too few times to clear."""
    from types import SimpleNamespace

    from car_ray.schedule import DeviationScreen, Results
    from car_ray.schedule._table import held_answer
    from car_ray.schedule.stages._screening import screen_result

    screen = DeviationScreen([0, 1, 2, 3], clean_needed=20)
    screen.observe([0, 1, 2, 3], None)
    for _ in range(3):
        screen.observe([2, 3], 0)
    ctx = SimpleNamespace(
        resampled=[0, 1, 2, 3],
        go_on=lambda more: (f"--max-forks {4 + more}", ""),
        clean_enough=20,
    )
    results = Results(screened=screen_result(screen, ("separated", ())))
    answer = held_answer(ctx, results, "complete", 4)  # type: ignore[arg-type]
    assert answer.kind == "unanswered" and answer.cleared == []
    assert answer.unexamined == [0, 1, 2, 3] and answer.more_forks == 19
    rows = [_row(k, phi=0.0, phi_lo=-0.95, phi_hi=0.95) for k in range(4)]
    line = verdict(rows, None, "complete", [], answer)
    assert line.startswith("verdict: not answered: its forks ended with steps 0-3 re-drawn"), line


def _row(step: int, **values: float) -> dict[str, object]:
    return {
        "step": step,
        "label": "openai:gpt-4o-mini",
        "intervention": "resample",
        "rank": None,
        "confidence": 0.95,
        "flip_n": 0,
        "necessity": None,
        **values,
    }


def test_no_line_claims_a_cause_or_its_absence_beyond_the_answer() -> None:
    """A precise verdict whose top is empty (no blame shown above 0) names no step to fix;
    a failed or stopped job names no absence of blame; a job.json written before answers
    were kept that ended on its budget is not answered."""
    leader = [_row(4, phi=0.05, phi_lo=-0.04, phi_hi=0.14, rank=1)]
    precise = Answer(kind="precise", steps=[4], examined=[4])
    line = verdict(leader, None, "complete", [], precise)
    assert line.startswith("verdict: no step to blame at 95% confidence: no re-drawn step's"), line
    assert "fix" not in line
    nothing = Answer(kind="nothing", steps=[4], cleared=[4])
    quiet = [_row(4, phi=0.0, phi_lo=-0.14, phi_hi=0.14)]
    assert verdict(quiet, None, "complete", [], nothing).startswith("verdict: no step to blame")
    for status, ended in [
        ("failed", "most of its forks had no outcome"),
        ("control_failed", "its negative control failed"),
        ("interrupted", "the job was interrupted"),
    ]:
        line = verdict(quiet, None, status, [], nothing)
        assert line == f"verdict: not answered: {ended} (see the notes)", line
    assert verdict(quiet, None, "budget_exhausted", []).startswith("verdict: not answered")


def test_the_uniform_scheme_says_when_its_flip_rates_clear_nothing() -> None:
    """jobs/null_control, uniform at 4 forks a step: no fork flips, and each step's interval
    (0 of 4: up to 0.49) is far wider than the job's target: not answered, in flip-rates."""
    job, tape = _job_and_tape("jobs/null_control/job.toml")
    spec = job.spec.model_copy(update={"method": "uniform", "forks_per_step": 4})
    outcome, _ = run_local(Job(job.path, spec), tape, Budget())
    assert outcome.answer is not None and outcome.answer.kind == "unanswered"
    line = verdict(outcome.attribution, tape, outcome.status, outcome.notes, outcome.answer)
    assert line == (
        "verdict: not answered: no intervention flipped the outcome before its forks ended; "
        "each step's flip-rate is at most 0.49 at 95% confidence, too wide to clear the "
        "steps at the job's target"
    ), line
