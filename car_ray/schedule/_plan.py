"""A job's plan: the explicit list of stages it runs, built from the job file."""

from __future__ import annotations

from ._context import JobContext
from .stages import HeldArms, HeldControl, HeldScreen, ProviderDraws, Stage, Uniform


def plan_of(ctx: JobContext) -> list[Stage]:
    """The job's stages, in order. Against any provider but the coupled simulated one, first
    what it does with a recorded draw's seed (`ProviderDraws`). Method `auto` (the held
    mechanism): the negative control, the other arms (with a seed-honouring provider each is
    one exact fork, and Shapley may spend whatever the budget has left), then the screen,
    which hands over to the Shapley stage (`Next`). Method `uniform`: every arm
    `forks_per_step` times."""
    first: list[Stage] = [] if ctx.honours_seed else [ProviderDraws(ctx)]
    if ctx.spec.method == "auto":
        return [*first, HeldControl(ctx), HeldArms(ctx), HeldScreen(ctx)]
    return [*first, Uniform(ctx)]
