"""The one budget ledger: reserve a fork's estimated cost before it runs, settle it after.

Invariant: ``spent + reserved`` never exceeds any cap, whatever the order of reservations,
results, retries and lost attempts, as long as no fork spends more than it reserved (the
executor's per-fork `SpendLimit` is the reservation). A fork that does is reported loudly
(`ReservationExceeded`) rather than hidden.

USD is kept in whole nano-dollars (amounts are rounded to the nearest 1e-9 USD) so that the
ledger is exact: floating-point sums of many small costs drift, and a drifting ledger could
let ``spent + reserved`` creep past a cap by an ulp or refuse a fork that fits exactly. A
token costs at least ~1e-8 USD, so the rounding is far below anything a price can express.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from ._tuning import DEFAULT_FORKS_PER_STEP, DEFAULT_MAX_FORKS

NANO_PER_USD = 1_000_000_000

CapName = Literal["max_forks", "max_usd", "max_tokens", "max_wall_s"]
_DIMS: tuple[CapName, CapName, CapName] = ("max_forks", "max_usd", "max_tokens")


@dataclass(frozen=True)
class Cost:
    """What a fork costs (or may cost): forks, dollars and tokens, added and subtracted as a
    vector."""

    forks: int = 0
    usd: float = 0.0
    tokens: int = 0

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.forks + other.forks, self.usd + other.usd, self.tokens + other.tokens)

    def __sub__(self, other: Cost) -> Cost:
        return Cost(self.forks - other.forks, self.usd - other.usd, self.tokens - other.tokens)

    def as_dict(self) -> dict[str, float | int]:
        return {"forks": self.forks, "usd": self.usd, "tokens": self.tokens}


@dataclass(frozen=True)
class Budget:
    """Caps on a job's spend; None means no cap on that dimension."""

    max_forks: int | None = None
    max_usd: float | None = None
    max_tokens: int | None = None
    max_wall_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("max_forks", "max_usd", "max_tokens", "max_wall_s"):
            value = getattr(self, name)
            if value is not None and not (value >= 0 and math.isfinite(value)):
                raise ValueError(
                    f"budget {name} must be a finite number >= 0 or unset; got {value!r}"
                )

    def as_dict(self) -> dict[str, float | int | None]:
        return {
            "max_forks": self.max_forks,
            "max_usd": self.max_usd,
            "max_tokens": self.max_tokens,
            "max_wall_s": self.max_wall_s,
        }


@dataclass(frozen=True)
class Headroom:
    """What is left under each cap after spent and reserved (None: that dimension has no cap)."""

    forks: int | None
    usd: float | None
    tokens: int | None
    wall_s: float | None


class BudgetError(ValueError):
    """The ledger was used against its contract (unknown or reused key, negative cost)."""


class ReservationExceeded(BudgetError):
    """A fork reported spending more than it reserved: the executor's per-fork limit failed.
    The ledger has already recorded the true spend when this is raised."""


# The ledger's internal unit: (forks, nano-USD, tokens) as exact integers.
_Vec = tuple[int, int, int]


def _to_nano(usd: float) -> int:
    return round(usd * NANO_PER_USD)


def _vec(cost: Cost, what: str) -> _Vec:
    if not (
        math.isfinite(cost.usd)
        and cost.forks == int(cost.forks)
        and cost.tokens == int(cost.tokens)
    ):
        raise BudgetError(f"{what} must be whole forks and tokens and finite dollars; got {cost}")
    vec = (int(cost.forks), _to_nano(cost.usd), int(cost.tokens))
    if min(vec) < 0:
        raise BudgetError(f"{what} must not be negative; got {cost}")
    return vec


def _cost(vec: _Vec) -> Cost:
    return Cost(vec[0], vec[1] / NANO_PER_USD, vec[2])


class BudgetGovernor:
    """Reserves each fork's estimated cost before it is submitted and settles it with the real
    cost after, so that spent + reserved stays within every cap (retries and lost attempts
    included). Each attempt has its own key (e.g. ``f"{task_id}#{attempt}"``); keys are never
    reused. O(1) per call; not thread-safe (one driver thread owns it)."""

    def __init__(
        self,
        budget: Budget,
        *,
        already_spent: Cost = Cost(),
        already_elapsed_s: float = 0.0,
        carried: Cost = Cost(),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # A resumed job may carry more spend than a (new, lower) cap: it is then exhausted
        # from the start and ends cleanly, rather than refusing to start.
        self.budget = budget
        self._clock = clock
        self._started = clock() - already_elapsed_s
        self._caps: tuple[int | None, int | None, int | None] = (
            budget.max_forks,
            None if budget.max_usd is None else _to_nano(budget.max_usd),
            budget.max_tokens,
        )
        self._spent: list[int] = list(_vec(already_spent, "already_spent"))
        self._reserved = [0, 0, 0]
        self._open: dict[str, _Vec] = {}
        self._closed: dict[str, str] = {}  # key -> "settled" | "lost", for clear errors
        self._lost = 0
        self._refused: str | None = None
        # Reservations an earlier run of the job left open (it died with forks in flight):
        # they may have been spent, so they count against the caps, but they are shown apart
        # from what was really spent.
        self._carried: _Vec = _vec(carried, "carried")
        self._stopped: str | None = None
        # (reserved, settled) of every settled fork that spent something: how close the
        # reservations are to the truth.
        self._settled_pairs: list[tuple[_Vec, _Vec]] = []

    # -- the ledger ---------------------------------------------------------------------------

    def stop(self, reason: str) -> None:
        """Refuse every reservation from now on (`reason` says why, e.g. an interrupt); forks
        in flight still settle."""
        self._stopped = reason

    def refusal(self, estimate: Cost) -> str | None:
        """Why `estimate` would not fit now (a sentence naming the cap), or None if it fits."""
        vec = _vec(estimate, "a fork's estimated cost")
        return self._refusal(vec)

    def try_reserve(self, key: str, estimate: Cost) -> bool:
        """Reserve `estimate` under `key` if spent + reserved + estimate stays within every cap
        and wall time is left; otherwise change nothing and return False."""
        if key in self._open or key in self._closed:
            state = "in flight" if key in self._open else self._closed[key]
            raise BudgetError(
                f"budget key {key!r} is already used ({state}): give each attempt its own key, "
                f"e.g. f'{{task_id}}#{{attempt}}'"
            )
        vec = _vec(estimate, f"estimated cost of {key!r}")
        why = self._refusal(vec)
        self._refused = why
        if why is not None:
            return False
        self._open[key] = vec
        for d in range(3):
            self._reserved[d] += vec[d]
        return True

    def settle(self, key: str, actual: Cost) -> None:
        """The fork under `key` finished: release its reservation and add `actual` to spent.

        `actual` may not exceed the reservation in any dimension (the executor stops a fork
        at its reservation). If it does, the true spend is still recorded (the ledger never
        under-reports money) and `ReservationExceeded` is raised."""
        reserved = self._close(key, "settled")
        vec = _vec(actual, f"actual cost of {key!r}")
        if vec[1] > 0 or vec[2] > 0:
            self._settled_pairs.append((reserved, vec))
        for d in range(3):
            self._reserved[d] -= reserved[d]
            self._spent[d] += vec[d]
        over = [
            f"{name} {_fmt(d, vec[d])} > reserved {_fmt(d, reserved[d])}"
            for d, name in enumerate(("forks", "usd", "tokens"))
            if vec[d] > reserved[d]
        ]
        if over:
            raise ReservationExceeded(
                f"fork {key!r} spent more than it reserved ({'; '.join(over)}): the executor "
                "must stop a fork at its reservation (SpendLimit). The overshoot is recorded "
                "as spent; caps may now be exceeded."
            )

    def release(self, key: str) -> None:
        """The attempt under `key` never started (another ledger refused it): its reservation
        is free again, nothing spent, and `key` may be reserved again."""
        reserved = self._close(key, "released")
        del self._closed[key]
        for d in range(3):
            self._reserved[d] -= reserved[d]

    def lose(self, key: str) -> None:
        """The attempt under `key` died without a result: count its whole reservation as spent
        (it may have spent it before dying)."""
        reserved = self._close(key, "lost")
        for d in range(3):
            self._reserved[d] -= reserved[d]
            self._spent[d] += reserved[d]
        self._lost += 1

    # -- what the scheduler reads -------------------------------------------------------------

    @property
    def spent(self) -> Cost:
        return _cost((self._spent[0], self._spent[1], self._spent[2]))

    @property
    def reserved(self) -> Cost:
        return _cost((self._reserved[0], self._reserved[1], self._reserved[2]))

    @property
    def carried(self) -> Cost:
        """Reservations carried over from an earlier run's forks that never reported."""
        return _cost(self._carried)

    @property
    def in_flight(self) -> int:
        """Reservations not yet settled or lost."""
        return len(self._open)

    @property
    def elapsed_s(self) -> float:
        return self._clock() - self._started

    def remaining(self) -> Headroom:
        """What a new reservation could still use under each cap (never negative)."""
        used = [self._spent[d] + self._reserved[d] + self._carried[d] for d in range(3)]
        left = [None if cap is None else max(0, cap - used[d]) for d, cap in enumerate(self._caps)]
        wall = self.budget.max_wall_s
        return Headroom(
            forks=left[0],
            usd=None if left[1] is None else left[1] / NANO_PER_USD,
            tokens=left[2],
            wall_s=None if wall is None else max(0.0, wall - self.elapsed_s),
        )

    @property
    def exhausted(self) -> CapName | None:
        """The cap that leaves no room for anything now (counting reservations in flight), or
        None. Room can come back as forks settle below their estimates; a job is out of budget
        when this is set and nothing is in flight, or when `try_reserve` keeps refusing."""
        if self._wall_up():
            return "max_wall_s"
        for d, name in enumerate(_DIMS):
            cap = self._caps[d]
            if cap is not None and self._spent[d] + self._reserved[d] + self._carried[d] >= cap:
                return name
        return None

    def go_on(self, more: int) -> tuple[str, str]:
        """The options that let the same job go on for `more` forks beyond what it spent
        (and carried), '--max-forks 260 --max-usd 0.52'; and, when it ended on a cap those
        do not raise, which to raise in the job file (else '')."""
        spent, carried = self.spent, self.carried
        options = f"--max-forks {spent.forks + carried.forks + more}"
        if self.budget.max_usd is not None and spent.usd > 0:
            usd = spent.usd + carried.usd + more * spent.usd / max(1, spent.forks)
            options += f" --max-usd {usd:.4g}"
        ended = self.exhausted
        also = (
            f"it ended on its {ended}: raise that in the job file too"
            if ended not in (None, "max_forks", "max_usd")
            else ""
        )
        return options, also

    @property
    def last_refusal(self) -> str | None:
        """Why the last `try_reserve` was refused (None if it succeeded)."""
        return self._refused

    def snapshot(self) -> dict[str, Any]:
        """The ledger as plain JSON-ready data, for job.json and progress displays."""
        left = self.remaining()
        return {
            "caps": self.budget.as_dict(),
            "spent": self.spent.as_dict(),
            "reserved": self.reserved.as_dict(),
            "carried": self.carried.as_dict(),
            # Open reservations by key: a successor counts only those whose fork left no row.
            "open": {key: _cost(vec).as_dict() for key, vec in self._open.items()},
            "remaining": {
                "forks": left.forks,
                "usd": left.usd,
                "tokens": left.tokens,
                "wall_s": left.wall_s,
            },
            "in_flight": self.in_flight,
            "settled": sum(1 for v in self._closed.values() if v == "settled"),
            "lost": self._lost,
            "elapsed_s": self.elapsed_s,
            "exhausted": self.exhausted,
            "reservations": self.reservation_report(),
        }

    def reservation_report(self) -> dict[str, Any]:
        """Reserved against settled, over the settled forks that spent anything: totals and
        the median per-fork ratio (in dollars when forks cost dollars, else in tokens)."""
        pairs = self._settled_pairs
        d = 1 if any(actual[1] for _, actual in pairs) else 2
        ratios = sorted(r[d] / a[d] for r, a in pairs if a[d] > 0)
        median = None
        if ratios:
            mid = len(ratios) // 2
            median = ratios[mid] if len(ratios) % 2 else (ratios[mid - 1] + ratios[mid]) / 2
        return {
            "forks": len(pairs),
            "reserved": _cost(
                (0, sum(r[1] for r, _ in pairs), sum(r[2] for r, _ in pairs))
            ).as_dict(),
            "settled": _cost(
                (0, sum(a[1] for _, a in pairs), sum(a[2] for _, a in pairs))
            ).as_dict(),
            "median_ratio": median,
            "ratio_of": "usd" if d == 1 else "tokens",
        }

    # -- internals ----------------------------------------------------------------------------

    def _wall_up(self) -> bool:
        wall = self.budget.max_wall_s
        return wall is not None and self.elapsed_s >= wall

    def _refusal(self, vec: _Vec) -> str | None:
        if self._stopped is not None:
            return self._stopped
        if self._wall_up():
            return f"max_wall_s: {self.budget.max_wall_s} s of wall time are used up"
        for d, name in enumerate(_DIMS):
            cap = self._caps[d]
            used = self._spent[d] + self._reserved[d] + self._carried[d]
            if cap is not None and used + vec[d] > cap:
                carried = f" + carried {_fmt(d, self._carried[d])}" if self._carried[d] else ""
                return (
                    f"{name}: spent {_fmt(d, self._spent[d])} + reserved "
                    f"{_fmt(d, self._reserved[d])}{carried} + this fork's {_fmt(d, vec[d])} "
                    f"would exceed the cap {_fmt(d, cap)}"
                )
        return None

    def _close(self, key: str, how: str) -> _Vec:
        vec = self._open.pop(key, None)
        if vec is None:
            if key in self._closed:
                raise BudgetError(f"budget key {key!r} was already {self._closed[key]}")
            raise BudgetError(f"budget key {key!r} was never reserved (try_reserve first)")
        self._closed[key] = how
        return vec


def _fmt(dim: int, value: int) -> str:
    return f"${value / NANO_PER_USD:.9g}" if dim == 1 else str(value)


def effective_budget(budget: Budget, steps: int | None = None) -> Budget:
    """The caps a job runs under: a job that sets none gets DEFAULT_FORKS_PER_STEP forks a
    step of its tape (DEFAULT_MAX_FORKS when the tape is not known): a job never runs
    unbounded."""
    if all(v is None for v in (budget.max_forks, budget.max_usd, budget.max_tokens)):
        return Budget(
            max_forks=DEFAULT_MAX_FORKS
            if steps is None
            else min(DEFAULT_MAX_FORKS, DEFAULT_FORKS_PER_STEP * max(1, steps)),
            max_usd=budget.max_usd,
            max_tokens=budget.max_tokens,
            max_wall_s=budget.max_wall_s,
        )
    return budget
