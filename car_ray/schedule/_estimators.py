"""Statistics for the attribution runner: confidence sequences for flip-rates, a best-arm race
over steps, and Shapley blame over coalitions of steps with noisy (Bernoulli) values.

Every estimator here takes outcomes one fork at a time (`update`) and says where the next
forks should go (`next_arms`, `next_coalitions`), so the scheduler can keep a window of forks
in flight and stop whenever the budget ends, with intervals that stay honest.
"""

from __future__ import annotations

import functools
import heapq
import math
from collections import deque
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, Literal, Protocol, TypeVar

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components
from scipy.special import betaln, expit, stdtrit
from scipy.stats import norm

A = TypeVar("A", bound=Hashable)
P = TypeVar("P", bound=Hashable)
FloatArray = NDArray[np.float64]

# Newton steps for the confidence-sequence bounds: from the Pinsker start they reach the root
# to ~1e-14 within 6 to 8 steps for n up to 1e6 and alpha down to 1e-6 (checked in the tests).
_NEWTON_STEPS = 10


def _check_alpha(alpha: float) -> None:
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1) (1 - confidence); got {alpha!r}")


@functools.lru_cache(maxsize=64)
def _z(alpha: float) -> float:
    return float(norm.ppf(1.0 - alpha / 2.0))


def _t(alpha: float, clusters: FloatArray) -> FloatArray:
    """Two-sided Student-t critical values with clusters - 1 degrees of freedom, the usual
    reference for a cluster-robust standard error; infinite below two (effective) clusters:
    one cluster says nothing about the spread between clusters."""
    df = np.asarray(clusters, dtype=np.float64) - 1.0
    ok = df >= 1.0
    crit = stdtrit(np.where(ok, df, 1.0), 1.0 - alpha / 2.0)
    return np.where(ok, crit, np.inf)


# -- confidence sequences and intervals -------------------------------------------------------


def confidence_sequences(
    successes: ArrayLike, n: ArrayLike, alpha: float
) -> tuple[FloatArray, FloatArray]:
    """Vectorised `confidence_sequence`: bounds for arrays of (successes, n) pairs."""
    _check_alpha(alpha)
    s = np.asarray(successes, dtype=np.float64).ravel()
    m = np.asarray(n, dtype=np.float64).ravel()
    s, m = np.broadcast_arrays(s, m)
    if np.any(m < 0) or np.any(s < 0) or np.any(s > m) or not np.all(np.isfinite(s)):
        raise ValueError("confidence sequence needs 0 <= successes <= n")
    k = s.size
    # The lower bound for (s, n) is 1 - the upper bound for (n - s, n): solve both at once.
    s2 = np.concatenate([s, m - s])
    n2 = np.concatenate([m, m])
    f2 = n2 - s2
    top = f2 == 0  # p_hat == 1 (or no data): the upper bound is 1
    n_safe = np.where(n2 == 0, 1.0, n2)
    p_hat = np.where(top, 0.5, s2 / n_safe)
    # The set is {p : log-likelihood(p) > c}, with c = log(alpha * mixture likelihood).
    c = betaln(s2 + 1.0, f2 + 1.0) + math.log(alpha)
    with np.errstate(divide="ignore", invalid="ignore"):
        ll_hat = np.where(s2 > 0, s2 * np.log(p_hat), 0.0) + f2 * np.log1p(-p_hat)
    # Start outside the set: Pinsker (KL >= 2 d^2) puts the root within sqrt(r / 2) of p_hat.
    r = np.maximum(ll_hat - c, 0.0) / n_safe
    p0 = np.minimum(p_hat + np.sqrt(r / 2.0), 1.0 - 1e-12)
    # In log-odds u the log-likelihood s u - n log(1 + e^u) is concave on the whole line, so
    # Newton from outside (right of the root) moves monotonically to it and never crosses:
    # the bound is approached from outside, so the interval is never too narrow (up to
    # rounding).
    u = np.log(p0) - np.log1p(-p0)
    slope_if_top = -1.0  # any non-zero slope: those entries are overwritten below
    for _ in range(_NEWTON_STEPS):
        g = s2 * u - n2 * np.logaddexp(0.0, u) - c
        dg = s2 - n2 * expit(u)
        u = u - g / np.where(top, slope_if_top, dg)
    # 1 - expit(u) = expit(-u): the mirrored lower bound keeps full precision near 0.
    upper = np.where(top[:k], 1.0, expit(u[:k]))
    lower = np.where(top[k:], 0.0, expit(-u[k:]))
    return np.clip(lower, 0.0, 1.0), np.clip(upper, 0.0, 1.0)


def confidence_sequence(successes: float, n: int, alpha: float) -> tuple[float, float]:
    """A (1 - alpha) confidence sequence for a Bernoulli (or [0, 1]-valued) mean: with
    probability >= 1 - alpha the true mean lies in the interval at EVERY n simultaneously, so
    it stays valid when forks are allocated and stopped adaptively.

    It is the uniform-prior (beta-binomial) mixture martingale of Robbins (1970), as presented
    in Howard, Ramdas, McAuliffe & Sekhon (2021), "Time-uniform, nonparametric, nonasymptotic
    confidence sequences", Ann. Statist. 49(2) (conjugate beta-binomial mixture for
    sub-Bernoulli observations): the interval is {p : (n + 1) * C(n, s) * p^s (1 - p)^(n - s)
    > alpha}. Ville's inequality makes it time-uniform; [0, 1]-valued observations are
    sub-Bernoulli, so fractional `successes` are valid too. The interval is always inside
    [0, 1] and (0, 1) when n == 0.
    """
    lo, hi = confidence_sequences([successes], [n], alpha)
    return float(lo[0]), float(hi[0])


def wilson(successes: float, n: int, alpha: float) -> tuple[float, float]:
    """The Wilson score interval for a Bernoulli mean at a fixed n (for reporting, not for
    adaptive stopping); (0, 1) when n == 0."""
    _check_alpha(alpha)
    if not 0 <= successes <= n:
        raise ValueError(f"wilson needs 0 <= successes <= n; got {successes} of {n}")
    if n == 0:
        return 0.0, 1.0
    z = _z(alpha)
    p = successes / n
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


# -- the race: which step is the top cause ----------------------------------------------------

Verdict = Literal["separated", "precise"]


class Race(Generic[A]):
    """Best-arm identification over arms (steps) with [0, 1] observations (flipped or not).

    Each arm's interval is a confidence sequence at alpha / (number of arms), so with
    probability >= 1 - alpha every interval covers its arm's mean at every moment, however the
    forks were allocated: a "separated" verdict names the true top arm with probability
    >= 1 - alpha. Forks handed out by `next_arms` and not yet reported are counted as pending.
    """

    def __init__(self, arms: Iterable[A], alpha: float) -> None:
        _check_alpha(alpha)
        self.arms: tuple[A, ...] = tuple(arms)
        if not self.arms:
            raise ValueError("a race needs at least one arm")
        if len(set(self.arms)) != len(self.arms):
            raise ValueError(f"race arms must be distinct; got {list(self.arms)}")
        self.alpha = alpha
        self._index = {arm: i for i, arm in enumerate(self.arms)}
        k = len(self.arms)
        self._n = np.zeros(k, dtype=np.int64)
        self._sum = np.zeros(k)
        self._pending = np.zeros(k, dtype=np.int64)
        self._lo = np.zeros(k)
        self._hi = np.ones(k)
        self._dirty = np.zeros(k, dtype=bool)

    # -- observations -------------------------------------------------------------------------

    def update(self, arm: A, value: float) -> None:
        """Record one fork's outcome for `arm` (1.0 = flipped, 0.0 = not)."""
        i = self._arm(arm)
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"race observations are in [0, 1]; got {value!r} for arm {arm!r}")
        self._n[i] += 1
        self._sum[i] += value
        self._pending[i] = max(0, self._pending[i] - 1)
        self._dirty[i] = True

    def cancel(self, arm: A) -> None:
        """A fork handed out for `arm` will never report (lost, out of budget)."""
        i = self._arm(arm)
        self._pending[i] = max(0, self._pending[i] - 1)

    # -- what is known ------------------------------------------------------------------------

    def count(self, arm: A) -> int:
        return int(self._n[self._arm(arm)])

    def mean(self, arm: A) -> float | None:
        i = self._arm(arm)
        return float(self._sum[i] / self._n[i]) if self._n[i] else None

    def interval(self, arm: A) -> tuple[float, float]:
        """The arm's confidence sequence at the race's confidence (alpha split over arms)."""
        self._refresh()
        i = self._arm(arm)
        return float(self._lo[i]), float(self._hi[i])

    def leader(self) -> A | None:
        """The arm with the highest observed mean (None before any observation)."""
        i = self._leader()
        return None if i is None else self.arms[i]

    def done(self, target_half_width: float | None = None) -> Verdict | None:
        """The race's verdict: "separated" when the leader's lower bound is above every other
        arm's upper bound, "precise" when every arm's interval half-width is at most
        `target_half_width`, else None. One arm alone is never "separated"."""
        self._refresh()
        if np.any(self._n == 0):
            return None
        lead = self._leader()
        if lead is not None and len(self.arms) > 1:
            others = np.delete(self._hi, lead)
            if self._lo[lead] > others.max():
                return "separated"
        if target_half_width is not None and np.all(
            (self._hi - self._lo) / 2.0 <= target_half_width
        ):
            return "precise"
        return None

    # -- where the next forks go --------------------------------------------------------------

    def next_arms(self, k: int) -> list[A]:
        """Where the next `k` forks should go (LUCB, Kalyanakrishnan et al. 2012): arms never
        sampled first; then each fork goes to whichever of the leader and its strongest
        challenger (the highest upper bound among the others) has the wider interval,
        counting forks already in flight. Empty once the leader is separated."""
        out: list[A] = []
        issued = self._n + self._pending
        for i in np.flatnonzero(issued == 0):
            if len(out) == k:
                return out
            out.append(self._take(int(i)))
        lead = self._leader()
        if lead is None or len(out) == k:
            return out
        self._refresh()
        if len(self.arms) > 1 and self._lo[lead] > np.delete(self._hi, lead).max():
            return out
        while len(out) < k:
            if len(self.arms) == 1:
                out.append(self._take(lead))
                continue
            upper, half = self._projected()
            upper[lead] = -math.inf
            challenger = int(np.argmax(upper))
            out.append(self._take(lead if half[lead] >= half[challenger] else challenger))
        return out

    # -- internals ----------------------------------------------------------------------------

    def _arm(self, arm: A) -> int:
        try:
            return self._index[arm]
        except KeyError:
            raise KeyError(f"{arm!r} is not an arm of this race ({list(self.arms)})") from None

    def _take(self, i: int) -> A:
        self._pending[i] += 1
        return self.arms[i]

    def _leader(self) -> int | None:
        if not np.any(self._n > 0):
            return None
        means = np.where(self._n > 0, self._sum / np.maximum(self._n, 1), -math.inf)
        # Ties go to the better-measured arm: it is the one least likely to be a fluke.
        order = np.lexsort((-self._n, -means))
        return int(order[0])

    def _refresh(self) -> None:
        if not np.any(self._dirty):
            return
        idx = np.flatnonzero(self._dirty)
        lo, hi = confidence_sequences(self._sum[idx], self._n[idx], self.alpha / len(self.arms))
        self._lo[idx] = lo
        self._hi[idx] = hi
        self._dirty[idx] = False

    def _projected(self) -> tuple[FloatArray, FloatArray]:
        """Upper bounds and half-widths as they will be once the forks in flight report: an
        interval shrinks about like 1/sqrt(n), so one batch does not pile onto one arm."""
        self._refresh()
        n = self._n.astype(np.float64)
        sampled = n > 0
        shrink = np.sqrt(np.maximum(n, 1.0) / (np.maximum(n, 1.0) + self._pending))
        mean = np.where(sampled, self._sum / np.maximum(n, 1.0), 0.5)
        # The intervals are not symmetric about the mean (near 0 or 1): shrink each side.
        upper = np.where(sampled, mean + (self._hi - mean) * shrink, 1.0)
        half = np.where(sampled, (self._hi - self._lo) / 2.0 * shrink, 0.5 * shrink)
        return upper, half


# -- Shapley blame over coalitions of steps ---------------------------------------------------
#
# Coalitions are named by the steps they RESAMPLE: v(S) = P(bad | resample S, pin the rest).
# The game is f(T) = v(N \ T) over the steps T kept as recorded, and blame is the Shapley value
# of f: sum(phi) = f(N) - f(empty) = v(empty) - v(N); positive phi = keeping the step as
# recorded pushes toward the bad outcome.


def exact_shapley(f: Mapping[frozenset[P], float], players: Sequence[P]) -> dict[P, float]:
    """Shapley values of the game `f` (a value for every subset of `players`), exactly."""
    n = len(players)
    weight = [math.factorial(t) * math.factorial(n - t - 1) / math.factorial(n) for t in range(n)]
    phi: dict[P, float] = {}
    for i, player in enumerate(players):
        others = [p for j, p in enumerate(players) if j != i]
        total = 0.0
        for mask in range(1 << (n - 1)):
            t = frozenset(p for b, p in enumerate(others) if mask >> b & 1)
            total += weight[len(t)] * (f[t | {player}] - f[t])
        phi[player] = total
    return phi


def shapley_coefficients(n: int) -> FloatArray:
    """a[i, S] such that phi_i = sum_S a[i, S] * v(S), S a bitmask of the resampled players.

    For S containing i the coefficient is -w(n - |S|), otherwise +w(n - |S| - 1), with the
    Shapley weight w(t) = t! (n - t - 1)! / n!."""
    weight = np.array(
        [math.factorial(t) * math.factorial(n - t - 1) / math.factorial(n) for t in range(n)]
    )
    masks = np.arange(1 << n)
    size = np.array([m.bit_count() for m in range(1 << n)])
    a = np.empty((n, 1 << n))
    for i in range(n):
        member = (masks >> i) & 1 == 1
        a[i] = np.where(
            member, -weight[np.clip(n - size, 0, n - 1)], weight[np.clip(n - size - 1, 0, n - 1)]
        )
    return a


@dataclass(frozen=True)
class Estimate:
    """A point estimate with its (1 - alpha) interval and the forks behind it; `value` is None
    when nothing was measured, `se` is None when no finite standard error exists."""

    value: float | None
    low: float
    high: float
    n: int
    se: float | None = None


@dataclass(frozen=True)
class StepAttribution(Generic[P]):
    """One step's blame (phi), necessity and sufficiency, each with its interval and count."""

    step: P
    phi: Estimate
    necessity: Estimate
    sufficiency: Estimate

    def as_row(self) -> dict[str, float | int | None]:
        """Flat columns for attribution.parquet (phi, phi_lo, phi_hi, phi_se, phi_n, ...)."""
        row: dict[str, float | int | None] = {}
        for name, e in (
            ("phi", self.phi),
            ("necessity", self.necessity),
            ("sufficiency", self.sufficiency),
        ):
            row[name] = e.value
            row[f"{name}_lo"] = e.low
            row[f"{name}_hi"] = e.high
            row[f"{name}_n"] = e.n
        row["phi_se"] = self.phi.se
        return row


@dataclass(frozen=True)
class ShapleyEstimates(Generic[P]):
    """Per step attributions plus the two ends of the game: v_pinned = v(nothing resampled),
    v_resampled = v(everything resampled); `sum_check` = sum(phi) - (v_pinned - v_resampled),
    zero up to rounding for a correct estimator."""

    steps: dict[P, StepAttribution[P]]
    v_pinned: Estimate
    v_resampled: Estimate
    phi_sum: float
    sum_check: float
    forks: int
    method: Literal["exact", "kernel"]

    def rows(self) -> dict[P, dict[str, float | int | None]]:
        return {step: a.as_row() for step, a in self.steps.items()}


class ShapleyPlanner(Protocol[P]):
    """What the scheduler needs from a Shapley estimator: where the next forks go, their
    outcomes, and the estimates so far."""

    players: tuple[P, ...]

    def next_coalitions(self, k: int) -> list[frozenset[P]]: ...

    def update(self, coalition: Iterable[P], bad: float, seed: int | None = None) -> None: ...

    def cancel(self, coalition: Iterable[P]) -> None: ...

    @property
    def counts(self) -> dict[frozenset[P], int]: ...

    def estimates(self) -> ShapleyEstimates[P]: ...


class _Coalitions(Generic[P]):
    """Shared bookkeeping: players, coalition bitmasks, per-coalition outcome tallies."""

    def __init__(self, players: Iterable[P], alpha: float) -> None:
        _check_alpha(alpha)
        self.players: tuple[P, ...] = tuple(players)
        if not self.players:
            raise ValueError("Shapley values need at least one candidate step")
        if len(set(self.players)) != len(self.players):
            raise ValueError(f"candidate steps must be distinct; got {list(self.players)}")
        self.alpha = alpha
        self.n = len(self.players)
        self.full = (1 << self.n) - 1
        self._bit = {p: 1 << i for i, p in enumerate(self.players)}
        self._tally: dict[int, list[float]] = {}  # mask -> [forks, bad]
        # Forks sharing a seed share their live draws (common random numbers), so they are
        # dependent across coalitions: each seed is one cluster; a fork without one is its own.
        self._seed_cluster: dict[int, int] = {}
        self._clusters = 0

    def mask(self, coalition: Iterable[P]) -> int:
        m = 0
        for p in coalition:
            try:
                m |= self._bit[p]
            except KeyError:
                raise KeyError(
                    f"step {p!r} is not a Shapley candidate ({list(self.players)})"
                ) from None
        return m

    def coalition(self, mask: int) -> frozenset[P]:
        return frozenset(p for i, p in enumerate(self.players) if mask >> i & 1)

    def _record(self, mask: int, bad: float, seed: int | None) -> int:
        """Tally one outcome; return the cluster (seed) it belongs to."""
        if not 0.0 <= bad <= 1.0:
            raise ValueError(f"coalition outcomes are in [0, 1] (1 = bad); got {bad!r}")
        tally = self._tally.setdefault(mask, [0.0, 0.0])
        tally[0] += 1
        tally[1] += bad
        cluster = self._seed_cluster.get(seed) if seed is not None else None
        if cluster is None:
            cluster = self._clusters
            self._clusters += 1
            if seed is not None:
                self._seed_cluster[seed] = cluster
        return cluster

    @property
    def counts(self) -> dict[frozenset[P], int]:
        """Forks reported per coalition (of resampled steps)."""
        return {self.coalition(m): int(t[0]) for m, t in self._tally.items()}

    def _proportion(self, mask: int, *, complement: bool = False) -> Estimate:
        forks, bad = self._tally.get(mask, [0.0, 0.0])
        n = int(forks)
        hits = forks - bad if complement else bad
        lo, hi = wilson(hits, n, self.alpha)
        return Estimate(hits / n if n else None, lo, hi, n)

    def _assemble(
        self,
        phi: FloatArray,
        low: FloatArray,
        high: FloatArray,
        se: list[float | None],
        method: Literal["exact", "kernel"],
    ) -> ShapleyEstimates[P]:
        forks = int(sum(t[0] for t in self._tally.values()))
        steps: dict[P, StepAttribution[P]] = {}
        for i, p in enumerate(self.players):
            bit = 1 << i
            steps[p] = StepAttribution(
                step=p,
                phi=Estimate(float(phi[i]), float(low[i]), float(high[i]), forks, se[i]),
                # necessity: P(the failure disappears | resample this step alone)
                necessity=self._proportion(bit, complement=True),
                # sufficiency: P(the failure stays | pin this step alone, resample the rest)
                sufficiency=self._proportion(self.full & ~bit),
            )
        v_pinned = self._proportion(0)
        v_resampled = self._proportion(self.full)
        phi_sum = float(phi.sum())
        ends = _plug_in(v_pinned) - _plug_in(v_resampled)
        return ShapleyEstimates(
            steps, v_pinned, v_resampled, phi_sum, phi_sum - ends, forks, method
        )


def _plug_in(e: Estimate) -> float:
    # An unmeasured coalition is plugged in at 0.5, the centre of what it could be.
    return 0.5 if e.value is None else e.value


def _shrunk_variance(forks: FloatArray, bad: FloatArray) -> FloatArray:
    # Laplace-shrunk p(1 - p): a coalition seen 0/2 or 2/2 is not assumed deterministic.
    p = (bad + 1.0) / (forks + 2.0)
    return np.asarray(p * (1.0 - p), dtype=np.float64)


class _Observations:
    """Every fork's (coalition mask, cluster, outcome), in arrays that grow by doubling."""

    def __init__(self) -> None:
        self.size = 0
        self._mask = np.empty(256, dtype=np.int64)
        self._cluster = np.empty(256, dtype=np.int64)
        self._y = np.empty(256)

    def append(self, mask: int, cluster: int, y: float) -> None:
        if self.size == self._y.size:
            grown = 2 * self.size
            self._mask = np.resize(self._mask, grown)
            self._cluster = np.resize(self._cluster, grown)
            self._y = np.resize(self._y, grown)
        self._mask[self.size] = mask
        self._cluster[self.size] = cluster
        self._y[self.size] = y
        self.size += 1

    def arrays(self) -> tuple[NDArray[np.int64], NDArray[np.int64], FloatArray]:
        k = self.size
        return self._mask[:k], self._cluster[:k], self._y[:k]


class CoalitionPlanner(_Coalitions[P]):
    """Shapley blame by evaluating every coalition (2^n of them, for n <= ~10 candidates).

    phi_i = sum_S a[i, S] ybar_S is linear in the forks' outcomes. Forks go where they cut the
    summed variance most (Neyman allocation, n_S proportional to
    sqrt(sum_i a[i, S]^2 p_S (1 - p_S)), a heuristic that treats coalitions as independent),
    after `min_per_coalition` forks for every coalition.

    The reported variance does not assume independence across coalitions: forks that share a
    seed share their live draws (common random numbers), so each seed is a cluster (a fork
    without a seed is a cluster of its own) and the variance is cluster-robust (CR2, Bell &
    McCaffrey 2002, which for this cell-means design is a per-fork rescaling):

        Var(phi_i) = sum_j r_ij^2
                     + sum_S a[i, S]^2 max(0, pt_S (1 - pt_S) - s_S^2) / n_S,
        r_ij = sum_{forks (S, y) with seed j} a[i, S] (y - ybar_S) / sqrt(n_S (n_S - 1)),

    with s_S^2 the unbiased sample variance of S's forks and pt_S = (bad_S + 1) / (n_S + 2)
    (a coalition seen once has no residual and s_S^2 = 0). The first sum is CR2: exactly
    unbiased both when every fork has its own seed (it is then the unbiased heteroscedastic
    sum_S a^2 s_S^2 / n_S) and when every seed covers every coalition once (it is then
    J/(J - 1) times the CR0 sum, J the number of seeds). The second, never negative, keeps the
    Laplace-shrunk floor of the independent estimator, so 0/2 or 2/2 is never taken for a
    deterministic coalition. Without seeds the whole is sum_S a^2 max(pt (1 - pt), s^2) / n_S.

    Intervals are phi +- t SE per step, t with G* - 1 degrees of freedom, G* the effective
    number of clusters (`_effective`): when the j-th fork of every coalition has seed j, the
    first few seeds hold every coalition, so G* is about the forks per coalition, not the
    number of seeds; with a fresh seed per fork it is in the thousands (t is then the normal
    quantile within a fraction of a percent). Below two effective clusters the interval is
    [-1, 1] and the SE None. An unmeasured coalition widens the interval by everything it
    could contribute.
    """

    def __init__(self, players: Iterable[P], alpha: float, *, min_per_coalition: int = 2) -> None:
        super().__init__(players, alpha)
        if self.n > 16:
            raise ValueError(
                f"{self.n} candidates means {2**self.n} coalitions: use the KernelSHAP planner "
                "(shapley_planner picks it above exact_limit)"
            )
        if min_per_coalition < 1:
            raise ValueError(f"min_per_coalition must be >= 1; got {min_per_coalition}")
        self.min_per_coalition = min_per_coalition
        self._a = shapley_coefficients(self.n)
        self._weight = (self._a**2).sum(axis=0)  # sum_i a[i, S]^2
        self._forks = np.zeros(1 << self.n)
        self._bad = np.zeros(1 << self.n)
        self._pending = np.zeros(1 << self.n, dtype=np.int64)
        self._obs = _Observations()
        self._cached: tuple[int, FloatArray, FloatArray] | None = None  # forks, var, clusters

    @property
    def coalitions(self) -> list[frozenset[P]]:
        """Every coalition of resampled steps, in bitmask order."""
        return [self.coalition(m) for m in range(1 << self.n)]

    def update(self, coalition: Iterable[P], bad: float, seed: int | None = None) -> None:
        """Record one fork's outcome (1.0 = bad) for the coalition of resampled steps; forks
        with the same `seed` (common random numbers) are one cluster, None is its own."""
        m = self.mask(coalition)
        self._obs.append(m, self._record(m, bad, seed), bad)
        self._forks[m] += 1
        self._bad[m] += bad
        self._pending[m] = max(0, self._pending[m] - 1)

    def cancel(self, coalition: Iterable[P]) -> None:
        """A fork handed out for this coalition will never report."""
        m = self.mask(coalition)
        self._pending[m] = max(0, self._pending[m] - 1)

    def next_coalitions(self, k: int) -> list[frozenset[P]]:
        """Where the next `k` forks go: every coalition up to `min_per_coalition` first, then
        greedily to the largest cut in total variance (forks in flight count as done)."""
        issued = self._forks + self._pending
        out: list[int] = []
        while len(out) < k:
            m = int(np.argmin(issued))
            if issued[m] >= self.min_per_coalition:
                break
            out.append(m)
            issued[m] += 1
        if len(out) < k:
            variance = self._weight * _shrunk_variance(self._forks, self._bad)
            # Gain of one more fork at S: variance * (1/m - 1/(m + 1)).
            heap = [(-variance[m] / (issued[m] * (issued[m] + 1)), m) for m in range(1 << self.n)]
            heapq.heapify(heap)
            while len(out) < k:
                _, m = heapq.heappop(heap)
                out.append(m)
                issued[m] += 1
                heapq.heappush(heap, (-variance[m] / (issued[m] * (issued[m] + 1)), m))
        for m in out:
            self._pending[m] += 1
        return [self.coalition(m) for m in out]

    @property
    def clusters(self) -> int:
        """Independent clusters behind the estimates: distinct seeds plus seedless forks."""
        return self._clusters

    def variance(self) -> FloatArray:
        """The cluster-robust variance of every phi_i (see the class docstring), in
        O(forks) time and cached until the next update."""
        return self._cluster_robust()[0].copy()

    def effective_clusters(self) -> FloatArray:
        """Per phi_i, the effective number of clusters behind its variance (see the class
        docstring); the interval's t reference has this minus one degrees of freedom."""
        return self._cluster_robust()[1].copy()

    def _cluster_robust(self) -> tuple[FloatArray, FloatArray]:
        size = self._obs.size
        if self._cached is not None and self._cached[0] == size:
            return self._cached[1], self._cached[2]
        mask, cluster, y = self._obs.arrays()
        forks = self._forks
        mean = self._bad / np.maximum(forks, 1.0)
        resid = y - mean[mask]
        s2 = np.bincount(mask, weights=resid * resid, minlength=forks.size) / np.maximum(
            forks - 1.0, 1.0
        )
        # CR2: each residual over sqrt(1 - leverage) = sqrt((n_S - 1) / n_S), times 1 / n_S.
        scale = np.where(forks > 1, 1.0 / np.sqrt(np.maximum(forks * (forks - 1.0), 1.0)), 0.0)
        # r[j, i] = sum over the forks of cluster j of a[i, S] * scaled residual: a sparse
        # (clusters x coalitions) matrix of summed residuals times a', O(forks + clusters n).
        shape = (self._clusters, forks.size)
        summed = coo_matrix((resid * scale[mask], (cluster, mask)), shape=shape).tocsr()
        r = np.asarray(summed @ self._a.T, dtype=np.float64)
        var: FloatArray = (r * r).sum(axis=0)
        shrunk = _shrunk_variance(forks, self._bad)
        floor = np.maximum(shrunk - s2, 0.0)
        var = var + self._a**2 @ np.where(forks > 0, floor / np.maximum(forks, 1.0), 0.0)
        # Each fork's working standard deviation in phi_i: |a[i, S]| sigma_S / n_S.
        sd = np.sqrt(np.maximum(shrunk, s2)) / np.maximum(forks, 1.0)
        counts = coo_matrix((np.ones(size), (cluster, mask)), shape=shape).tocsr()
        eff = _effective(np.asarray(counts @ (np.abs(self._a) * sd).T, dtype=np.float64))
        self._cached = (size, var, eff)
        return var, eff

    def estimates(self) -> ShapleyEstimates[P]:
        measured = self._forks > 0
        value = np.where(measured, self._bad / np.maximum(self._forks, 1), 0.5)
        phi = self._a @ value
        # An unmeasured v(S) could be anywhere in [0, 1]: a[i, S] * 0.5 either side of 0.5.
        unknown = (np.abs(self._a) * np.where(measured, 0.0, 0.5)).sum(axis=1)
        var, clusters = self._cluster_robust()
        crit = _t(self.alpha, clusters)
        se = np.sqrt(var)
        finite = np.isfinite(crit)
        half = np.where(finite, np.where(finite, crit, 0.0) * se + unknown, np.inf)
        low = np.clip(phi - half, -1.0, 1.0)
        high = np.clip(phi + half, -1.0, 1.0)
        ses = [float(s) if ok else None for s, ok in zip(se, finite, strict=True)]
        return self._assemble(phi, low, high, ses, "exact")


@dataclass
class _Pair:
    """A kernel-drawn coalition T (the steps kept) and its complement: outcome[0] is the fork
    keeping T (resampling the rest), outcome[1] the fork keeping the rest (resampling T)."""

    kept: int
    outcome: list[float | None] = field(default_factory=lambda: [None, None])
    cluster: list[int] = field(default_factory=lambda: [-1, -1])  # each side's seed cluster


class KernelShapPlanner(_Coalitions[P]):
    """Shapley blame for many candidates by paired KernelSHAP (Lundberg & Lee 2017; Covert &
    Lee 2021): coalitions drawn from the Shapley kernel, each with its complement, one fork
    each; phi from least squares with the efficiency constraint sum(phi) = v(empty) - v(N),
    whose two ends are measured directly.

    Intervals use the sandwich (delta-method) variance, made cluster-robust: phi - phi* is,
    to first order, a sum of per-unit influences (a pair: Q psi_p / m; a fork of an end:
    +-g (y - ybar_end) / n_end), and units are dependent when they share a seed (common
    random numbers) or, for the two sides of a pair, a drawn coalition. The clusters are the
    connected components of units linked by pairs and seeds, and

        Var(phi) = sum_G (sum_{u in G} U_u)^2
                   + (m / (m - 1) - 1) sum_pairs U_p^2 + g^2 (shrunk - empirical ends' variance),

    the CR0 sum plus two never-negative terms that make it, when no seed is shared, exactly
    the independent-pairs sandwich (with its m / (m - 1)) plus the ends' Laplace-shrunk
    binomial variance. Intervals are phi +- t SE, t with G* - 1 degrees of freedom, G* the
    effective number of clusters (`_effective`); below two the intervals are [-1, 1]. Seeding
    the j-th fork of every coalition with j puts nearly every pair in the cluster of seed 0
    (coalitions rarely repeat): then G* is about 1 and the intervals stay wide, rightly so,
    since all those forks share one draw.

    Outcomes no drawn pair is waiting for (the rows of a resumed job, replayed into a fresh
    planner) are paired with an outcome of the complementary coalition as they come: a
    resumed job's pairs are rebuilt from its rows and nothing is paid for twice.
    """

    def __init__(
        self,
        players: Iterable[P],
        alpha: float,
        *,
        seed: int = 0,
        min_per_end: int = 2,
    ) -> None:
        super().__init__(players, alpha)
        if self.n < 2:
            raise ValueError("KernelSHAP needs at least two candidate steps")
        self.min_per_end = min_per_end
        self._rng = np.random.default_rng(seed)
        sizes = np.arange(1, self.n)
        kernel = 1.0 / (sizes * (self.n - sizes))
        self._size_p = kernel / kernel.sum()
        self._pairs: list[_Pair] = []
        self._waiting: dict[int, deque[tuple[int, int]]] = {}  # resampled mask -> (pair, side)
        # Outcomes (and their seed clusters) no pair was waiting for.
        self._spare: dict[int, deque[tuple[float, int]]] = {}
        self._end_forks: dict[int, list[tuple[float, int]]] = {0: [], self.full: []}
        self._queued: deque[int] = deque()  # complements drawn but not yet handed out
        self._end_issued = {0: 0, self.full: 0}
        self._rows_drawn = 0

    def update(self, coalition: Iterable[P], bad: float, seed: int | None = None) -> None:
        """Record one fork's outcome (1.0 = bad) for the coalition of resampled steps; forks
        with the same `seed` (common random numbers) are one cluster, None is its own."""
        m = self.mask(coalition)
        cluster = self._record(m, bad, seed)
        if m in self._end_issued:
            self._end_issued[m] = max(self._end_issued[m], int(self._tally[m][0]))
            self._end_forks[m].append((bad, cluster))
            return
        waiting = self._waiting.get(m)
        if waiting:
            # Forks of one coalition are exchangeable: the oldest waiting slot takes it.
            pair, side = waiting.popleft()
            self._pairs[pair].outcome[side] = bad
            self._pairs[pair].cluster[side] = cluster
            return
        partner = self._spare.get(self.full & ~m)
        if partner:
            # Side 0 keeps T = ~m (resamples m); side 1 keeps m (resamples the complement).
            other, other_cluster = partner.popleft()
            self._pairs.append(_Pair(self.full & ~m, [bad, other], [cluster, other_cluster]))
            self._rows_drawn += 2
        else:
            self._spare.setdefault(m, deque()).append((bad, cluster))

    def cancel(self, coalition: Iterable[P]) -> None:
        """A fork handed out for this coalition will never report: its pair is dropped."""
        m = self.mask(coalition)
        if m in self._end_issued:
            self._end_issued[m] = max(0, self._end_issued[m] - 1)
            return
        waiting = self._waiting.get(m)
        if waiting:
            waiting.pop()

    def next_coalitions(self, k: int) -> list[frozenset[P]]:
        """Where the next `k` forks go: both ends (nothing / everything resampled) kept at about
        1/n of the sampled forks each (they fix sum(phi)), the rest to kernel-drawn pairs."""
        out: list[int] = []
        while len(out) < k:
            if self._queued:
                out.append(self._queued.popleft())
                continue
            target = max(self.min_per_end, math.ceil(self._rows_drawn / self.n))
            end = min(self._end_issued, key=lambda e: self._end_issued[e])
            if self._end_issued[end] < target:
                self._end_issued[end] += 1
                out.append(end)
                continue
            out.extend(self._draw_pair(k - len(out)))
        return [self.coalition(m) for m in out]

    def _draw_pair(self, room: int) -> list[int]:
        size = int(self._rng.choice(np.arange(1, self.n), p=self._size_p))
        members = self._rng.choice(self.n, size=size, replace=False)
        kept = int(sum(1 << int(i) for i in members))
        pair = len(self._pairs)
        self._pairs.append(_Pair(kept))
        self._rows_drawn += 2
        issue: list[int] = []
        # Side 0 is the coalition keeping T (resampling ~T); side 1 keeps ~T (resamples T).
        for side, resampled in enumerate((self.full & ~kept, kept)):
            spare = self._spare.get(resampled)
            if spare:
                outcome, cluster = spare.popleft()
                self._pairs[pair].outcome[side] = outcome
                self._pairs[pair].cluster[side] = cluster
            else:
                self._waiting.setdefault(resampled, deque()).append((pair, side))
                issue.append(resampled)
        if len(issue) == 2 and room < 2:
            self._queued.append(issue.pop())
        return issue

    def estimates(self) -> ShapleyEstimates[P]:
        b0 = self._end_stats(self.full)  # f(empty) = v(N): everything resampled
        b1 = self._end_stats(0)  # f(N) = v(empty): nothing resampled
        delta = b1[0] - b0[0]
        var_delta = b0[1] + b1[1]
        complete = [p for p in self._pairs if None not in p.outcome]
        m = len(complete)
        wide = (np.full(self.n, delta / self.n), np.full(self.n, -1.0), np.full(self.n, 1.0))
        if m < 2 * self.n or b0[2] == 0 or b1[2] == 0:
            return self._assemble(*wide, [None] * self.n, "kernel")
        kept = np.array([p.kept for p in complete], dtype=np.int64)
        zt = ((kept[:, None] >> np.arange(self.n)) & 1).astype(np.float64)  # rows keep T
        zc = 1.0 - zt
        yt = np.array([p.outcome[0] for p in complete], dtype=np.float64)
        yc = np.array([p.outcome[1] for p in complete], dtype=np.float64)
        gram = (zt.T @ zt + zc.T @ zc) / (2 * m)
        rhs = (zt.T @ (yt - b0[0]) + zc.T @ (yc - b0[0])) / (2 * m)
        ones = np.ones(self.n)
        try:
            solved = np.linalg.solve(gram, np.column_stack([rhs, ones]))
        except np.linalg.LinAlgError:
            return self._assemble(*wide, [None] * self.n, "kernel")
        ainv_b, ainv_1 = solved[:, 0], solved[:, 1]
        total = ones @ ainv_1
        phi = ainv_b - ainv_1 * (ones @ ainv_b - delta) / total
        # Sandwich: phi moves with the pair means through Q = A^-1 - A^-1 1 1' A^-1 / (1' A^-1 1)
        # (which kills the constant direction, so v(N)'s share of the intercept drops out) and
        # with delta through A^-1 1 / (1' A^-1 1).
        ainv = np.linalg.inv(gram)
        q = ainv - np.outer(ainv_1, ainv_1) / total
        resid_t = yt - b0[0] - zt @ phi
        resid_c = yc - b0[0] - zc @ phi
        psi = 0.5 * (zt * resid_t[:, None] + zc * resid_c[:, None])
        g = ainv_1 / total
        # Per-unit influences on phi: pairs, then every fork of v(empty) and of v(N).
        units = [psi @ q.T / m]
        unit_clusters = [np.array([p.cluster for p in complete], dtype=np.int64)]
        # And each unit's typical size, which weighs its cluster in the effective count.
        spread = [np.abs(units[0])]
        hc0_ends = 0.0
        for end, (mean, var_end, forks), sign in ((0, b1, 1.0), (self.full, b0, -1.0)):
            y_end = np.array([f[0] for f in self._end_forks[end]], dtype=np.float64)
            share = sign * (y_end - mean) / forks
            units.append(share[:, None] * g[None, :])
            spread.append(np.outer(np.full(y_end.size, math.sqrt(var_end / forks)), np.abs(g)))
            seeds = np.array([f[1] for f in self._end_forks[end]], dtype=np.int64)
            unit_clusters.append(np.column_stack([seeds, seeds]))
            hc0_ends += float(share @ share)
        labels, groups = _components(np.concatenate(unit_clusters), self._clusters)
        r = _cluster_sums(labels, groups, np.concatenate(units))
        var = (r * r).sum(axis=0)
        var += (units[0] ** 2).sum(axis=0) / (m - 1) + g * g * max(var_delta - hc0_ends, 0.0)
        se = np.sqrt(var)
        crit = _t(self.alpha, _effective(_cluster_sums(labels, groups, np.concatenate(spread))))
        if not np.all(np.isfinite(crit)):
            return self._assemble(*wide, [None] * self.n, "kernel")
        low = np.clip(phi - crit * se, -1.0, 1.0)
        high = np.clip(phi + crit * se, -1.0, 1.0)
        return self._assemble(phi, low, high, [float(s) for s in se], "kernel")

    def _end_stats(self, mask: int) -> tuple[float, float, int]:
        forks, bad = self._tally.get(mask, [0.0, 0.0])
        if not forks:
            return 0.5, 0.25, 0
        f = np.array([forks])
        return bad / forks, float(_shrunk_variance(f, np.array([bad]))[0] / forks), int(forks)


def _components(unit_clusters: NDArray[np.int64], clusters: int) -> tuple[NDArray[np.intp], int]:
    """Units (rows) are dependent when they share a cluster (a row names two, possibly the
    same): label each unit with its connected component, 0 .. groups - 1."""
    units = unit_clusters.shape[0]
    rows = np.repeat(np.arange(units), 2)
    cols = units + unit_clusters.ravel()
    size = units + clusters
    graph = coo_matrix((np.ones(rows.size), (rows, cols)), shape=(size, size))
    _, labels = connected_components(graph, directed=False)
    _, compact = np.unique(labels[:units], return_inverse=True)
    return compact.astype(np.intp), int(compact.max()) + 1 if units else 0


def _cluster_sums(labels: NDArray[np.intp], groups: int, rows: FloatArray) -> FloatArray:
    """Per cluster (labels 0 .. groups - 1), the sum of its rows: (groups, columns)."""
    cols = rows.shape[1]
    slot = (labels[:, None] * cols + np.arange(cols)[None, :]).ravel()
    summed = np.bincount(slot, weights=rows.ravel(), minlength=groups * cols)
    return np.asarray(summed, dtype=np.float64).reshape(groups, cols)


def _effective(spread: FloatArray) -> FloatArray:
    """The effective number of clusters, per column: spread[G, i] is the summed working
    standard deviation of cluster G's units in phi_i, so w = spread^2 is G's variance if its
    units were perfectly correlated (common random numbers at their strongest), and the count
    is (sum_G w_G)^2 / sum_G w_G^2 (Carter, Schnepel & Steigerwald 2017, at rho = 1): the
    number of clusters for equal ones, about one when one cluster carries the weight."""
    w = spread * spread
    total = w.sum(axis=0)
    squares = (w * w).sum(axis=0)
    return np.where(squares > 0, total * total / np.where(squares > 0, squares, 1.0), 0.0)


def shapley_planner(
    players: Iterable[P], alpha: float, *, exact_limit: int = 10, seed: int = 0
) -> ShapleyPlanner[P]:
    """Every coalition (Neyman-allocated) up to `exact_limit` candidates, paired KernelSHAP
    above."""
    players = tuple(players)
    if len(players) <= exact_limit:
        return CoalitionPlanner(players, alpha)
    return KernelShapPlanner(players, alpha, seed=seed)
