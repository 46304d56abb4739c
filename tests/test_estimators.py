"""Statistics of the attribution runner, checked against exact ground truth with fixed seeds.

Every tolerance below is stated next to its assertion; none is a number copied from a run.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import TypeVar

import numpy as np
import pytest
from scipy.special import gammaln
from scipy.stats import binomtest, norm
from scipy.stats import t as student_t

from car_ray.schedule import (
    CoalitionPlanner,
    KernelShapPlanner,
    Race,
    ShapleyEstimates,
    ShapleyPlanner,
    confidence_sequence,
    confidence_sequences,
    exact_shapley,
    shapley_coefficients,
    shapley_planner,
    wilson,
)

P = TypeVar("P", bound=Hashable)

# -- confidence sequences ---------------------------------------------------------------------


@pytest.mark.parametrize("p", [0.05, 0.3, 0.5])
def test_confidence_sequence_holds_at_every_n_at_once(p: float) -> None:
    """Anytime validity: watching the interval after every one of 500 forks, the fraction of
    2,000 sequences that EVER leave it stays <= alpha (+ 3 standard errors of the estimate)."""
    alpha, reps, horizon = 0.1, 2000, 500
    rng = np.random.default_rng(20240501)
    # The bound depends only on (successes, n): tabulate every pair once.
    s_grid, n_grid = np.meshgrid(np.arange(horizon + 1), np.arange(horizon + 1), indexing="ij")
    valid = s_grid <= n_grid
    lo = np.full(s_grid.shape, np.nan)
    hi = np.full(s_grid.shape, np.nan)
    lo[valid], hi[valid] = confidence_sequences(s_grid[valid], n_grid[valid], alpha)
    successes = np.cumsum(rng.random((reps, horizon)) < p, axis=1)
    n = np.arange(1, horizon + 1)
    ever_out = ((lo[successes, n] > p) | (hi[successes, n] < p)).any(axis=1).mean()
    assert ever_out <= alpha + 3 * math.sqrt(alpha * (1 - alpha) / reps)
    # The scalar form is the same function.
    for s, m in [(0, 1), (3, 10), (250, 500), (500, 500)]:
        assert confidence_sequence(s, m, alpha) == (lo[s, m], hi[s, m])


def test_confidence_sequence_is_exactly_the_mixture_boundary() -> None:
    """Ground truth: the interval's inner endpoints are where (n+1) C(n,s) p^s (1-p)^(n-s)
    equals alpha (the uniform-prior mixture martingale reaching 1/alpha)."""
    cases = [(1, 10), (3, 10), (30, 100), (499, 1000), (2, 5000), (1, 10**6), (314_159, 10**6)]
    for alpha in (0.05, 1e-6):
        for s, n in cases:
            lo, hi = confidence_sequence(s, n, alpha)
            log_c = math.log(n + 1) + gammaln(n + 1) - gammaln(s + 1) - gammaln(n - s + 1)
            for p in (lo, hi):
                log_level = log_c + s * math.log(p) + (n - s) * math.log1p(-p)
                assert log_level == pytest.approx(math.log(alpha), abs=1e-6)
            assert 0.0 < lo < s / n < hi < 1.0


def test_confidence_sequence_edges_stay_in_the_unit_interval() -> None:
    assert confidence_sequence(0, 0, 0.05) == (0.0, 1.0)
    lo, hi = confidence_sequence(0, 20, 0.05)
    assert lo == 0.0 and 0.0 < hi < 0.5
    lo, hi = confidence_sequence(20, 20, 0.05)
    assert hi == 1.0 and 0.5 < lo < 1.0
    s = np.concatenate([np.arange(0, 51), np.arange(0, 1001, 37)])
    n = np.concatenate([np.full(51, 50), np.full(28, 1000)])
    with np.errstate(divide="raise", invalid="raise", over="raise"):  # no warnings at the edges
        lo_a, hi_a = confidence_sequences(s, n, 1e-6)
    assert np.all((lo_a >= 0.0) & (lo_a <= s / n) & (s / n <= hi_a) & (hi_a <= 1.0))
    # Fractional successes ([0, 1]-valued observations) are valid and lie between neighbours.
    mid = confidence_sequence(2.5, 10, 0.05)
    assert confidence_sequence(2, 10, 0.05)[0] < mid[0] < confidence_sequence(3, 10, 0.05)[0]
    with pytest.raises(ValueError, match="0 <= successes <= n"):
        confidence_sequence(11, 10, 0.05)
    with pytest.raises(ValueError, match="alpha must be in"):
        confidence_sequence(1, 10, 1.5)


def test_confidence_sequence_shrinks_like_sqrt_log_n_over_n() -> None:
    """Half-width at p_hat = 1/2 over n = 100 .. 10^6 divided by sqrt(log n / n) stays in
    [0.5, 0.8] (its limit is sqrt(p (1 - p)) = 0.5), while half-width * sqrt(n) keeps growing:
    the price of validity at every n is a sqrt(log n) factor, no more."""
    ns = [10**k for k in range(2, 7)]
    bounds = [confidence_sequence(n // 2, n, 0.05) for n in ns]
    half = [(hi - lo) / 2 for lo, hi in bounds]
    ratios = [h / math.sqrt(math.log(n) / n) for h, n in zip(half, ns, strict=True)]
    assert all(0.5 <= r <= 0.8 for r in ratios), ratios
    assert all(a > b for a, b in itertools.pairwise(half))
    scaled = [h * math.sqrt(n) for h, n in zip(half, ns, strict=True)]
    assert all(a < b for a, b in itertools.pairwise(scaled))
    # Anytime validity costs width against a fixed-n interval, never the other way round.
    for n in (10, 100, 1000):
        cs, fixed = confidence_sequence(n * 0.3, n, 0.05), wilson(n * 0.3, n, 0.05)
        assert cs[0] < fixed[0] and fixed[1] < cs[1]


def test_wilson_matches_the_textbook_interval() -> None:
    for s, n in [(0, 10), (3, 10), (47, 100), (1000, 1000)]:
        expected = binomtest(s, n).proportion_ci(0.95, method="wilson")
        lo, hi = wilson(s, n, 0.05)
        assert lo == pytest.approx(expected.low, abs=1e-12)
        assert hi == pytest.approx(expected.high, abs=1e-12)
    assert wilson(0, 0, 0.05) == (0.0, 1.0)


# -- the race ---------------------------------------------------------------------------------

FIVE_ARMS = (0.5, 0.3, 0.2, 0.1, 0.05)


def run_race(
    means: Sequence[float],
    alpha: float,
    rng: np.random.Generator,
    *,
    batch: int = 8,
    cap: int = 10_000,
    uniform: bool = False,
) -> tuple[Race[int], int]:
    """Forks in batches, as the driver sends them, until the race separates or `cap` forks."""
    race = Race(range(len(means)), alpha)
    forks = 0
    while forks < cap and race.done() is None:
        arms = (
            [(forks + j) % len(means) for j in range(batch)] if uniform else race.next_arms(batch)
        )
        outcomes = rng.random(len(arms)) < np.take(means, arms)
        for arm, bad in zip(arms, outcomes, strict=True):
            race.update(arm, float(bad))
        forks += len(arms)
    return race, forks


def test_race_names_the_best_arm_with_probability_at_least_one_minus_alpha() -> None:
    alpha, reps = 0.1, 200
    rng = np.random.default_rng(7)
    right = 0
    for _ in range(reps):
        race, _ = run_race(FIVE_ARMS, alpha, rng)
        assert race.done() == "separated"
        right += race.leader() == 0
    assert right / reps >= 1 - alpha


def test_race_needs_fewer_forks_than_uniform_allocation() -> None:
    """Same arms, same stopping rule, same confidence: LUCB's forks to separation, averaged
    over 40 runs, are at most 0.75 of round-robin's (side by side, same seed)."""
    rng = np.random.default_rng(11)
    adaptive = [run_race(FIVE_ARMS, 0.1, rng)[1] for _ in range(40)]
    uniform = [run_race(FIVE_ARMS, 0.1, rng, uniform=True, batch=5)[1] for _ in range(40)]
    assert np.mean(adaptive) <= 0.75 * np.mean(uniform), (np.mean(adaptive), np.mean(uniform))


def test_race_rarely_separates_two_equal_arms() -> None:
    """Two arms with the same flip-rate: declaring either one the top cause is an error; over
    200 races of up to 400 forks it happens in at most alpha of them."""
    alpha, reps = 0.1, 200
    rng = np.random.default_rng(3)
    separated = sum(
        run_race((0.3, 0.3), alpha, rng, cap=400)[0].done() == "separated" for _ in range(reps)
    )
    assert separated / reps <= alpha


def test_race_allocation_rules() -> None:
    race: Race[str] = Race(["a", "b", "c"], alpha=0.05)
    assert race.leader() is None
    assert race.next_arms(2) == ["a", "b"]  # never-sampled arms first...
    assert race.next_arms(2)[0] == "c"  # ...counting forks already in flight
    for _ in range(30):
        race.update("a", 1.0)
        race.update("b", 0.0)
        race.update("c", 0.0)
    assert race.leader() == "a"
    assert race.done() == "separated"
    assert race.next_arms(4) == []  # nothing left to race
    lo, hi = race.interval("a")
    # alpha is split over the three arms: the interval is the CS at 0.05 / 3.
    assert (lo, hi) == confidence_sequence(30, 30, 0.05 / 3)
    with pytest.raises(KeyError, match="'z' is not an arm"):
        race.update("z", 1.0)
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        race.update("a", 2.0)


def test_race_goes_to_the_leader_and_its_strongest_challenger() -> None:
    race: Race[str] = Race(["top", "close", "far"], alpha=0.05)
    for value, arm in [(0.6, "top"), (0.5, "close"), (0.05, "far")]:
        for j in range(40):
            race.update(arm, float(j < value * 40))
    picks = race.next_arms(6)
    assert set(picks) == {"top", "close"}
    assert race.done(target_half_width=0.5) == "precise"
    assert race.done(target_half_width=0.01) is None
    solo: Race[str] = Race(["only"], alpha=0.05)
    solo.update("only", 1.0)
    assert solo.done() is None  # one arm is never "separated"
    assert solo.next_arms(2) == ["only", "only"]


# -- Shapley ----------------------------------------------------------------------------------


def subsets(players: Sequence[P]) -> list[frozenset[P]]:
    return [
        frozenset(c) for r in range(len(players) + 1) for c in itertools.combinations(players, r)
    ]


def shapley_truth(v: Mapping[frozenset[P], float], players: Sequence[P]) -> dict[P, float]:
    """Blame by definition: the Shapley value of f(T) = v(N \\ T)."""
    everyone = frozenset(players)
    return exact_shapley({everyone - s: value for s, value in v.items()}, players)


def simulate(
    planner: ShapleyPlanner[P],
    v: Callable[[frozenset[P]], float],
    forks: int,
    rng: np.random.Generator,
    batch: int = 32,
) -> ShapleyEstimates[P]:
    """Run `forks` Bernoulli forks where the planner sends them, in driver-sized batches."""
    done = 0
    while done < forks:
        coalitions = planner.next_coalitions(min(batch, forks - done))
        bad = rng.random(len(coalitions)) < np.array([v(c) for c in coalitions])
        for coalition, outcome in zip(coalitions, bad, strict=True):
            planner.update(coalition, float(outcome))
        done += len(coalitions)
    return planner.estimates()


def test_exact_shapley_on_games_with_known_values() -> None:
    players = ["a", "b", "c"]
    weights = {"a": 0.5, "b": -0.2, "c": 0.1}
    additive = {t: 0.3 + sum(weights[p] for p in t) for t in subsets(players)}
    assert exact_shapley(additive, players) == pytest.approx(weights)
    # Unanimity game on {a, b}: each of the two gets half, c nothing.
    unanimity = {t: float({"a", "b"} <= t) for t in subsets(players)}
    assert exact_shapley(unanimity, players) == pytest.approx({"a": 0.5, "b": 0.5, "c": 0.0})


def test_shapley_coefficients_are_the_blame_as_a_linear_map_of_v() -> None:
    rng = np.random.default_rng(5)
    for n in (1, 2, 4, 6):
        players = list(range(n))
        values = rng.random(1 << n)
        v = {frozenset(p for p in players if m >> p & 1): values[m] for m in range(1 << n)}
        truth = shapley_truth(v, players)
        assert shapley_coefficients(n) @ values == pytest.approx([truth[p] for p in players])


def and_game(noise: float) -> Callable[[frozenset[int]], float]:
    """Bad iff steps 0 and 1 are both kept as recorded; each outcome flips with `noise`."""
    return lambda s: noise + (1 - 2 * noise) * float(0 not in s and 1 not in s)


def test_both_halves_of_an_and_conjunction_get_the_blame() -> None:
    players = [0, 1, 2, 3]
    # Without noise the values are exact and so is the blame: 1/2 each, 0 for the others.
    e = simulate(CoalitionPlanner(players, 0.05), and_game(0.0), 64, np.random.default_rng(0))
    assert [e.steps[p].phi.value for p in players] == pytest.approx([0.5, 0.5, 0.0, 0.0])
    # With 5% Bernoulli noise the truth is 0.45 each; 3,000 forks get within 0.05 (about 5 SE).
    v = and_game(0.05)
    truth = shapley_truth({s: v(s) for s in subsets(players)}, players)
    assert truth == pytest.approx({0: 0.45, 1: 0.45, 2: 0.0, 3: 0.0})
    e = simulate(CoalitionPlanner(players, 0.05), v, 3000, np.random.default_rng(1))
    for p in players:
        phi = e.steps[p].phi
        assert phi.value == pytest.approx(truth[p], abs=0.05)
        assert phi.se is not None and phi.se < 0.015
    assert e.sum_check == pytest.approx(0.0, abs=1e-12)
    assert e.forks == 3000


def random_game(n: int, seed: int) -> tuple[list[int], dict[frozenset[int], float]]:
    players = list(range(n))
    rng = np.random.default_rng(seed)
    return players, {s: float(rng.random()) for s in subsets(players)}


def test_noisy_random_game_estimates_are_within_their_standard_errors() -> None:
    """n = 5, v(S) drawn uniformly in [0, 1]: at 4,000 forks every phi is within 4 reported
    SE of the exact value, and over 100 repetitions the 90% intervals cover the truth in at
    least 80% of (player, repetition) cases (loose: intervals are per step, normal)."""
    players, v = random_game(5, seed=42)
    truth = shapley_truth(v, players)
    rng = np.random.default_rng(2)
    covered = []
    for rep in range(100):
        e = simulate(CoalitionPlanner(players, 0.1), v.__getitem__, 4000, rng, batch=64)
        for p in players:
            phi = e.steps[p].phi
            assert phi.value is not None and phi.se is not None
            if rep == 0:
                assert abs(phi.value - truth[p]) <= 4 * phi.se
            covered.append(phi.low <= truth[p] <= phi.high)
        assert abs(e.sum_check) < 1e-12
    assert np.mean(covered) >= 0.8


def test_neyman_allocation_beats_uniform_at_an_equal_budget() -> None:
    """Half the coalitions deterministic (v in {0, 1}), half near 0.5: at 1,024 forks (32 per
    coalition if uniform), the mean squared error of phi averaged over 60 repetitions is at
    most 0.75 of uniform allocation's. Side by side, same game, same random stream."""
    players = list(range(5))
    game_rng = np.random.default_rng(3)
    v = {
        s: float(game_rng.integers(0, 2))
        if game_rng.random() < 0.5
        else float(game_rng.uniform(0.4, 0.6))
        for s in subsets(players)
    }
    truth = np.array([shapley_truth(v, players)[p] for p in players])
    rng = np.random.default_rng(4)
    forks = 1024

    def error(e: ShapleyEstimates[int]) -> float:
        phi = np.array([e.steps[p].phi.value for p in players], dtype=float)
        return float(np.mean((phi - truth) ** 2))

    neyman, uniform = [], []
    for _ in range(60):
        neyman.append(error(simulate(CoalitionPlanner(players, 0.1), v.__getitem__, forks, rng)))
        planner = CoalitionPlanner(players, 0.1)
        everyone = planner.coalitions
        for j in range(forks):
            coalition = everyone[j % len(everyone)]
            planner.update(coalition, float(rng.random() < v[coalition]))
        uniform.append(error(planner.estimates()))
    assert np.mean(neyman) <= 0.75 * np.mean(uniform), (np.mean(neyman), np.mean(uniform))


def test_kernel_shap_recovers_an_additive_game_with_twelve_steps() -> None:
    """f(T) = 0.1 + sum of the kept steps' weights (weights in [-0.03, 0.08]), so phi_i is the
    weight. 8,000 forks: every phi within 0.05 of the truth and within 4 reported SE, for
    three seeds; the efficiency constraint holds exactly."""
    players = [f"step{i}" for i in range(12)]
    weights = np.random.default_rng(11).uniform(-0.03, 0.08, len(players))

    def v(resampled: frozenset[str]) -> float:
        kept = [w for p, w in zip(players, weights, strict=True) if p not in resampled]
        return 0.1 + float(sum(kept))

    for seed in range(3):
        planner = shapley_planner(players, alpha=0.1, seed=seed)
        assert isinstance(planner, KernelShapPlanner)
        e = simulate(planner, v, 8000, np.random.default_rng(100 + seed), batch=64)
        assert e.method == "kernel"
        for p, w in zip(players, weights, strict=True):
            phi = e.steps[p].phi
            assert phi.value is not None and phi.se is not None
            assert abs(phi.value - w) <= 0.05
            assert abs(phi.value - w) <= 4 * phi.se
        assert e.sum_check == pytest.approx(0.0, abs=1e-9)


def test_necessity_and_sufficiency_are_their_definitions() -> None:
    """necessity_i = 1 - v({i}), sufficiency_i = v(N \\ {i}): exact on a deterministic game,
    inside their Wilson intervals with their own fork counts on a noisy one."""
    players = [0, 1, 2]
    # Deterministic: bad iff step 0 is kept, or steps 1 and 2 are both kept.
    exact = {s: float(0 not in s or not ({1, 2} & s)) for s in subsets(players)}
    e = simulate(CoalitionPlanner(players, 0.05), exact.__getitem__, 200, np.random.default_rng(0))
    everyone = frozenset(players)
    for p in players:
        a = e.steps[p]
        assert a.necessity.value == 1 - exact[frozenset({p})]
        assert a.sufficiency.value == exact[everyone - {p}]
    # Noisy: the estimates are the observed proportions of their own coalitions' forks.
    _, noisy = random_game(3, seed=9)
    planner = CoalitionPlanner(players, 0.05)
    seen: dict[frozenset[int], list[float]] = {}
    rng = np.random.default_rng(6)
    for _ in range(100):
        for coalition in planner.next_coalitions(30):
            outcome = float(rng.random() < noisy[coalition])
            planner.update(coalition, outcome)
            seen.setdefault(coalition, []).append(outcome)
    e = planner.estimates()
    for p in players:
        alone, rest = seen[frozenset({p})], seen[everyone - {p}]
        a = e.steps[p]
        assert a.necessity.value == pytest.approx(1 - np.mean(alone), abs=1e-12)
        assert a.sufficiency.value == pytest.approx(np.mean(rest), abs=1e-12)
        assert (a.necessity.n, a.sufficiency.n) == (len(alone), len(rest))
        assert (a.necessity.low, a.necessity.high) == wilson(
            len(alone) - sum(alone), len(alone), 0.05
        )
        # And the truth is near: within 4 binomial SE.
        for got, truth, n in [
            (a.necessity.value, 1 - noisy[frozenset({p})], len(alone)),
            (a.sufficiency.value, noisy[everyone - {p}], len(rest)),
        ]:
            assert got is not None
            assert abs(got - truth) <= 4 * math.sqrt(truth * (1 - truth) / n)
    row = e.steps[0].as_row()
    assert set(row) == {
        f"{name}{suffix}"
        for name in ("phi", "necessity", "sufficiency")
        for suffix in ("", "_lo", "_hi", "_n")
    } | {"phi_se"}


def test_coalition_planner_allocation_rules() -> None:
    players = ["x", "y"]
    planner = CoalitionPlanner(players, 0.05)
    first = planner.next_coalitions(8)
    # Two forks for each of the four coalitions before anything else.
    assert sorted(map(sorted, first)) == sorted(2 * [[], ["x"], ["y"], ["x", "y"]])
    for coalition in first:
        planner.update(coalition, 1.0 if "x" not in coalition else 0.0)
    # Neyman: forks go where the variance is, so with forks in flight they spread out.
    more = planner.next_coalitions(12)
    assert len(more) == 12 and len(set(more)) == 4
    for coalition in more:
        planner.cancel(coalition)
    with pytest.raises(KeyError, match="'z' is not a Shapley candidate"):
        planner.update(frozenset({"z"}), 1.0)
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        planner.update(frozenset(), 3.0)


def test_an_unmeasured_coalition_widens_the_intervals_honestly() -> None:
    """Out of budget before every coalition was measured: the interval still contains every
    phi consistent with the measured values and ANY value of the unmeasured ones."""
    players = [0, 1, 2]
    planner = CoalitionPlanner(players, 0.05)
    missing = frozenset({1, 2})
    for s in subsets(players):
        if s != missing:
            for _ in range(400):
                planner.update(s, 0.0 if 0 in s else 1.0)
    e = planner.estimates()
    for unknown in (0.0, 1.0):
        v = {s: (unknown if s == missing else float(0 not in s)) for s in subsets(players)}
        truth = shapley_truth(v, players)
        for p in players:
            assert e.steps[p].phi.low - 1e-12 <= truth[p] <= e.steps[p].phi.high + 1e-12


def test_kernel_shap_intervals_cover_a_noisy_interaction_game() -> None:
    """Twelve steps, an AND of steps 0 and 1 plus an interaction of 5 and 7 (exact blame
    0.4, 0.4, 0.05, -0.05, zeros elsewhere), 3,000 Bernoulli forks: over 30 seeds the 90%
    sandwich intervals cover the exact value in at least 80% of (step, seed) cases."""
    players = list(range(12))

    def v(resampled: frozenset[int]) -> float:
        both = 0 not in resampled and 1 not in resampled
        return 0.15 + 0.8 * float(both) - 0.1 * float(5 in resampled and 7 not in resampled)

    truth = shapley_truth({s: v(s) for s in subsets(players)}, players)
    assert [truth[p] for p in (0, 1, 5, 7)] == pytest.approx([0.4, 0.4, 0.05, -0.05])
    covered = []
    for seed in range(30):
        planner = KernelShapPlanner(players, 0.1, seed=seed)
        e = simulate(planner, v, 3000, np.random.default_rng(1000 + seed), batch=64)
        covered += [e.steps[p].phi.low <= truth[p] <= e.steps[p].phi.high for p in players]
    assert np.mean(covered) >= 0.8


def test_kernel_shap_rebuilds_a_resumed_job_from_its_rows() -> None:
    """A restarted job replays its rows into a fresh planner: the estimate is the one the
    interrupted planner had, and the next forks are new ones, not repeats of the ends."""
    players = list(range(12))
    rng = np.random.default_rng(0)
    first = KernelShapPlanner(players, 0.1, seed=5)
    rows: list[tuple[frozenset[int], float]] = []
    for _ in range(20):
        for coalition in first.next_coalitions(32):
            outcome = float(rng.random() < (0.8 if 0 not in coalition else 0.3))
            first.update(coalition, outcome)
            rows.append((coalition, outcome))
    resumed = KernelShapPlanner(players, 0.1, seed=6)
    for coalition, outcome in rows:
        resumed.update(coalition, outcome)
    before, after = first.estimates(), resumed.estimates()
    assert resumed.counts == first.counts
    for p in players:
        was, now = before.steps[p].phi, after.steps[p].phi
        assert was.value is not None and was.se is not None and now.se is not None
        assert now.value == pytest.approx(was.value, abs=1e-12)
        # Pairs of a repeated coalition may be re-matched: the SE moves a little, no more.
        assert now.se == pytest.approx(was.se, rel=0.1)
    # The ends are not re-bought: the next forks split as they would have without the restart.
    ends = {frozenset(), frozenset(players)}
    resumed_ends = sum(c in ends for c in resumed.next_coalitions(96))
    first_ends = sum(c in ends for c in first.next_coalitions(96))
    assert abs(resumed_ends - first_ends) <= 2


def test_kernel_shap_before_enough_pairs_reports_wide_intervals() -> None:
    planner = KernelShapPlanner(list(range(12)), 0.1)
    for coalition in planner.next_coalitions(10):
        planner.update(coalition, 1.0)
    e = planner.estimates()
    assert all(a.phi.low == -1.0 and a.phi.high == 1.0 for a in e.steps.values())
    assert all(a.phi.se is None for a in e.steps.values())


def test_shapley_planner_picks_by_size() -> None:
    assert isinstance(shapley_planner(range(10), 0.05), CoalitionPlanner)
    assert isinstance(shapley_planner(range(11), 0.05), KernelShapPlanner)
    assert isinstance(shapley_planner(range(6), 0.05, exact_limit=4), KernelShapPlanner)


# -- common random numbers: seeds as clusters -------------------------------------------------


def crn_run(
    planner: ShapleyPlanner[int],
    values: Sequence[float],
    forks: int,
    u: np.ndarray,
    *,
    batch: int = 32,
    twin: ShapleyPlanner[int] | None = None,
) -> np.ndarray:
    """Forks where the planner sends them, seeded with a counter per coalition (the j-th fork
    of every coalition has seed j) and drawn as common random numbers do by inverse CDF: every
    fork with seed j sees the same uniform u[j], so y = 1[u[j] < v(S)]. `twin`, if given, gets
    the same outcomes without seeds (the independence-assuming estimator on the same data).
    Returns the (forks, bad) tally per coalition bitmask."""
    tally = np.zeros((len(values), 2))
    seeds: dict[int, int] = {}
    done = 0
    while done < forks:
        coalitions = planner.next_coalitions(min(batch, forks - done))
        if twin is not None:
            assert twin.next_coalitions(len(coalitions)) == coalitions
        for coalition in coalitions:
            m = sum(1 << p for p in coalition)
            j = seeds.get(m, 0)
            seeds[m] = j + 1
            y = float(u[j] < values[m])
            planner.update(coalition, y, seed=j)
            if twin is not None:
                twin.update(coalition, y)
            tally[m] += (1.0, y)
        done += len(coalitions)
    return tally


def independent_variance(tally: np.ndarray, n: int) -> np.ndarray:
    """The estimator as it was before seeds counted: sum_S a^2 pt (1 - pt) / n_S, with the
    Laplace-shrunk pt = (bad + 1) / (forks + 2), as if every fork were independent."""
    forks, bad = tally[:, 0], tally[:, 1]
    p = (bad + 1.0) / (forks + 2.0)
    return np.asarray((shapley_coefficients(n) ** 2 * (p * (1.0 - p) / forks)).sum(axis=1))


def test_cluster_robust_intervals_cover_under_common_random_numbers() -> None:
    """n = 4, v(S) = 0.25 + 0.5 [step 0 kept] (blame 0.5, 0, 0, 0), 480 forks per run, the
    j-th fork of every coalition with seed j, outcomes by common random numbers. Over 300
    runs, the 90% interval assuming independent coalitions covers step 0 in ~57% of runs (its
    variance is ~3.7 times too small: every fork with seed j moves together) and steps 1-3 in
    ~100% (too wide: their forks cancel exactly), while the cluster-robust interval covers
    every step in >= 85%. Tolerances: the observed coverages are 0.57 / 1.0 (independent) and
    0.87-0.92 (robust); with 300 runs a coverage's Monte Carlo SE is <= 0.03."""
    players = [0, 1, 2, 3]
    values = [0.25 + 0.5 * float(not m & 1) for m in range(16)]
    truth = shapley_coefficients(4) @ np.array(values)
    assert truth == pytest.approx([0.5, 0.0, 0.0, 0.0])
    z = float(norm.ppf(0.95))
    rng = np.random.default_rng(2024)
    robust, naive, ratio = [], [], []
    for _ in range(300):
        planner = CoalitionPlanner(players, 0.1)
        tally = crn_run(planner, values, 480, rng.random(480))
        e = planner.estimates()
        phi = np.array([e.steps[p].phi.value for p in players], dtype=float)
        assert phi == pytest.approx(shapley_coefficients(4) @ (tally[:, 1] / tally[:, 0]))
        var = independent_variance(tally, 4)
        naive.append(np.abs(phi - truth) <= z * np.sqrt(var))
        robust.append([e.steps[p].phi.low <= truth[p] <= e.steps[p].phi.high for p in players])
        ratio.append(planner.variance() / var)
    naive_cover, robust_cover = np.mean(naive, axis=0), np.mean(robust, axis=0)
    report = f"independent {naive_cover}, cluster-robust {robust_cover}"
    assert naive_cover[0] <= 0.75, report  # anti-conservative for the step that matters
    assert np.all(naive_cover[1:] >= 0.97), report  # and far too wide for the others
    assert np.all(robust_cover >= 0.85), report
    # The variance the robust interval sees: ~3.7 times the independent one for step 0.
    assert np.mean(ratio, axis=0)[0] >= 2.5, np.mean(ratio, axis=0)


def test_cluster_robust_variance_is_the_heteroscedastic_one_without_shared_seeds() -> None:
    """Independent forks (n = 4, v(S) uniform in [0.2, 0.8], 4,000 forks): giving every fork
    its own seed, or none, gives the same variance, which is exactly
    sum_S a^2 max(pt (1 - pt), s_S^2) / n_S, within 1% of the independent estimator's (its
    terms differ by s^2 / pt (1 - pt) = 1 + O(1 / n_S), n_S >= ~150 here), with a t reference
    within 0.5% of the normal one (thousands of effective clusters)."""
    players = list(range(4))
    rng = np.random.default_rng(31)
    values = rng.uniform(0.2, 0.8, 16)
    seeded, bare = CoalitionPlanner(players, 0.1), CoalitionPlanner(players, 0.1)
    outcomes: dict[int, list[float]] = {}
    fork = 0
    while fork < 4000:
        coalitions = seeded.next_coalitions(64)
        assert bare.next_coalitions(64) == coalitions
        for coalition in coalitions:
            m = sum(1 << p for p in coalition)
            y = float(rng.random() < values[m])
            seeded.update(coalition, y, seed=fork)
            bare.update(coalition, y)
            outcomes.setdefault(m, []).append(y)
            fork += 1
    tally = np.array([[len(outcomes[m]), sum(outcomes[m])] for m in range(16)])
    squares = np.array([np.var(outcomes[m], ddof=1) for m in range(16)])
    forks, bad = tally[:, 0], tally[:, 1]
    p = (bad + 1.0) / (forks + 2.0)
    expected = (shapley_coefficients(4) ** 2 * (np.maximum(p * (1 - p), squares) / forks)).sum(1)
    assert seeded.variance() == pytest.approx(expected, rel=1e-12)
    assert bare.variance() == pytest.approx(expected, rel=1e-12)
    ratio = seeded.variance() / independent_variance(tally, 4)
    assert np.all((ratio >= 1.0) & (ratio <= 1.01)), ratio
    assert np.all(seeded.effective_clusters() >= 1000), seeded.effective_clusters()
    e = seeded.estimates()
    z = float(norm.ppf(0.95))
    for player in players:
        phi = e.steps[player].phi
        assert phi.se is not None
        assert 1.0 <= (phi.high - phi.low) / 2 / (z * phi.se) <= 1.005


def test_cluster_robust_variance_with_every_coalition_at_every_seed() -> None:
    """Every coalition measured once at each of J = 6 seeds: phi is the mean over seeds of the
    per-seed blame h_j = sum_S a[i, S] y[S, j], and the variance is exactly the CR2 one,
    var(h, ddof=1) / J, plus the Laplace floor; there are J effective clusters and the
    interval is phi +- t_{J-1} SE."""
    n, clusters = 3, 6
    players = list(range(n))
    a = shapley_coefficients(n)
    rng = np.random.default_rng(8)
    values = rng.uniform(0.1, 0.9, 1 << n)
    u = rng.random(clusters)
    y = (u[:, None] < values[None, :]).astype(float)  # (seed, coalition)
    planner = CoalitionPlanner(players, 0.1)
    for j in range(clusters):
        for m in range(1 << n):
            planner.update(planner.coalition(m), y[j, m], seed=j)
    h = y @ a.T  # (seed, player)
    p = (y.sum(axis=0) + 1.0) / (clusters + 2.0)
    floor = np.maximum(p * (1 - p) - y.var(axis=0, ddof=1), 0.0) / clusters
    expected = h.var(axis=0, ddof=1) / clusters + a**2 @ floor
    assert planner.variance() == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert planner.effective_clusters() == pytest.approx([clusters] * n, rel=1e-12)
    e = planner.estimates()
    t = float(student_t.ppf(0.95, clusters - 1))
    for i in players:
        phi = e.steps[i].phi
        assert phi.value is not None
        assert phi.value == pytest.approx(h[:, i].mean(), abs=1e-12)
        assert phi.se == pytest.approx(math.sqrt(expected[i]), rel=1e-12)
        half = t * math.sqrt(expected[i])
        assert (phi.low, phi.high) == pytest.approx(
            (max(-1.0, phi.value - half), min(1.0, phi.value + half)), abs=1e-12
        )


def test_one_seed_for_every_fork_gives_no_interval() -> None:
    """Every fork drawn with the same seed is one draw of the whole game: no spread between
    clusters can be measured, so the interval is [-1, 1] and the SE unknown."""
    planner = CoalitionPlanner([0, 1, 2], 0.1)
    for _ in range(20):
        for coalition in subsets([0, 1, 2]):
            planner.update(coalition, float(0 not in coalition), seed=7)
    e = planner.estimates()
    assert [e.steps[p].phi.value for p in (0, 1, 2)] == pytest.approx([1.0, 0.0, 0.0])
    for p in (0, 1, 2):
        assert (e.steps[p].phi.low, e.steps[p].phi.high, e.steps[p].phi.se) == (-1.0, 1.0, None)


def test_kernel_shap_under_common_random_numbers() -> None:
    """Twelve steps, the interaction game of the KernelSHAP coverage test, seeded by
    a counter per coalition (nearly every pair's coalitions are new: nearly every seed is 0)
    and drawn by common random numbers: the sandwich assuming independent pairs covers in
    ~50% of (step, run) cases over 12 runs, the cluster-robust one in >= 85% (it sees about
    one effective cluster and stays wide). With a seed per fork, seeds change nothing."""
    players = list(range(12))

    def v(resampled: frozenset[int]) -> float:
        both = 0 not in resampled and 1 not in resampled
        return 0.15 + 0.8 * float(both) - 0.1 * float(5 in resampled and 7 not in resampled)

    values = [v(frozenset(p for p in players if m >> p & 1)) for m in range(1 << 12)]
    truth = np.zeros(12)
    truth[[0, 1, 5, 7]] = [0.4, 0.4, 0.05, -0.05]
    robust, naive = [], []
    for seed in range(12):
        planner, twin = (
            KernelShapPlanner(players, 0.1, seed=seed),
            KernelShapPlanner(players, 0.1, seed=seed),
        )
        crn_run(planner, values, 2000, np.random.default_rng(seed).random(2000), twin=twin)
        e, e_naive = planner.estimates(), twin.estimates()
        robust += [e.steps[p].phi.low <= truth[p] <= e.steps[p].phi.high for p in players]
        naive += [
            e_naive.steps[p].phi.low <= truth[p] <= e_naive.steps[p].phi.high for p in players
        ]
    assert np.mean(naive) <= 0.7 and np.mean(robust) >= 0.85, (np.mean(naive), np.mean(robust))
    # Independent draws with a seed per fork: exactly the independent-pairs sandwich.
    rng = np.random.default_rng(3)
    seeded, bare = KernelShapPlanner(players, 0.1, seed=1), KernelShapPlanner(players, 0.1, seed=1)
    fork = 0
    for _ in range(40):
        coalitions = seeded.next_coalitions(64)
        assert bare.next_coalitions(64) == coalitions
        for coalition in coalitions:
            y = float(rng.random() < v(coalition))
            seeded.update(coalition, y, seed=fork)
            bare.update(coalition, y)
            fork += 1
    a, b = seeded.estimates(), bare.estimates()
    for p in players:
        assert (a.steps[p].phi.low, a.steps[p].phi.high) == (
            b.steps[p].phi.low,
            b.steps[p].phi.high,
        )
        assert a.steps[p].phi.se == b.steps[p].phi.se
