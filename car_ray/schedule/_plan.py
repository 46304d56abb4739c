"""A job's plan: the explicit list of stages it runs, built from the job file."""

from __future__ import annotations

from ._context import JobContext
from .stages import HeldArms, HeldControl, HeldScreen, ProviderDraws, Stage, Uniform


def plan_of(ctx: JobContext) -> list[Stage]:
    """The job's stages, in order. Against any provider but the coupled simulated one, first
    what it does with a recorded draw's seed (`ProviderDraws`). Method `auto` (the held
    mechanism): the negative control, the other arms (with a seed-honouring provider each is
    one exact fork, and Shapley may spend whatever the budget has left), then the screen,
    which hands over to the Shapley stage (`Next`); off the coupled provider the arms run
    when the screen hands over, having looked for every step that chooses, so that they keep
    those steps' decisions. Method `uniform`: every arm `forks_per_step` times."""
    first: list[Stage] = [] if ctx.honours_seed else [ProviderDraws(ctx)]
    if ctx.spec.method != "auto":
        return [*first, Uniform(ctx)]
    if ctx.honours_seed:
        return [HeldControl(ctx), HeldArms(ctx), HeldScreen(ctx)]
    # An arm's forks keep the decisions of the steps the screen has seen choose (`Seeds.
    # couple`, fixed at a fork's seed): they wait for the screen, which looks for every one
    # of them first.
    return [*first, HeldControl(ctx), HeldScreen(ctx, arms=HeldArms(ctx))]
