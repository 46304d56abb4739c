"""A job's notes as data (`Note`): what a stage or the run found worth saying, with a kind and a
severity that the CLI, the report, job.json and batch summaries read, and the figures behind
its text. Nothing reads a note by searching its text."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Severity = Literal["info", "warning", "error"]

# The kinds a job writes, by what said it:
#   verify_failed, control_failed, failed (most forks unscored), gave_up (a fork's provider
#   kept failing), provider_errors, overspent: the run; screen, screen_strays, shapley,
#   shapley_late, more, groups, groups_on: the held stages; nothing_measured, interrupted,
#   constant_scorer, carried, partial: the job as `car-ray attribute` ran it; provider_draws:
#   what the provider does with a recorded draw's seed (a job not on the coupled simulator);
#   note: a job.json written before notes had kinds.
NoteKind = str


class Note(BaseModel):
    """One note of a job: its kind, its severity (`error` for what makes the job's answer
    void or its status a failure, `warning` for what a user should check, `info` else), its
    text as the user reads it, and the figures that text states."""

    model_config = ConfigDict(frozen=True, extra="allow")

    kind: NoteKind
    severity: Severity = "info"
    text: str
    figures: dict[str, Any] = Field(default_factory=dict)

    def __str__(self) -> str:
        return self.text

    @classmethod
    def legacy(cls, text: str) -> Note:
        """A note of a job.json written before notes had kinds (a line of text): its severity
        as the CLI of that time coloured it, the one place a note's text is read."""
        loud = "FAILED" in text or "divergence" in text or text.startswith(("NOTHING", "WARN"))
        return cls(kind="note", severity="error" if loud else "info", text=text)


def texts(notes: list[Note]) -> list[str]:
    """The notes' texts, in order."""
    return [n.text for n in notes]
