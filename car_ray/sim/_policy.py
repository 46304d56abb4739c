"""Scenario policies: the simulated model, as an explicit distribution over actions."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

from car_ray._imports import import_ref
from car_ray.providers import Action, ChatRequest

Distribution = tuple[tuple[float, Action], ...]

_SUM_TOLERANCE = 1e-9


class PolicyError(ValueError):
    """A scenario policy that broke its contract (a bad distribution, or not a policy at all)."""


@runtime_checkable
class ScenarioPolicy(Protocol):
    """A simulated model: given a request, the exact probability of each action it may take.

    Because the distribution is explicit, ground truth (flip-rates, Shapley values) can be
    computed by enumerating branches instead of sampling.
    """

    def distribution(self, request: ChatRequest) -> Sequence[tuple[float, Action]]: ...


def policy_name(policy: object) -> str:
    """How errors name a policy: its class, qualified by module."""
    kind = type(policy)
    return f"{kind.__module__}.{kind.__qualname__}"


def distribution_of(policy: ScenarioPolicy, request: ChatRequest) -> Distribution:
    """The policy's distribution for `request`, checked: actions, probabilities >= 0, sum 1."""
    name = policy_name(policy)
    entries = tuple(policy.distribution(request))
    if not entries:
        raise PolicyError(f"policy {name} returned an empty distribution")
    total = 0.0
    for i, entry in enumerate(entries):
        if not (isinstance(entry, tuple) and len(entry) == 2):
            raise PolicyError(f"policy {name}: entry {i} is {entry!r}, not (probability, Action)")
        probability, action = entry
        if not isinstance(action, Action):
            raise PolicyError(f"policy {name}: entry {i} holds {action!r}, not an Action")
        if not (isinstance(probability, int | float) and math.isfinite(probability)):
            raise PolicyError(f"policy {name}: entry {i} probability {probability!r} not a number")
        if probability < 0:
            raise PolicyError(f"policy {name}: entry {i} has negative probability {probability}")
        total += probability
    if abs(total - 1.0) > _SUM_TOLERANCE:
        raise PolicyError(
            f"policy {name}: probabilities sum to {total!r}, not 1 (tolerance {_SUM_TOLERANCE}); "
            f"actions: {[a.describe() for _, a in entries]}"
        )
    return tuple((float(p), a) for p, a in entries)


def draw(distribution: Sequence[tuple[float, Action]], u: float) -> Action:
    """The action at `u` on the distribution's CDF (inverse-CDF sampling, entries in order)."""
    if not 0.0 <= u < 1.0:
        raise ValueError(f"u must lie in [0, 1), got {u!r}")
    if not distribution:
        raise ValueError("cannot draw from an empty distribution")
    cumulative = 0.0
    for probability, action in distribution:
        cumulative += probability
        if u < cumulative:
            return action
    # Rounding can leave the total a hair under u: the mass belongs to the last possible action.
    return next(a for p, a in reversed(distribution) if p > 0)


def uniform_for_seed(seed: int) -> float:
    """A uniform number in [0, 1) that depends on the seed only (common random numbers)."""
    digest = hashlib.sha256(f"car-ray/sim/{seed}".encode()).digest()
    # 53 bits: every value is an exact double below 1.
    return (int.from_bytes(digest[:8], "big") >> 11) / float(1 << 53)


def load_policy(ref: str, search_path: Sequence[Path] = ()) -> ScenarioPolicy:
    """Import the policy `module:attr`: an instance, or a class or factory called with no args."""
    target = import_ref(ref, "scenario policy", tuple(search_path))
    if isinstance(target, type) or (callable(target) and not isinstance(target, ScenarioPolicy)):
        try:
            target = target()
        except TypeError as exc:
            raise PolicyError(
                f"scenario policy {ref!r} is a class or factory that cannot be called with no "
                f"arguments ({exc}): name an instance instead, or give it defaults"
            ) from exc
    if not isinstance(target, ScenarioPolicy):
        raise PolicyError(
            f"scenario policy {ref!r} is a {type(target).__name__}: it needs a method "
            "distribution(request) -> [(probability, Action), ...]"
        )
    return target
