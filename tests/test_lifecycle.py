"""A new user's first hour (issue 11): stale results after a code change, unmeasured rows,
checks before spending, reruns of a finished job, Ctrl-C, and past jobs. What the user sees:
the command's output, its exit status and the files it leaves."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pyarrow.dataset as pads
import pytest
from typer.testing import CliRunner

from car_ray.cli import app
from car_ray.job import Job
from car_ray.report import render_report
from car_ray.results import JobInfo
from car_ray.schedule import Budget
from car_ray.tape import Tape
from car_ray.truth import run_local

from .conftest import start_attribute, support_job_file

cli = CliRunner()
ENV = {"COLUMNS": "200"}

SCORER = """from support_refund.agent import wrongful_refund


def scorer(result, trajectory):
    return wrongful_refund(result, trajectory)


def always_bad(result, trajectory):
    return 1.0


def always_good(result, trajectory):
    return 0.0


def other_agent(ctx):
    client = ctx.openai()
    messages = [{"role": "user", "content": "What is the weather?"}]
    return client.chat.completions.create(model="gpt-4o-mini", messages=messages)
"""


def _job_with(folder: Path, tape: Path, **settings: str) -> Path:
    """The demo job in `folder` on `tape`, scored by `lc_scorer:scorer` (a module of its
    own, so a test can change its source), with settings replaced."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "lc_scorer.py").write_text(SCORER)
    settings.setdefault("scorer", '"lc_scorer:scorer"')
    return support_job_file(folder, tape, **settings)


def _attribute(*args: str) -> Any:
    return cli.invoke(app, ["attribute", *args], env=ENV)


def _rows(folder: Path) -> list[dict[str, Any]]:
    return pads.dataset(folder / "forks", format="parquet").to_table().to_pylist()


# -- 1. stale results after a code change ------------------------------------------------------


@pytest.mark.usefixtures("ray_local")
def test_a_changed_scorer_is_a_new_job_not_a_resume(tmp_path: Path, demo_tape_path: Path) -> None:
    job = _job_with(tmp_path / "job", demo_tape_path)
    out = tmp_path / "out"
    first = _attribute(str(job), "--out", str(out), "--max-forks", "6")
    assert "resumed" in first.output, first.output
    (old,) = [p for p in out.iterdir() if p.is_dir()]
    # The user fixes the scorer: the same request and tape, other code.
    scorer = tmp_path / "job" / "lc_scorer.py"
    scorer.write_text(SCORER + "\n# fixed: read the refund amount\n")
    second = _attribute(str(job), "--out", str(out), "--max-forks", "6")
    assert "(0 resumed" in second.output, second.output
    # On one line, however long the paths: a log keeps a path whole.
    assert f"note: the scorer ({scorer}) changed since {out / old.name}" in second.output
    folders = sorted(p.name for p in out.iterdir() if p.is_dir())
    assert len(folders) == 2 and old.name in folders
    # The old job's rows are untouched; the new one ran its own.
    assert _rows(out / old.name) and all(_rows(out / f) for f in folders)


# -- 2. unmeasured rows get no rank and no badge -----------------------------------------------


def test_max_usd_zero_on_the_command_line_is_refused(tmp_path: Path, demo_tape_path: Path) -> None:
    job = _job_with(tmp_path / "job", demo_tape_path)
    result = _attribute(str(job), "--out", str(tmp_path / "out"), "--max-usd", "0")
    assert result.exit_code == 2, result.output
    assert "--max-usd 0: a dollar cap must be more than 0" in result.output
    assert not (tmp_path / "out").exists()


@pytest.mark.usefixtures("ray_local")
def test_a_job_that_measured_nothing_exits_1_and_says_what_budget_would_answer(
    tmp_path: Path, demo_tape_path: Path
) -> None:
    job = _job_with(tmp_path / "job", demo_tape_path)
    result = _attribute(str(job), "--out", str(tmp_path / "out"), "--max-forks", "1")
    assert result.exit_code == 1, result.output
    text = " ".join(result.output.split())
    assert "re-drawn steps, by blame (the steps to fix) (nothing_measured)" in text
    # 7 steps: the default of 10 forks a step, and what that many forks cost at most.
    assert "a budget that gives an answer: --max-forks 70 --max-usd" in text
    (folder,) = [p for p in (tmp_path / "out").iterdir() if p.is_dir()]
    ranks = pads.dataset(folder / "attribution.parquet").to_table().column("rank").to_pylist()
    assert ranks and all(rank is None for rank in ranks), ranks
    assert text.endswith("verdict: no step measured")


def test_the_uniform_scheme_ranks_only_measured_arms(support_job: Job, support_tape: Tape) -> None:
    job = Job(support_job.path, support_job.spec.model_copy(update={"method": "uniform"}))
    outcome, _ = run_local(job, support_tape, Budget(max_forks=1))
    (measured,) = [r for r in outcome.attribution if r["flip_n"]]
    assert measured["rank"] == 1 and len(outcome.attribution) > 1
    assert all(r["rank"] is None for r in outcome.attribution if r is not measured)
    page = render_report(
        tape=support_tape,
        attribution=outcome.attribution,
        job=JobInfo(job_id="x", status=outcome.status),
    )
    assert page.count("top cause") == 1


# -- 3. checks before spending ------------------------------------------------------------------


def test_a_tape_of_another_agent_is_refused_before_ray_starts(
    tmp_path: Path, demo_tape_path: Path
) -> None:
    job = _job_with(tmp_path / "job", demo_tape_path, agent='"lc_scorer:other_agent"')
    started = time.monotonic()
    result = _attribute(str(job), "--out", str(tmp_path / "out"))
    assert result.exit_code == 2, result.output
    line = " ".join(result.output.split())
    assert "was recorded by agent 'support_refund.agent:support_agent'" in line
    assert "runs 'lc_scorer:other_agent'" in line
    assert time.monotonic() - started < 5 and not (tmp_path / "out").exists()


def test_a_tape_whose_outcome_is_good_is_refused(tmp_path: Path, demo_tape_path: Path) -> None:
    job = _job_with(tmp_path / "job", demo_tape_path, scorer='"lc_scorer:always_good"')
    result = _attribute(str(job), "--out", str(tmp_path / "out"))
    assert result.exit_code == 2, result.output
    assert "the recorded outcome is 0.00" in result.output
    assert "nothing to explain" in result.output
    assert not (tmp_path / "out").exists()


@pytest.mark.usefixtures("ray_local")
def test_a_constant_scorer_is_warned_about(tmp_path: Path, demo_tape_path: Path) -> None:
    job = _job_with(tmp_path / "job", demo_tape_path, scorer='"lc_scorer:always_bad"')
    result = _attribute(str(job), "--out", str(tmp_path / "out"), "--max-forks", "20")
    assert "WARNING: scorer 'lc_scorer:always_bad' gave all" in " ".join(result.output.split())


# -- 4 and 6. a finished job: rerun, --more, show, --json ---------------------------------------


@pytest.fixture(scope="module")
def complete_job(
    tmp_path_factory: pytest.TempPathFactory, demo_tape_path: Path, ray_local: None
) -> tuple[Path, Path, Path]:
    """A complete job: the demo, whose top separates within its cap (about 50 forks; the
    demo's target of ±0.06 would take far more, so a separated top is what ends it)."""
    base = tmp_path_factory.mktemp("complete")
    job = _job_with(base / "refund_demo", demo_tape_path, max_forks="150")
    out = base / "out"
    first = _attribute(str(job), "--out", str(out))
    assert first.exit_code == 0 and "(the steps to fix) (complete)" in first.output, first.output
    (folder,) = [p for p in out.iterdir() if p.is_dir()]
    return job, out, folder


def test_a_complete_job_rerun_spends_nothing_unless_asked_for_more(
    complete_job: tuple[Path, Path, Path],
) -> None:
    job, out, folder = complete_job
    rows = len(_rows(folder))
    before = json.loads((folder / "job.json").read_text())
    again = _attribute(str(job), "--out", str(out), "--max-forks", "50")
    assert again.exit_code == 0, again.output
    text = " ".join(again.output.split())
    assert "this job was complete: nothing run, nothing spent now" in text
    assert "`--more` runs on" in text and "the agent went wrong at step 4" in text
    assert len(_rows(folder)) == rows
    assert json.loads((folder / "job.json").read_text())["runs"] == before["runs"]

    more = _attribute(str(job), "--out", str(out), "--more")
    text = " ".join(more.output.split())
    assert "--more: running on until every interval is within ±0.03" in text, more.output
    assert len(_rows(folder)) > rows
    after = json.loads((folder / "job.json").read_text())
    assert after["runs"] == before["runs"] + 1
    assert after["ledger"]["spent"]["forks"] > before["ledger"]["spent"]["forks"]
    # ±0.03 takes far more than as much budget again: the run ends on it, its top still
    # separated (a complete job, `--more` may go on again) and the verdict still a fix.
    assert after["status"] == "complete", after["status"]
    more_note = "--more: the budget ended before every interval was within ±0.03"
    assert {"kind": "more", "severity": "info", "text": more_note, "figures": {}} in after["notes"]
    assert "the agent went wrong at step 4" in after["verdict"], after["verdict"]


def test_show_reprints_a_past_job_by_folder_or_id_and_json(
    complete_job: tuple[Path, Path, Path],
) -> None:
    job, out, folder = complete_job
    # The folder carries the job file's readable name (its folder's, for a job.toml).
    assert folder.name.startswith("refund_demo-")
    by_folder = cli.invoke(app, ["show", str(folder)], env=ENV)
    assert by_folder.exit_code == 0, by_folder.output
    assert "the agent went wrong at step 4" in by_folder.output
    assert "re-drawn steps, by blame" in by_folder.output
    by_name = cli.invoke(app, ["show", "refund_demo", "--out", str(out)], env=ENV)
    assert by_name.exit_code == 0 and "the agent went wrong at step 4" in by_name.output
    shown = json.loads(
        cli.invoke(app, ["show", folder.name, "--out", str(out), "--json"], env=ENV).stdout
    )
    assert shown["job_id"] == folder.name and "the agent went wrong at step 4" in shown["verdict"]
    assert {r["step"] for r in shown["attribution"] if r["rank"] == 1} >= {4}
    rerun = cli.invoke(app, ["attribute", str(job), "--out", str(out), "--json"], env=ENV)
    assert json.loads(rerun.stdout)["status"] == "complete"
    missing = cli.invoke(app, ["show", "nope", "--out", str(out)], env=ENV)
    assert missing.exit_code == 2 and "no job output folder" in missing.output


# -- 5. Ctrl-C ------------------------------------------------------------------------------------


@pytest.mark.usefixtures("ray_local")
def test_ctrl_c_stops_cleanly_and_a_resume_shows_real_spend(
    tmp_path: Path, demo_tape_path: Path
) -> None:
    job = _job_with(tmp_path / "job", demo_tape_path, sim_latency_ms="300", max_forks="60")
    out = tmp_path / "out"
    run = start_attribute(job, out, stdout=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            infos = list(out.glob("*/job.json"))
            info = json.loads(infos[0].read_text()) if infos else {}
            if info.get("progress", {}).get("done", 0) >= 3:
                break
            assert run.poll() is None, run.communicate()
            time.sleep(0.1)
        run.send_signal(signal.SIGINT)
        stdout, stderr = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    assert run.returncode == 130, stdout + stderr
    assert "rows saved; rerun the same command to resume" in stdout + stderr
    (folder,) = [p for p in out.iterdir() if p.is_dir()]
    info = json.loads((folder / "job.json").read_text())
    assert info["status"] == "interrupted"
    # Where the job was when stopped: a stage of the auto plan, with what it held.
    stage = info["stage"]
    assert stage["name"] in {"controls", "arms", "screen", "shapley"}
    assert isinstance(stage["state"], dict), stage
    rows = _rows(folder)
    assert f"interrupted: {len(rows)} rows saved" in stdout + stderr
    assert "budget ended" not in stdout + stderr  # the interrupt ended it, and says so
    # The forks in flight settled: nothing is left reserved, spend is the rows' cost.
    assert info["ledger"]["reserved"]["usd"] == 0 and not info["ledger"]["open"]
    assert info["ledger"]["spent"]["usd"] == pytest.approx(sum(r["cost_usd"] for r in rows))

    # A reservation a killed run left open for a fork that never reported: carried, apart.
    info["ledger"]["open"] = {"ghost#0": {"forks": 1, "usd": 0.05, "tokens": 100}}
    (folder / "job.json").write_text(json.dumps(info))
    resumed = _attribute(str(job), "--out", str(out))
    assert resumed.exit_code == 0, resumed.output
    text = " ".join(resumed.output.split())
    assert f"resuming: {len(rows)} rows on disk" in text
    assert "carried over: $0.0500 (1 forks) reserved by forks an earlier run left" in text
    final = json.loads((folder / "job.json").read_text())
    assert final["ledger"]["carried"]["usd"] == pytest.approx(0.05)
    all_rows = _rows(folder)
    assert final["ledger"]["spent"]["usd"] == pytest.approx(sum(r["cost_usd"] for r in all_rows))


def test_an_interrupted_job_says_the_interrupt_not_the_budget_ended_its_shapley() -> None:
    """The scheduler of an interrupted job ends as if its budget had; its Shapley note then
    says the interrupt stopped it and that the same command goes on, with no projection of
    a larger budget (what a budget that ended would need)."""
    from car_ray._notes import Note
    from car_ray.attribute import JobRun
    from car_ray.schedule import JobOutcome, Progress

    ended = Note(
        kind="shapley",
        text="shapley: 8 seeds; the budget ended before the top separated: step 2 came out "
        "ahead of step 6 in 5 seed(s) and behind in 1: ... the same command with "
        "--max-forks 105 (16 more, for the chance they do not) goes on from here",
        figures={"seeds": 8, "unseparated": True, "projected_forks": 11, "suggested_more": 16},
    )
    screen = Note(kind="screen", text="screen: 8 forks; steps that make choices: [2, 6]")
    outcome = JobOutcome("j", "budget_exhausted", [], [screen, ended], Progress())
    run = object.__new__(JobRun)
    run.existing = []  # no rows from earlier runs
    run.settle(outcome, interrupted=True)
    assert outcome.status == "interrupted"
    assert [n.text for n in outcome.notes[:2]] == [
        screen.text,
        "shapley: 8 seeds; the job was interrupted before the top separated; rerun the same "
        "command",
    ]
    assert outcome.notes[1].figures == {"seeds": 8, "unseparated": True}
    assert outcome.notes[2].kind == "interrupted"


def test_a_job_imports_its_own_module_not_one_of_the_same_name(tmp_path: Path) -> None:
    """Two jobs whose scorers live in modules of the same name, in one process (a test run,
    later a batch): each job gets the function from its own folder, and its code digest."""
    from car_ray._imports import import_ref

    for name, value in (("a", 0.0), ("b", 1.0)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "same_name_scorer.py").write_text(
            f"def scorer(*_):\n    return {value}\n"
        )
    first = import_ref("same_name_scorer:scorer", "scorer", (tmp_path / "a",))
    second = import_ref("same_name_scorer:scorer", "scorer", (tmp_path / "b",))
    assert (first(), second()) == (0.0, 1.0)
