"""What a job's forks let it claim, as data (`Answer`): the verdict line, `show`, the report,
job.json, batch summaries and the exit status all read it, never the text of a note."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# separated: a top cause shown apart from every other step at the job's confidence.
# precise: every step's blame within the job's target half-width (a top only where shown > 0).
# nothing: every step cleared: none was seen to make a choice that could change the outcome.
# lead: the budget ended with a leader whose blame is shown, not separated from the others.
# unanswered: the budget ended before any blame was shown and before every step was cleared.
# measured: a comparison scheme (uniform, flip, shapley): flip-rates or phi, no stopping rule;
#   `cleared` holds the steps whose flip-rate is shown within the target.
AnswerKind = Literal["separated", "precise", "nothing", "lead", "unanswered", "measured"]
ANSWERED: frozenset[str] = frozenset({"separated", "precise", "nothing"})


class Answer(BaseModel):
    """A job's claim about its re-drawn steps. Every re-drawn step is in exactly one of
    `examined` (its blame was measured), `cleared` (shown not to matter at the job's
    confidence, its blame measured or not) and `unexamined` (neither); a negative verdict
    ("no step to blame") is made only when `unexamined` is empty and no blame was shown."""

    model_config = ConfigDict(frozen=True, extra="allow")

    kind: AnswerKind
    steps: list[int] = Field(default_factory=list)
    examined: list[int] = Field(default_factory=list)
    cleared: list[int] = Field(default_factory=list)
    unexamined: list[int] = Field(default_factory=list)
    # Of `unexamined`: no fork re-drew them and stayed on the tape up to them, nor found them.
    never: list[int] = Field(default_factory=list)
    # About how many more forks would answer (or examine what is left), at the rate so far,
    # and the options that go on from here; None when not known.
    more_forks: int | None = None
    go_on: str | None = None

    @property
    def answered(self) -> bool:
        """Whether the job answered its question: a separated top, precise intervals, or
        every step cleared."""
        return self.kind in ANSWERED

    def unexamined_text(self) -> str:
        """`unexamined` in words, never-examined steps named as such."""
        never = set(self.never)
        rest = [k for k in self.unexamined if k not in never]
        parts = []
        if self.never:
            parts.append(f"{steps_text(self.never)} never examined")
        if rest:
            parts.append(f"{steps_text(rest)} examined too little to clear")
        return ", ".join(parts)

    def going_on(self) -> str:
        """'; about N more forks would ... (OPTIONS)', or '' when not projected."""
        if self.more_forks is None or self.go_on is None:
            return ""
        return f"; about {self.more_forks} more forks would examine them ({self.go_on})"


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
    label = "step" if len(ordered) == 1 else "steps"
    if len(shown) <= 1:
        return f"{label} {''.join(shown)}"
    return f"{label} {', '.join(shown[:-1])} and {shown[-1]}"


def legacy_answer(status: str | None, notes: Sequence[str]) -> Answer | None:
    """What a job.json written before answers were kept says, from its status and notes: a
    held Shapley whose budget ended before its top separated is a lead (or unanswered, if no
    blame was shown); None when the notes say nothing of it."""
    if status == "budget_exhausted" and any(
        n.startswith("shapley:") and "budget ended" in n for n in notes
    ):
        return Answer(kind="lead")
    return None
