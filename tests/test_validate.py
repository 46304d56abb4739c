"""`car-ray validate`: the scoring fails on a wrong answer, and the whole suite passes through
the real runner (embedded Ray, Parquet) at its default budget."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from car_ray._notes import Note
from car_ray.job import load_job
from car_ray.sim import SimServer
from car_ray.truth import Truth, solve
from car_ray.validate import score

from .conftest import RESEARCH_JOB, ROOT, record_job, run


@pytest.fixture(scope="module")
def truth(tmp_path_factory: pytest.TempPathFactory) -> Truth:
    job = load_job(RESEARCH_JOB)
    with SimServer(job.load("policy")) as sim:
        tape = record_job(job, sim, tmp_path_factory.mktemp("v") / "r.tape")
    return run(solve(job, tape))


def _table(truth: Truth, first: int, width: float = 0.05) -> list[dict[str, Any]]:
    """An engine table with the exact values and +-width intervals, `first` ranked 1."""
    rows = []
    for s in truth.steps:
        rows.append(
            {
                "step": s.step,
                "intervention": "resample",
                "rank": 1 if s.step == first else None,
                "phi": s.phi,
                "phi_lo": s.phi - width,
                "phi_hi": s.phi + width,
                "necessity_lo": s.necessity - width,
                "necessity_hi": s.necessity + width,
                "sufficiency_lo": s.sufficiency - width,
                "sufficiency_hi": s.sufficiency + width,
            }
        )
    return rows


def test_a_right_table_passes_and_a_wrong_top_fails(truth: Truth) -> None:
    good = score("research", truth, _table(truth, first=4), [], 80, "complete", 8)
    assert good.passed and good.covered == good.checked == 3 * len(truth.steps)
    # The submit tool ranked first: the relay the held game exists to rule out.
    wrong = score("research", truth, _table(truth, first=7), [], 80, "complete", 8)
    assert not wrong.passed and not wrong.top_ok
    # Rank 1 shared by a top step and the submit tool (forks that could not tell them
    # apart) is not the answer: every step that shares it must be an exact top step.
    shared = _table(truth, first=4)
    shared[7]["rank"] = 1
    tied = score("research", truth, shared, [], 80, "complete", 8)
    assert not tied.top_ok and tied.top_found == [4, 7]
    both = _table(truth, first=4)
    both[6]["rank"] = 1
    assert score("research", truth, both, [], 80, "complete", 8).top_ok
    # A failed negative control fails the scenario whatever the table says.
    control = score(
        "research",
        truth,
        _table(truth, first=6),
        [Note(kind="control_failed", text="x")],
        80,
        "x",
        8,
    )
    assert not control.passed
    # Intervals that miss the exact values are counted as misses, by name.
    narrow = _table(truth, first=4, width=0.0)
    narrow[4].update(phi_lo=0.9, phi_hi=0.95)
    missed = score("research", truth, narrow, [], 80, "complete", 8)
    assert missed.covered == missed.checked - 1 and missed.misses[0].startswith("phi@4")
    # A step that makes choices shown as cleared (phi 0, no rank: the screen never found it)
    # with a bound that does not cover its exact phi fails the scenario; one the screen
    # missed by chance, inside its bound, is honest.
    assert 2 in truth.players and abs(truth.step(2).phi) > 0.05
    unseen = _table(truth, first=4)
    unseen[2].update(phi=0.0, phi_lo=-0.01, phi_hi=0.01, rank=None)
    hidden = score("research", truth, unseen, [], 80, "complete", 8)
    assert not hidden.passed and hidden.top_ok and not hidden.players_ok
    assert any("step 2 makes choices but is shown as cleared" in m for m in hidden.misses)
    covered = _table(truth, first=4)
    covered[2].update(phi=0.0, phi_lo=-0.2, phi_hi=0.2, rank=None)
    assert score("research", truth, covered, [], 80, "complete", 8).passed


@pytest.mark.timeout(900)
def test_every_scenario_passes_through_the_real_runner() -> None:
    """The CI run of `car-ray validate --check` over jobs/ (every scenario, embedded Ray)."""
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    done = subprocess.run(
        [sys.executable, "-m", "car_ray.cli", "validate", "--check", "--json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(done.stdout)
    names = {c["name"] for c in result["checks"]}
    assert {"relay", "echo", "and_conj", "null_control", "long_tape", "research_async"} <= names
    assert result["passed"] == result["scenarios"] >= 11
    assert result["coverage"] >= 0.9
