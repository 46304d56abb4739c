"""`car-ray bench`: the accuracy benchmark end to end on one small scenario, and its top-1 rule."""

from __future__ import annotations

import io
from typing import Any

import pyarrow.parquet as pq
from rich.console import Console

from car_ray._answer import Answer
from car_ray.bench import SCHEMA, SCHEMES, ended, main, plan_scenario, tasks_of, top1

from .conftest import ROOT

PNG = b"\x89PNG\r\n\x1a\n"


def test_bench_quick_on_one_scenario(tmp_path: Any) -> None:
    text = io.StringIO()
    code = main(
        [ROOT / "jobs" / "late_commit" / "job.toml"],
        quick=True,
        seeds=2,
        forks_per_step=[0.5, 1],
        processes=2,
        out=tmp_path,
        console=Console(file=text, width=200),
    )
    printed = text.getvalue()
    assert code == 0, printed
    table = pq.read_table(tmp_path / "accuracy.parquet")
    assert table.schema.names == SCHEMA.names
    rows = table.to_pylist()
    keys = [(r["scheme"], r["budget"], r["seed"]) for r in rows]
    assert len(keys) == len(set(keys))
    # 1 fork a step of the 11-step tape for every scheme and seed; half a fork a step (6,
    # rounded up) for auto alone: a uniform scheme spends at least one fork of every arm; and
    # auto's uncapped run (budget null) once a seed.
    expected = (
        {(s, 11, seed) for s in SCHEMES for seed in (0, 1)}
        | {("auto", 6, seed) for seed in (0, 1)}
        | {("auto", None, seed) for seed in (0, 1)}
    )
    assert set(keys) == expected
    assert {r["scenario"] for r in rows} == {"late_commit"}
    assert all(r["error"] is None and r["top_exact"] == [2] for r in rows)
    assert all(r["forks"] <= r["budget"] for r in rows if r["budget"] is not None)
    assert {r["forks_per_step"] for r in rows if r["budget"] == 6} == {0.5}
    png = (tmp_path / "accuracy.png").read_bytes()
    assert png.startswith(PNG)
    for scheme in SCHEMES:
        assert scheme in printed
    assert "fewest forks" in printed and "wall time" in printed
    assert "auto from 1 fork a step" in " ".join(printed.split())
    # late_commit at 11 forks: auto is right (its cause is the only step that chooses), the
    # live tail ties the cause with the steps before it and the pinned tail with the one
    # that confirms it, so the comparison names it among those only auto reaches.
    flat = " ".join(printed.split())
    assert "where neither does (late_commit)" in flat, printed
    measured = [r for r in rows if r["scheme"] == "auto"]
    assert all(r["phi_checked"] >= 1 and r["phi_covered"] <= r["phi_checked"] for r in measured)


def _row(step: int, value: float | None, rank: int | None, lo: float = 0.0) -> dict[str, Any]:
    return {
        "step": step,
        "intervention": "resample",
        "rank": rank,
        "phi": value,
        "phi_lo": lo,
        "flip_rate": value,
    }


def test_top1_counts_a_tie_with_a_wrong_step_as_wrong() -> None:
    ahead = [_row(2, 0.5, 1), _row(0, 0.2, 2), _row(4, 0.0, None)]
    tied = [_row(2, 0.5, 1), _row(0, 0.5, 2)]
    wrong = [_row(0, 0.5, 1), _row(2, 0.4, 2)]
    for scheme in ("auto", "uniform-held"):
        assert top1(scheme, ahead, [2]) == (2, True)
        assert top1(scheme, tied, [2]) == (2, False)
        assert top1(scheme, wrong, [2]) == (0, False)
        # Two exact top steps may tie with each other.
        assert top1(scheme, tied, [0, 2]) == (2, True)
    # The negative control: right when nothing is blamed.
    assert top1("auto", [_row(0, 0.1, 1, lo=-0.2)], [])[1]
    assert not top1("auto", [_row(0, 0.3, 1, lo=0.1)], [])[1]
    assert top1("uniform-live", [_row(0, 0.0, 1)], [])[1]
    assert not top1("uniform-live", [_row(0, 0.25, 1)], [])[1]


def test_ended_reads_a_job_that_did_not_answer_as_no_stop() -> None:
    assert ended(Answer(kind="separated", top=[2]), "complete") == "separated"
    budget = "budget_exhausted"
    assert ended(Answer(kind="lead"), budget) == ended(Answer(kind="unanswered"), budget)
    assert ended(Answer(kind="lead"), budget) == "budget"
    assert ended(Answer(kind="nothing"), "complete") == "nothing"
    # A failed job, or a complete one that did not answer (a screen stopped on strays).
    assert ended(Answer(kind="unanswered"), "control_failed") is None
    assert ended(Answer(kind="unanswered"), "complete") is None
    assert ended(Answer(kind="measured"), "complete") is None and ended(None) is None


def test_the_grid_runs_uniform_from_one_fork_a_step() -> None:
    """late_commit has 11 steps: F = 1/4 is 3 forks (rounded up), 1/2 is 6 and 1 is 11. Under
    a cap of 6 forks, 1/2 and 1 are the same budget (named 1), which is below a fork a step:
    auto alone runs there; without the cap the uniform schemes run at 11 forks only."""
    job = ROOT / "jobs" / "late_commit" / "job.toml"
    capped = plan_scenario(job, [0.25, 0.5, 1], 1, 1, 6)
    assert capped.grid == [(0.25, 3), (1, 6)]
    assert {(t.scheme, t.budget) for t in tasks_of(capped)} == {
        ("auto", None),
        ("auto", 3),
        ("auto", 6),
    }
    free = plan_scenario(job, [0.25, 0.5, 1], 1, 1, None)
    assert free.grid == [(0.25, 3), (0.5, 6), (1, 11)]
    uniform = {(t.scheme, t.budget, t.uniform_k) for t in tasks_of(free) if t.scheme != "auto"}
    assert uniform == {(s, 11, max(1, 11 // free.arms)) for s in SCHEMES[1:]}


def test_a_family_of_tape_lengths_gets_forks_against_steps(tmp_path: Any) -> None:
    """jobs/checklist_sparse_10 and _30 are one family (`<family>_<n>`): the bench prints
    their forks against steps and draws scaling.png. Under a cap of 20 forks the 31-step
    tape's uniform schemes never run (a fork an arm is 31): uniform-held's least is shown
    beyond the grid; the 11-step tape's run at 11. Asked for uniform-held alone, the bench
    runs no other uniform scheme and prints no column or comparison of theirs."""
    from car_ray.bench import families, plan_scenario

    jobs = [ROOT / "jobs" / f"checklist_sparse_{n}" / "job.toml" for n in (10, 30)]
    plans = [plan_scenario(j, [1], 1, 1, 20) for j in jobs]
    assert families(plans) == {"checklist_sparse": plans}
    assert families(plans[:1]) == {}  # one length is no family
    text = io.StringIO()
    code = main(
        jobs,
        seeds=2,
        forks_per_step=[1],
        max_budget=20,
        processes=2,
        out=tmp_path,
        console=Console(file=text, width=200),
        schemes=["auto", "uniform-held"],
    )
    printed = " ".join(text.getvalue().split())
    assert code == 0, printed
    assert "uniform-live" not in printed and "other tools use" not in printed
    assert "checklist_sparse: forks against the tape's steps" in printed
    assert "at least 31 (a fork an arm, beyond the grid)" in printed
    assert (tmp_path / "scaling.png").read_bytes().startswith(PNG)
    rows = pq.read_table(tmp_path / "accuracy.parquet").to_pylist()
    held = {r["scenario"] for r in rows if r["scheme"] == "uniform-held"}
    assert held == {"checklist_sparse_10"}
    assert {r["scheme"] for r in rows} == {"auto", "uniform-held"}


def test_the_bench_command_runs_the_schemes_and_long_seeds_it_is_given(tmp_path: Any) -> None:
    """`car-ray bench --scheme S --long-seeds N`: only auto and S run, and a tape over 32
    steps runs N seeds (jobs/long_tape: 65 steps, 2 seeds given, 1 run); a scheme it does not
    know is one line naming it."""
    from typer.testing import CliRunner

    from car_ray.cli import app

    cli = CliRunner()
    job = str(ROOT / "jobs" / "long_tape" / "job.toml")
    args = ["bench", job, "--seeds", "2", "--forks-per-step", "1", "--out", str(tmp_path)]
    result = cli.invoke(app, [*args, "--scheme", "uniform-held", "--long-seeds", "1"])
    assert result.exit_code == 0, result.output
    rows = pq.read_table(tmp_path / "accuracy.parquet").to_pylist()
    assert {r["scheme"] for r in rows} == {"auto", "uniform-held"}
    assert {r["seed"] for r in rows} == {0}
    bad = cli.invoke(app, [*args, "--scheme", "uniform-sometimes"])
    assert bad.exit_code != 0
    assert "--scheme 'uniform-sometimes': expected one of uniform-live" in bad.output
