"""`car-ray validate`: every scenario through the real runner (Ray, Parquet, the code path a
user hits), scored against its exact values.

Per scenario: the top cause right (the engine's rank-1 re-drawn step among the exact top,
ties within `TIE` of the exact best; for a scenario with nothing to blame, no step's phi
interval above 0), the other arms' rank 1 among their exact best, the negative control
passed, and how many exact values (phi, necessity, sufficiency of every step; flip of every
other arm) lie in the engine's intervals."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from ._aio import run as run_loop
from ._notes import Note
from ._scenario import ensure_tape
from .job import Job, load_job
from .providers import Draws
from .truth import Truth, game_of, solve

TIE = 0.05  # exact phi this close to the best counts as a top cause too
SLACK = 1e-9


@dataclass
class ScenarioCheck:
    name: str
    steps: int
    forks: int
    status: str
    top_exact: list[int]
    top_found: list[int]  # the steps ranked 1 (more than one when they share it)
    top_ok: bool
    arms_ok: bool
    control_ok: bool
    covered: int
    checked: int
    misses: list[str] = field(default_factory=list)
    # Of `covered`/`checked`: the phi of the steps Shapley measured (ranked rows), the
    # values a user reads as the answer (cleared steps' 0 +- b are covered almost always).
    phi_covered: int = 0
    phi_checked: int = 0
    # No step that chooses in some context (`Truth.players`) is shown as cleared (phi 0, no
    # rank) with a deviation bound that does not cover its exact phi.
    players_ok: bool = True
    # What the simulated provider did with a seed (`validate`'s `draws`).
    draws: str = "coupled"

    @property
    def passed(self) -> bool:
        return self.top_ok and self.arms_ok and self.control_ok and self.players_ok

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "passed": self.passed}


def suite(root: Path = Path("jobs"), *, heavy: bool = False) -> list[Path]:
    """Every scenario job under `root`: a job.toml whose job has a simulated policy; with
    `heavy` also those whose policy module's `SCENARIO` says `"heavy": True` (a tape of a
    hundred steps: minutes to solve exactly, kept for `bench`)."""
    out = []
    for path in sorted(root.glob("*/job.toml")):
        job = load_job(path)
        if job.spec.policy is None:
            continue
        if not heavy and _scenario(job).get("heavy"):
            continue
        out.append(path)
    return out


def _scenario(job: Job) -> dict[str, Any]:
    """The job's scenario description (its policy module's `SCENARIO`), {} without one."""
    from ._imports import ImportRefError, import_ref

    assert job.spec.policy is not None
    module = job.spec.policy.partition(":")[0]
    try:
        found = import_ref(f"{module}:SCENARIO", "scenario", job.search_path)
    except ImportRefError:
        return {}
    return dict(found) if isinstance(found, dict) else {}


def _inside(value: float, lo: Any, hi: Any) -> bool:
    return lo is not None and hi is not None and lo - SLACK <= value <= hi + SLACK


def score(
    name: str,
    truth: Truth,
    attribution: list[dict[str, Any]],
    notes: list[Note],
    forks: int,
    status: str,
    steps: int,
) -> ScenarioCheck:
    """One scenario's checks: the engine's table against the exact values."""
    best = max((s.phi for s in truth.steps), default=0.0)
    nothing = best <= SLACK
    top_exact = [s.step for s in truth.steps if not nothing and s.phi >= best - TIE]
    resample = {r["step"]: r for r in attribution if r["intervention"] == "resample"}
    # Rank 1 may be shared (steps the forks cannot tell apart): right only when every step
    # that shares it is an exact top step.
    first = [r["step"] for r in resample.values() if r["rank"] == 1]
    if nothing:
        top_ok = all((r["phi_lo"] or 0.0) <= SLACK for r in resample.values())
    else:
        top_ok = bool(first) and all(step in top_exact for step in first)
    covered = checked = 0
    misses: list[str] = []

    def check(label: str, exact: float, lo: Any, hi: Any) -> None:
        nonlocal covered, checked
        if lo is None:
            return
        checked += 1
        if _inside(exact, lo, hi):
            covered += 1
        else:
            misses.append(f"{label}: exact {exact:.3f} not in [{lo:.3f}, {hi:.3f}]")

    phi_covered = phi_checked = 0
    for k, r in resample.items():
        s = truth.step(k)
        if r["rank"] is not None and r["phi_lo"] is not None:
            phi_checked += 1
            phi_covered += _inside(s.phi, r["phi_lo"], r["phi_hi"])
        check(f"phi@{k}", s.phi, r["phi_lo"], r["phi_hi"])
        check(f"necessity@{k}", s.necessity, r["necessity_lo"], r["necessity_hi"])
        check(f"sufficiency@{k}", s.sufficiency, r["sufficiency_lo"], r["sufficiency_hi"])
    arms_ok = True
    for kind in {r["intervention"] for r in attribution} - {"resample"}:
        rows = [r for r in attribution if r["intervention"] == kind]
        for r in rows:
            arm = truth.arm(kind, r["step"])
            if arm is not None:
                check(f"{kind}@{r['step']}", arm.flip, r["flip_lo"], r["flip_hi"])
        exact = {a.step: a.flip for a in truth.arms if a.kind == kind}
        top = max(exact.values(), default=0.0)
        ranked_first = [r["step"] for r in rows if r["rank"] == 1]
        found = min((exact.get(step, -1.0) for step in ranked_first), default=-1.0)
        if top > SLACK and found < top - TIE:
            arms_ok = False
            misses.append(f"{kind}: rank 1 is step(s) {ranked_first}, exact best {exact}")
    control_ok = not any(n.kind == "control_failed" for n in notes)
    # A player the screen missed by chance (it rarely leaves the tape) is honest while its
    # bound covers its phi; one outside it is a step the screen cannot see.
    unseen = [
        k
        for k in truth.players
        if k in resample
        and resample[k]["rank"] is None
        and resample[k]["phi"] == 0.0
        and not _inside(truth.step(k).phi, resample[k]["phi_lo"], resample[k]["phi_hi"])
    ]
    for k in unseen:
        misses.append(
            f"step {k} makes choices but is shown as cleared, and its bound does not cover "
            "its exact phi: the screen never found it"
        )
    return ScenarioCheck(
        name,
        steps,
        forks,
        status,
        top_exact,
        first,
        top_ok,
        arms_ok,
        control_ok,
        covered,
        checked,
        misses,
        phi_covered,
        phi_checked,
        players_ok=not unseen,
    )


def validate(
    job_files: Sequence[Path],
    *,
    forks_per_step: int = 10,
    seed: int = 0,
    out: str | None = None,
    console: Console | None = None,
    draws: Draws = "coupled",
) -> list[ScenarioCheck]:
    """Attribute every scenario on an embedded Ray at `forks_per_step` forks a step, its
    simulated provider answering seeds as `draws` says (the tapes are recorded as the
    scenario's seed lands, on the coupled provider), and score it against its exact values:
    those of the held game on the coupled provider, of the maximal game off it (the game a
    job estimates there, `truth.Game`)."""
    from .attribute import attribute

    console = console or Console()
    quiet = Console(file=open("/dev/null", "w"), width=120)  # noqa: SIM115 - closed below
    checks: list[ScenarioCheck] = []
    try:
        with tempfile.TemporaryDirectory(prefix="car-ray-validate-") as scratch:
            for path in job_files:
                job = load_job(path)
                provider = job.spec.provider.model_copy(update={"sim_draws": draws})
                update = {"attribution_seed": seed, "provider": provider}
                job = Job(job.path, job.spec.model_copy(update=update))
                tape = ensure_tape(job, on_record=lambda line: console.print(line, markup=False))
                truth = run_loop(solve(job, tape, game=game_of(draws)))
                _, outcome = attribute(
                    job,
                    tape=tape,
                    out=out or scratch,
                    max_forks=forks_per_step * len(tape.steps),
                    max_usd=None,
                    console=quiet,
                )
                check = score(
                    job.folder.name,
                    truth,
                    outcome.attribution,
                    outcome.notes,
                    outcome.progress.spent.forks,
                    outcome.status,
                    len(tape.steps),
                )
                check.draws = draws
                checks.append(check)
                verdict = "[green]PASS[/]" if check.passed else "[bold red]FAIL[/]"
                line = (
                    f"{check.name}: {check.steps} steps, {check.forks} forks "
                    f"({check.status}); top exact {check.top_exact or 'none'}, found "
                    f"{check.top_found or 'none'}; covered {check.covered}/{check.checked}"
                    + ("" if check.control_ok else "; NEGATIVE CONTROL FAILED")
                )
                console.print(f"{verdict} {escape(line)}")
                for miss in check.misses:
                    console.print(f"    {miss}", markup=False)
    finally:
        quiet.file.close()
    return checks


def summary(checks: Sequence[ScenarioCheck]) -> dict[str, Any]:
    covered = sum(c.covered for c in checks)
    checked = sum(c.checked for c in checks)
    return {
        "scenarios": len(checks),
        "passed": sum(c.passed for c in checks),
        "coverage": covered / checked if checked else None,
        "covered": covered,
        "checked": checked,
        "forks": sum(c.forks for c in checks),
        "checks": [c.as_dict() for c in checks],
    }


def dumps(checks: Sequence[ScenarioCheck]) -> str:
    return json.dumps(summary(checks), indent=2)
