"""A job's plan: the explicit list of stages it runs, built from the job file."""

from __future__ import annotations

from ._context import JobContext
from .stages import HeldArms, HeldControl, HeldScreen, Stage, Uniform


def plan_of(ctx: JobContext) -> list[Stage]:
    """The job's stages, in order. Method `auto` (the held mechanism): the negative control,
    the other arms (with a seed-honouring provider each is one exact fork, and Shapley may
    spend whatever the budget has left), then the screen, which hands over to the Shapley
    stage (`Next`). Method `uniform`: every arm `forks_per_step` times."""
    if ctx.spec.method == "auto":
        return [HeldControl(ctx), HeldArms(ctx), HeldScreen(ctx)]
    return [Uniform(ctx)]
