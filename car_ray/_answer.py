"""What a job's forks let it claim, as data (`Answer`): the verdict line, `show`, the report,
job.json, batch summaries and the exit status all read it, never the text of a note."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# separated: a top cause shown apart from every other step at the job's confidence.
# precise: every step's blame within the job's target half-width; `top` holds the steps whose
#   blame is shown above 0 (none: nothing to blame, at that precision).
# nothing: every step cleared: none was seen to make a choice that could change the outcome.
# lead: the job ended before its top separated; its leader has the most blame so far.
# unanswered: the job ended before any blame was seen and before every step was cleared.
# measured: the uniform scheme (flip-rates, no stopping rule) showed an effect.
AnswerKind = Literal["separated", "precise", "nothing", "lead", "unanswered", "measured"]
ANSWERED: frozenset[str] = frozenset({"separated", "precise", "nothing", "measured"})
# Statuses of a job whose forks ran as asked (its answer is what they showed); any other
# status is a failed or stopped job, which answers nothing.
RAN: frozenset[str] = frozenset({"complete", "budget_exhausted"})


class Answer(BaseModel):
    """A job's claim about its re-drawn steps. Every re-drawn step is in exactly one of
    `examined` (its blame measured), `cleared` (shown not to matter by the job's own rule)
    and `unexamined` (neither: `never` reached, `found` to make choices and not measured, or
    re-drawn too few times to clear); a negative verdict ("no step to blame") is made only
    for an answered kind with nothing unexamined."""

    model_config = ConfigDict(frozen=True, extra="allow")

    kind: AnswerKind
    # What the steps' numbers are: phi (the held game) or flip_rate (the uniform scheme).
    measure: Literal["phi", "flip_rate"] = "phi"
    steps: list[int] = Field(default_factory=list)
    top: list[int] = Field(default_factory=list)  # a separated or precise verdict's top
    examined: list[int] = Field(default_factory=list)
    cleared: list[int] = Field(default_factory=list)
    unexamined: list[int] = Field(default_factory=list)
    never: list[int] = Field(default_factory=list)
    found: list[int] = Field(default_factory=list)
    # About how many more forks would examine the unexamined steps (at the rate so far, and
    # never fewer than the screen forks that would clear them), and the options that go on
    # from here; None when not projected.
    more_forks: int | None = None
    go_on: str | None = None
    # What the provider does with a recorded draw's seed (`ProviderDraws`): coupled (the
    # simulated provider's common random numbers: the held game exactly), replays (an
    # identical request only), fresh (never) or unknown; None in files written before.
    provider_draws: Literal["coupled", "replays", "fresh", "unknown"] | None = None
    # Off the coupled simulator: whether a held step that chose kept its decision as an
    # estimated maximal coupling would once its request changed ("estimated") or drew live
    # ("off"); None where the provider couples, or in files written before.
    coupling: Literal["estimated", "off"] | None = None

    @property
    def coupled(self) -> bool:
        """Whether the held game was computed as defined (or the file does not say)."""
        return self.provider_draws in (None, "coupled")

    @property
    def answered(self) -> bool:
        """Whether the job answered its question: a separated top, precise intervals, every
        step cleared, or (a comparison scheme) an effect shown."""
        return self.kind in ANSWERED

    def unexamined_text(self) -> str:
        """`unexamined` in words: 'steps 4-13 never examined and step 2 found to make choices
        but not measured'."""
        never, found = set(self.never), set(self.found)
        short = [k for k in self.unexamined if k not in never and k not in found]
        parts = []
        if self.never:
            parts.append(f"{steps_text(self.never)} never examined")
        if self.found:
            parts.append(f"{steps_text(self.found)} found to make choices but not measured")
        if short:
            parts.append(f"{steps_text(short)} re-drawn too few times to clear")
        return and_text(parts)

    def going_on(self) -> str:
        """'; about N more forks would examine what is left (OPTIONS)', or ''."""
        if self.more_forks is None or self.go_on is None:
            return ""
        forks = "fork" if self.more_forks == 1 else "forks"
        return f"; about {self.more_forks} more {forks} would examine what is left ({self.go_on})"


def and_text(parts: Sequence[str]) -> str:
    """'a', 'a and b', 'a, b and c'."""
    if len(parts) <= 1:
        return "".join(parts)
    return f"{', '.join(parts[:-1])} and {parts[-1]}"


def steps_text(steps: Iterable[int]) -> str:
    """Steps in words, runs joined: [0, 1, 2, 5] -> 'steps 0-2 and 5'; [3] -> 'step 3'."""
    ordered = sorted(set(steps))
    runs: list[tuple[int, int]] = []
    for k in ordered:
        if runs and k == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], k)
        else:
            runs.append((k, k))
    shown: list[str] = []
    for a, b in runs:
        shown += [f"{a}-{b}"] if b > a + 1 else [str(k) for k in range(a, b + 1)]
    return f"{'step' if len(ordered) == 1 else 'steps'} {and_text(shown)}"


def legacy_answer(status: str | None, notes: Sequence[str]) -> Answer | None:
    """What a job.json written before answers were kept says, from its status and notes: a
    job whose budget ended is a lead if its held Shapley's note says the budget ended before
    the top separated, and unanswered otherwise; None for a job that ended otherwise (its
    line is judged by its rows, as it was then)."""
    if status != "budget_exhausted":
        return None
    lead = any(n.startswith("shapley:") and "budget ended" in n for n in notes)
    return Answer(kind="lead" if lead else "unanswered")
