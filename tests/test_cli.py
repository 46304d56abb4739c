"""The command line as a user runs it: record, inspect, replay, fork, and bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from car_ray.cli import app

from .conftest import ROOT, SUPPORT_JOB

cli = CliRunner()


def test_record_inspect_replay_and_fork(tmp_path: Path) -> None:
    tape = tmp_path / "support.tape"
    recorded = cli.invoke(app, ["record", str(SUPPORT_JOB), "-o", str(tape)])
    assert recorded.exit_code == 0, recorded.output
    assert "recorded 7 steps" in recorded.output

    again = cli.invoke(app, ["record", str(SUPPORT_JOB), "-o", str(tape)])
    assert again.exit_code == 2 and "already exists" in again.output

    inspected = cli.invoke(app, ["inspect", str(tape)])
    assert inspected.exit_code == 0
    assert "issue_refund (effect)" in inspected.output and "sealed" in inspected.output

    replayed = cli.invoke(app, ["replay", str(tape), "--job", str(SUPPORT_JOB)])
    assert replayed.exit_code == 0, replayed.output
    assert "faithful" in replayed.output and "recorded outcome 1.00" in replayed.output

    forked = cli.invoke(
        app,
        [
            "fork",
            str(tape),
            "--job",
            str(SUPPORT_JOB),
            "--step",
            "4",
            "--do",
            "action",
            "--value",
            "No refund for you.",
            "--json",
        ],
    )
    assert forked.exit_code == 0, forked.output
    row = json.loads(forked.output)
    assert row["status"] == "ok" and row["outcome"] == 0.0 and row["flipped"] is True
    assert row["steps_intervened"] == [4] and row["interventions"] == ["action"]

    observed = cli.invoke(
        app,
        [
            "fork",
            str(tape),
            "--job",
            str(SUPPORT_JOB),
            "--step",
            "1",
            "--do",
            "observation",
            "--value",
            '{"order_id": "A1001", "notes": ""}',
            "--seed",
            "2",
        ],
    )
    assert observed.exit_code == 0, observed.output
    assert "observation" in observed.output


def test_replay_of_a_changed_agent_fails_with_the_diff(tmp_path: Path) -> None:
    tape = tmp_path / "support.tape"
    assert cli.invoke(app, ["record", str(SUPPORT_JOB), "-o", str(tape)]).exit_code == 0
    # The same job with a system prompt edited: a user changed the agent after recording.
    job_dir = tmp_path / "edited"
    job_dir.mkdir()
    (job_dir / "edited_agent.py").write_text(
        "import support_refund.agent as base\n"
        "base.SYSTEM = base.SYSTEM + ' Be brief.'\n"
        "support_agent = base.support_agent\n"
        "wrongful_refund = base.wrongful_refund\n"
    )
    (job_dir / "job.toml").write_text(
        'agent = "edited_agent:support_agent"\nscorer = "edited_agent:wrongful_refund"\n'
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "car_ray.cli",
            "replay",
            str(tape),
            "--job",
            str(job_dir / "job.toml"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT / "jobs"), "PATH": "/usr/bin:/bin", "COLUMNS": "200"},
        check=False,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "divergence at step 0" in result.stderr
    assert "$.messages[0].content" in result.stderr
    assert "Be brief." in result.stderr


def test_bad_input_names_the_key_or_step(tmp_path: Path) -> None:
    job = tmp_path / "job.toml"
    job.write_text('agent = "a:b"\nscorer = "a:c"\nbudget_usd = 3\n')
    bad = cli.invoke(app, ["record", str(job), "-o", str(tmp_path / "x.tape")])
    assert bad.exit_code == 2 and "unknown key 'budget_usd'" in bad.output

    tape = tmp_path / "support.tape"
    assert cli.invoke(app, ["record", str(SUPPORT_JOB), "-o", str(tape)]).exit_code == 0
    wrong_kind = cli.invoke(
        app,
        [
            "fork",
            str(tape),
            "--job",
            str(SUPPORT_JOB),
            "--step",
            "0",
            "--do",
            "observation",
            "--value",
            "{}",
        ],
    )
    assert wrong_kind.exit_code == 2 and "step 0 is a model call" in wrong_kind.output
    unknown = cli.invoke(
        app, ["fork", str(tape), "--job", str(SUPPORT_JOB), "--step", "4", "--do", "teleport"]
    )
    assert unknown.exit_code == 2 and "teleport" in unknown.output
