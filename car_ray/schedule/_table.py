"""A job's table, notes and answer, built from its stages' results (`Results`): never from a
stage's state, the job's method or a note's text."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._answer import RAN, Answer
from .._notes import Note
from ..replay import ReplaceObservation
from ..results import replaced_part
from ..tape import LlmEvent, ToolEvent
from ._context import Arm, JobContext
from ._interval import Interval, wilson
from ._results import (
    ControlResult,
    DrawsResult,
    FlipCounts,
    GroupsResult,
    ScreenResult,
    ShapleyResult,
    StageResult,
    Verdict,
)
from ._tuning import GO_ON_SLACK
from .estimators import DeviationScreen


@dataclass
class Results:
    """The results a job's stages handed back, the last of each kind kept (a Shapley that
    started over replaces the one before; a second screen pass, the first)."""

    control: ControlResult | None = None
    arms: FlipCounts | None = None
    uniform: FlipCounts | None = None
    screened: ScreenResult | None = None
    shapley: ShapleyResult | None = None
    draws: DrawsResult | None = None
    latest_screen: ScreenResult | None = None
    notes: list[Note] = field(default_factory=list)
    planned: list[str] = field(default_factory=list)  # the plan's stages, by name

    def add(self, results: Sequence[StageResult]) -> None:
        for result in results:
            if isinstance(result, ControlResult):
                self.control = result
                self.notes.extend(result.notes)
            elif isinstance(result, FlipCounts):
                if result.stage == "uniform":
                    self.uniform = result
                else:
                    self.arms = result
            elif isinstance(result, ScreenResult):
                self.screened = result
                self.latest_screen = result
            elif isinstance(result, DrawsResult):
                self.draws = result
                self.notes.extend(result.notes)
            elif isinstance(result, GroupsResult):
                self.notes.extend(result.notes)
            else:
                self.shapley = result
                self.latest_screen = result.screen
                self.notes.extend(result.notes)

    @property
    def screen(self) -> ScreenResult | None:
        """The screen as it stood at the end: the last a stage handed back (a Shapley's: its
        probes screen too; the group game's: it settles steps), else the Shapley's, else the
        screen stage's."""
        if self.latest_screen is not None:
            return self.latest_screen
        return self.shapley.screen if self.shapley is not None else self.screened

    @property
    def verdict(self) -> Verdict | None:
        """The held mechanism's verdict: the Shapley's, else the screen's (nothing found)."""
        if self.shapley is not None:
            return self.shapley.verdict
        return self.screened.verdict if self.screened is not None else None

    @property
    def control_failed(self) -> bool:
        return self.control is not None and self.control.failed


# -- the table ------------------------------------------------------------------------------------


def attribution_table(ctx: JobContext, results: Results) -> list[dict[str, Any]]:
    """One record per arm: a re-drawn step's phi, necessity and sufficiency where Shapley
    measured it, phi 0 within the screen's deviation bound where the screen cleared it
    (necessity_hi: how often it could still leave the tape); an arm the uniform scheme or
    the other-arms stage ran, its flip-rate (exact where one fork is its value, else with
    Wilson's interval). Ranked within each intervention kind: re-drawn steps by phi where
    Shapley ran, every other arm by flip-rate."""
    estimates = results.shapley.estimates if results.shapley is not None else {}
    screen = results.screen
    out = []
    for arm in ctx.arms:
        record = _record(ctx, arm)
        flips = results.uniform or (results.arms if arm.kind != "resample" else None)
        if arm.kind == "resample" and arm.step in estimates:
            phi, nec, suf = estimates[arm.step]
            record.update({k: v for k, v in _interval("phi", phi).items() if k != "phi_n"})
            record.update(_interval("necessity", nec))
            record.update(_interval("sufficiency", suf))
            record.update(flip_rate=nec.value, flip_lo=nec.low, flip_hi=nec.high, flip_n=nec.n)
        elif (
            arm.kind == "resample"
            and screen is not None
            and arm.step not in screen.candidates
            and screen.clean.get(arm.step, 0) > 0
        ):
            bound = screen.deviation_bound(arm.step, ctx.alpha)
            n = screen.clean[arm.step]
            # Its blame is only bounded, not known to be 0: each of its marginal
            # contributions needs it to leave the tape.
            record.update(
                phi=0.0,
                phi_lo=-bound,
                phi_hi=bound,
                necessity=0.0,
                necessity_lo=0.0,
                necessity_hi=bound,
                necessity_n=n,
                flip_rate=0.0,
                flip_lo=0.0,
                flip_hi=bound,
                flip_n=n,
            )
        elif flips is not None:
            got, n = flips.counts.get(arm.key, (0, 0))
            if n:
                exact = arm.key in flips.exact
                lo, hi = (got / n, got / n) if exact else wilson(got, n, ctx.alpha)
                record.update(flip_rate=got / n, flip_lo=lo, flip_hi=hi, flip_n=n)
        out.append(record)
    if screen is not None:  # the held mechanism: re-drawn steps by blame, where measured
        candidates = set(estimates)
        _rank(
            [r for r in out if r["intervention"] == "resample" and r["step"] in candidates], "phi"
        )
        _rank([r for r in out if r["intervention"] != "resample"], "flip_rate")
    else:
        _rank(out, "flip_rate")
    return sorted(out, key=_table_order)


def _record(ctx: JobContext, arm: Arm) -> dict[str, Any]:
    event = ctx.steps[arm.step]
    iv = arm.intervention
    replaced = None
    if isinstance(iv, ReplaceObservation) and isinstance(event, ToolEvent) and iv.error is None:
        replaced = replaced_part(event.result, iv.result)
    return {
        "step": arm.step,
        "step_kind": event.type,
        "label": event.what() if isinstance(event, LlmEvent) else event.name,
        "intervention": arm.kind,
        **{
            f"{q}{suffix}": None
            for q in ("flip", "phi", "necessity", "sufficiency")
            for suffix in (("_rate", "_lo", "_hi") if q == "flip" else ("", "_lo", "_hi"))
        },
        "flip_n": 0,
        "phi_se": None,
        "necessity_n": 0,
        "sufficiency_n": 0,
        "rank": None,
        "replaced": replaced,
    }


def _interval(name: str, e: Interval) -> dict[str, Any]:
    return {name: e.value, f"{name}_lo": e.low, f"{name}_hi": e.high, f"{name}_n": e.n}


def _rank(records: list[dict[str, Any]], key: str) -> None:
    """Rank measured records by `key` within each intervention kind (1 = first); records
    without a value get no rank. Equal values go by flip-rate (a re-drawn step's: its
    necessity, how often re-drawing it alone clears the failure); records equal in both
    share a rank (see `_share_ranks`)."""
    for kind in {r["intervention"] for r in records}:
        _share_ranks(
            [r for r in records if r["intervention"] == kind and r[key] is not None],
            lambda r: (-r[key], -(r.get("flip_rate") or 0.0)),
        )


def _share_ranks(
    records: list[dict[str, Any]], order: Callable[[dict[str, Any]], tuple[float, ...]]
) -> None:
    """Competition ranks (1, 1, 3) by `order`: records the measurements cannot tell apart
    share a rank, and the next rank skips past them. Steps tied at phi 0 with no flips (one
    seed that flipped nowhere) are a tie, not a ranking by step number: a table whose rank
    1 is the lowest step of a tie would name a cause the forks never saw."""
    records.sort(key=lambda r: (order(r), r["step"]))
    for i, r in enumerate(records):
        same = i > 0 and order(records[i - 1]) == order(r)
        r["rank"] = records[i - 1]["rank"] if same else i + 1


def _table_order(r: dict[str, Any]) -> tuple[bool, str, int, int]:
    """Re-drawn steps first (the steps to fix, by blame), then each other kind; by rank."""
    rank = r["rank"] if r["rank"] is not None else 1 << 30
    return (r["intervention"] != "resample", r["intervention"], rank, r["step"])


# -- the notes of the held mechanism --------------------------------------------------------------


def held_notes(ctx: JobContext, results: Results) -> list[Note]:
    """What the screen and Shapley found, for the job's notes (once the screen has run)."""
    screen = results.screen
    assert screen is not None
    shapley, verdict = results.shapley, results.verdict
    confidence = ctx.spec.confidence
    notes = []
    if screen.strays:
        notes.append(
            Note(
                kind="screen_strays",
                severity="warning",
                text=f"screen: {screen.strays} forks left the tape at a step they did not "
                "re-draw (nondeterminism outside the context's seams?)",
                figures={"strays": screen.strays},
            )
        )
    probed = f" and probes in {screen.probe_forks} Shapley forks" if screen.probe_forks else ""
    checked = bool(screen.settled) and not screen.moved  # settled by the outcome check
    settled = (
        f"; {len(screen.settled)} more cleared on the outcome, "
        + ("all at once" if checked else "in groups")
        if screen.settled
        else ""
    )
    notes.append(
        Note(
            kind="screen",
            text=f"screen: {screen.forks} forks{probed}; steps that make choices: "
            f"{list(screen.candidates) or 'none'}{settled}",
            figures={
                "forks": screen.forks,
                "candidates": list(screen.candidates),
                "settled": sorted(screen.settled),
            },
        )
    )
    n = len(shapley.seeds) if shapley is not None else 0
    figures: dict[str, Any] = {"seeds": n}
    if verdict is None:
        unsettled = shapley.unsettled if shapley is not None else None
        why = f": {unsettled.text}" if unsettled is not None else ""
        text = f"shapley: {n} seeds; the budget ended before the top separated{why}"
        # Said of a job whose run ended it (an interrupt, `attribute.JobRun.settle`) otherwise.
        figures["unseparated"] = True
        if unsettled is not None and unsettled.forks is not None:
            figures.update(
                projected_forks=unsettled.forks,
                suggested_more=unsettled.more,
                go_on=unsettled.go_on,
            )
    elif verdict[1]:
        top = list(verdict[1])
        figures.update(top=top, verdict=verdict[0])
        text = f"shapley: {n} seeds; top cause {top} {verdict[0]} at {confidence:.0%}"
    elif verdict[0] == "precise":
        text = (
            f"shapley: {n} seeds; precise: every interval within "
            f"±{ctx.spec.target_half_width:g}, and no step's blame is above 0 at "
            f"{confidence:.0%}"
        )
    elif screen.steps:
        # A claim about draws, so it says how many: a step that leaves the tape rarely
        # enough can be missed.
        fewest = min(screen.clean.get(k, 0) for k in screen.steps)
        figures["fewest_clean"] = fewest
        bound = DeviationScreen.bound_after(fewest, ctx.alpha)
        most = DeviationScreen.percent_after(fewest, ctx.alpha)
        if checked:
            figures["whole_bound"] = bound
            text = (
                "shapley: no step's re-draw changes the outcome, as far as re-drawing every "
                f"step at once in {fewest} forks shows: at {confidence:.0%}, that changes it "
                f"at most {most}% of the time, so all steps' blame together (their sum) is at "
                f"most {most}%"
            )
        elif screen.settled:
            figures["group_bound"] = bound
            text = (
                "shapley: no step's re-draw changes the outcome, as far as re-drawing them in "
                f"groups in {fewest} seed(s) or more shows: at {confidence:.0%}, no group's "
                f"blame is above {most}%"
            )
        elif screen.strays and fewest < ctx.clean_enough:
            text = (
                "shapley: no step was seen to make a choice, but the screen stopped on forks "
                f"that left the tape where nothing was re-drawn, with as few as {fewest} "
                "re-draw(s) of a step: this says little"
            )
        else:
            figures["deviation_bound"] = bound
            text = (
                "shapley: no step makes a choice that could change the outcome, as far as "
                f"{fewest} re-draw(s) of each step show: at {confidence:.0%}, none leaves its "
                f"recorded action more than {most}% of the time"
            )
    else:
        text = "shapley: no step makes a choice that could change the outcome"
    notes.append(Note(kind="shapley", text=text, figures=figures))
    return notes


# -- answers --------------------------------------------------------------------------------------


def held_answer(ctx: JobContext, results: Results, status: str, spent_forks: int) -> Answer:
    """What the held screen and Shapley let the job claim (`Answer`). A step is examined when
    Shapley measured its blame; a step the screen did not find is cleared by the verdict's own
    rule (with a top: the clean draws the verdict stood on; for a lead whose budget ended, those
    its top would need; with neither: the clean re-draws a "no step makes a choice" note rests
    on, `JobContext.clean_enough`); every other step is unexamined, and a job with an unexamined
    step has no answer (`lead` if it shows blame somewhere). A job whose status is not one of
    `RAN` answers nothing. The projection for unexamined steps is the forks so far
    (`spent_forks`, carried ones counted) per step examined or cleared, times the steps left,
    and never fewer than the screen forks that would give each unexamined step its
    `clean_enough` clean re-draws; the options allow GO_ON_SLACK of it again."""
    steps = ctx.resampled
    screen, shapley, verdict = results.screen, results.shapley, results.verdict
    if screen is None:  # the job ended before its screen began
        return Answer(kind="unanswered", steps=steps, unexamined=steps, never=steps)
    estimates = shapley.estimates if shapley is not None else {}
    lacking = shapley.lacking if shapley is not None else None
    examined = [k for k in steps if k in estimates]
    found = [k for k in steps if k in screen.candidates and k not in estimates]
    unfound = [k for k in steps if k not in screen.candidates]
    if verdict is not None and verdict[1]:
        cleared, short = unfound, []  # the verdict stood on their clean draws
    elif verdict is None and lacking is not None:
        # A lead: the steps short of the clean draws its top would need.
        short = [k for k in unfound if k in lacking]
        cleared = [k for k in unfound if k not in lacking]
    else:
        cleared = [k for k in unfound if screen.clean.get(k, 0) >= ctx.clean_enough]
        short = [k for k in unfound if k not in cleared]
    unexamined = sorted(found + short)
    shown = any((phi.value or 0.0) > 0 for phi, _, _ in estimates.values())
    kind: str
    if status not in RAN:
        kind = "unanswered"
    elif verdict is not None and not unexamined:
        kind = "nothing" if verdict == ("separated", ()) else verdict[0]
    else:
        kind = "lead" if shown else "unanswered"
    more = go_on = None
    if unexamined and status in RAN:
        seen = len(examined) + len(cleared)
        rate = spent_forks * len(unexamined) / seen if seen else 0.0
        enough = ctx.clean_enough
        clear = enough - min((screen.clean.get(k, 0) for k in short), default=enough)
        more = max(1, math.ceil(max(rate, clear)))
        go_on, also = ctx.go_on(math.ceil(more * GO_ON_SLACK))
        go_on = f"{go_on}; {also}" if also else go_on
    return Answer.model_validate(
        {
            "kind": kind,
            "steps": steps,
            "top": list(verdict[1]) if verdict is not None else [],
            "examined": examined,
            "cleared": cleared,
            "unexamined": unexamined,
            "never": [k for k in short if not screen.clean.get(k, 0)],
            "found": found,
            "more_forks": more,
            "go_on": go_on,
        }
    )


def measured_answer(ctx: JobContext, table: Sequence[dict[str, Any]], status: str) -> Answer:
    """What the uniform scheme's table (flip-rates, no stopping rule) lets the job claim: an
    effect if any interval is shown above 0; else nothing to blame only when every re-drawn
    step's flip-rate is shown within the target half-width, and no answer otherwise (nor
    for a job whose status is not one of `RAN`)."""
    steps = ctx.resampled
    rows = {r["step"]: r for r in table if r["intervention"] == "resample"}
    measured = [k for k in steps if rows.get(k, {}).get("flip_n")]
    target = ctx.spec.target_half_width
    cleared = [k for k in measured if (rows[k].get("flip_hi") or 1.0) <= target]
    unexamined = [k for k in steps if k not in measured]
    shown = any((r.get("flip_lo") or 0.0) > 0 for r in table)
    if status not in RAN:
        kind = "unanswered"
    elif shown:
        kind = "measured"
    else:
        kind = "nothing" if len(cleared) == len(steps) else "unanswered"
    return Answer.model_validate(
        {
            "kind": kind,
            "measure": "flip_rate",
            "steps": steps,
            "examined": [k for k in measured if k not in cleared],
            "cleared": cleared,
            "unexamined": unexamined,
            "never": unexamined,
        }
    )
