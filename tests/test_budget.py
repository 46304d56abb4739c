"""The budget ledger: spent + reserved never exceeds a cap, whatever happens to the forks."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    precondition,
    rule,
)

from car_ray.schedule import (
    Budget,
    BudgetError,
    BudgetGovernor,
    Cost,
    ReservationExceeded,
)

NANO = 1_000_000_000


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def nano(usd: float) -> int:
    return round(usd * NANO)


# -- the property: random caps, costs, failures, retries and interleavings --------------------

# Dollars are drawn in whole micro-dollars so the test's own model is exact integer arithmetic.
micro_usd = st.integers(0, 5_000)
caps = st.one_of(st.none(), st.integers(0, 40))
usd_caps = st.one_of(st.none(), st.integers(0, 60_000))


class LedgerMachine(RuleBasedStateMachine):
    """Drives one governor like a scheduler would (reserve, settle, lose, retry, time passes)
    and checks it against an exact model after every step."""

    open_keys = Bundle("open_keys")

    @initialize(
        max_forks=caps,
        max_usd_micro=usd_caps,
        max_tokens=st.one_of(st.none(), st.integers(0, 200_000)),
        max_wall_s=st.one_of(st.none(), st.floats(1.0, 100.0)),
        already_forks=st.integers(0, 5),
        already_micro=st.integers(0, 2_000),
    )
    def start(
        self,
        max_forks: int | None,
        max_usd_micro: int | None,
        max_tokens: int | None,
        max_wall_s: float | None,
        already_forks: int,
        already_micro: int,
    ) -> None:
        self.clock = FakeClock()
        self.budget = Budget(
            max_forks=max_forks,
            max_usd=None if max_usd_micro is None else max_usd_micro / 1e6,
            max_tokens=max_tokens,
            max_wall_s=max_wall_s,
        )
        self.cap = (
            max_forks,
            None if max_usd_micro is None else max_usd_micro * 1000,
            max_tokens,
        )
        already = Cost(already_forks, already_micro / 1e6, 0)
        self.gov = BudgetGovernor(self.budget, already_spent=already, clock=self.clock)
        self.spent = [already_forks, already_micro * 1000, 0]
        self.reserved = [0, 0, 0]
        self.open: dict[str, tuple[int, int, int]] = {}
        self.attempts: dict[str, int] = {}
        self.lost_tasks: list[str] = []
        self.next_task = 0
        # Resumed spend may already be over a (new) cap: then nothing more may be added.
        self.start_over = [
            cap is not None and self.spent[d] > cap for d, cap in enumerate(self.cap)
        ]

    def _fits(self, vec: tuple[int, int, int]) -> bool:
        wall = self.budget.max_wall_s
        if wall is not None and self.gov.elapsed_s >= wall:
            return False
        return all(
            cap is None or self.spent[d] + self.reserved[d] + vec[d] <= cap
            for d, cap in enumerate(self.cap)
        )

    def _reserve(self, key: str, forks: int, micro: int, tokens: int) -> str | None:
        vec = (forks, micro * 1000, tokens)
        expected = self._fits(vec)
        ok = self.gov.try_reserve(key, Cost(forks, micro / 1e6, tokens))
        assert ok == expected, (key, vec, self.gov.snapshot())
        if not ok:
            assert self.gov.last_refusal is not None
            return None
        self.open[key] = vec
        for d in range(3):
            self.reserved[d] += vec[d]
        return key

    @rule(
        target=open_keys,
        forks=st.integers(0, 2),
        micro=micro_usd,
        tokens=st.integers(0, 20_000),
    )
    def reserve_new_fork(self, forks: int, micro: int, tokens: int) -> str:
        task = f"task{self.next_task}"
        self.next_task += 1
        self.attempts[task] = 0
        key = self._reserve(f"{task}#0", forks, micro, tokens)
        return key or "refused"

    @precondition(lambda self: bool(self.lost_tasks))
    @rule(
        target=open_keys,
        forks=st.integers(0, 2),
        micro=micro_usd,
        tokens=st.integers(0, 20_000),
    )
    def retry_lost_fork(self, forks: int, micro: int, tokens: int) -> str:
        task = self.lost_tasks.pop(0)
        self.attempts[task] += 1
        key = self._reserve(f"{task}#{self.attempts[task]}", forks, micro, tokens)
        return key or "refused"

    @rule(key=consumes(open_keys), fraction=st.floats(0.0, 1.0))
    def settle(self, key: str, fraction: float) -> None:
        if key not in self.open:
            return
        forks, nanos, tokens = self.open.pop(key)
        # The executor stops a fork at its reservation: actual <= estimate, dimension-wise.
        micro = (nanos // 1000) * fraction
        actual = (forks if fraction > 0.5 else 0, int(micro) * 1000, int(tokens * fraction))
        self.gov.settle(key, Cost(actual[0], actual[1] / NANO, actual[2]))
        for d in range(3):
            self.reserved[d] -= (forks, nanos, tokens)[d]
            self.spent[d] += actual[d]

    @rule(key=consumes(open_keys))
    def lose(self, key: str) -> None:
        if key not in self.open:
            return
        vec = self.open.pop(key)
        self.gov.lose(key)
        for d in range(3):
            self.reserved[d] -= vec[d]
            self.spent[d] += vec[d]
        self.lost_tasks.append(key.split("#")[0])

    @rule(seconds=st.floats(0.0, 30.0))
    def time_passes(self, seconds: float) -> None:
        self.clock.now += seconds

    @invariant()
    def never_over_a_cap(self) -> None:
        spent, reserved = self.gov.spent, self.gov.reserved
        used = (
            spent.forks + reserved.forks,
            nano(spent.usd) + nano(reserved.usd),
            spent.tokens + reserved.tokens,
        )
        for d, cap in enumerate(self.cap):
            if cap is not None and not self.start_over[d]:
                assert used[d] <= cap, (d, used, self.cap)
        if self.budget.max_usd is not None and not self.start_over[1]:
            # What a user reads in job.json, in floating-point dollars.
            assert spent.usd + reserved.usd <= self.budget.max_usd + 1e-12

    @invariant()
    def totals_match_the_model(self) -> None:
        spent, reserved = self.gov.spent, self.gov.reserved
        assert (spent.forks, nano(spent.usd), spent.tokens) == tuple(self.spent)
        assert (reserved.forks, nano(reserved.usd), reserved.tokens) == tuple(self.reserved)
        assert self.gov.in_flight == len(self.open)
        left = self.gov.remaining()
        for d, value in enumerate((left.forks, left.usd, left.tokens)):
            cap = self.cap[d]
            if cap is None:
                assert value is None
            else:
                assert value is not None
                expected = max(0, cap - self.spent[d] - self.reserved[d])
                assert (nano(value) if d == 1 else value) == expected


LedgerMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestLedger = LedgerMachine.TestCase


# -- each rule on its own ---------------------------------------------------------------------


def test_a_reservation_that_would_cross_any_cap_is_refused_and_changes_nothing() -> None:
    gov = BudgetGovernor(Budget(max_forks=10, max_usd=1.0, max_tokens=1000), clock=FakeClock())
    assert gov.try_reserve("a#0", Cost(1, 0.6, 100))
    before = gov.snapshot()
    assert not gov.try_reserve("b#0", Cost(1, 0.5, 100))
    assert gov.last_refusal is not None and gov.last_refusal.startswith("max_usd")
    assert "would exceed the cap $1" in gov.last_refusal
    assert gov.snapshot() == before
    assert not gov.try_reserve("c#0", Cost(1, 0.1, 901))
    assert gov.refusal(Cost(1, 0.1, 901)) is not None
    assert gov.try_reserve("d#0", Cost(1, 0.4, 900))  # exactly at both caps: fits
    assert gov.refusal(Cost(0, 0.0, 0)) is None
    assert gov.exhausted == "max_usd"


def test_exact_fits_are_not_lost_to_floating_point() -> None:
    # 0.1 + 0.2 > 0.3 in floats; the nano-dollar ledger must still let both fit under 0.3.
    gov = BudgetGovernor(Budget(max_usd=0.3))
    assert gov.try_reserve("a#0", Cost(1, 0.1))
    assert gov.try_reserve("b#0", Cost(1, 0.2))
    assert not gov.try_reserve("c#0", Cost(1, 1e-9))
    # Many small costs do not drift: ten dimes make exactly the dollar cap, and not a cent more.
    gov = BudgetGovernor(Budget(max_usd=1.0))
    for i in range(10):
        assert gov.try_reserve(f"t{i}#0", Cost(1, 0.1))
    assert not gov.try_reserve("t10#0", Cost(1, 1e-9))
    for i in range(10):
        gov.settle(f"t{i}#0", Cost(1, 0.1))
    assert gov.spent.usd == 1.0
    assert gov.remaining().usd == 0.0


def test_settle_releases_the_reservation_and_books_the_actual_cost() -> None:
    gov = BudgetGovernor(Budget(max_forks=2, max_usd=1.0))
    assert gov.try_reserve("a#0", Cost(1, 0.5, 500))
    gov.settle("a#0", Cost(1, 0.125, 200))
    assert gov.spent == Cost(1, 0.125, 200)
    assert gov.reserved == Cost()
    assert gov.remaining().forks == 1
    assert gov.remaining().usd == 0.875
    assert gov.remaining().tokens is None


def test_a_lost_attempt_counts_its_whole_reservation_and_its_retry_needs_a_new_key() -> None:
    gov = BudgetGovernor(Budget(max_forks=3, max_usd=1.0))
    assert gov.try_reserve("t#0", Cost(1, 0.4))
    gov.lose("t#0")
    assert gov.spent == Cost(1, 0.4)
    with pytest.raises(BudgetError, match=r"'t#0' is already used \(lost\).*own key"):
        gov.try_reserve("t#0", Cost(1, 0.4))
    assert gov.try_reserve("t#1", Cost(1, 0.4))
    gov.lose("t#1")
    assert not gov.try_reserve("t#2", Cost(1, 0.4))  # two losses used 0.8 of 1.0
    assert gov.snapshot()["lost"] == 2


def test_a_released_reservation_spent_nothing_and_its_key_may_be_reserved_again() -> None:
    # Another ledger (the run loop's shared budget) refused the fork: it never started.
    gov = BudgetGovernor(Budget(max_forks=1))
    assert gov.try_reserve("t#0", Cost(1, 0.4))
    gov.release("t#0")
    assert gov.spent == Cost() and gov.reserved == Cost() and gov.in_flight == 0
    assert gov.try_reserve("t#0", Cost(1, 0.4))
    with pytest.raises(BudgetError, match="never reserved"):
        gov.release("u#0")


def test_unknown_and_reused_keys_are_errors() -> None:
    gov = BudgetGovernor(Budget())
    with pytest.raises(BudgetError, match="never reserved"):
        gov.settle("nope", Cost(1))
    with pytest.raises(BudgetError, match="never reserved"):
        gov.lose("nope")
    assert gov.try_reserve("a#0", Cost(1))
    with pytest.raises(BudgetError, match=r"already used \(in flight\)"):
        gov.try_reserve("a#0", Cost(1))
    gov.settle("a#0", Cost(1))
    with pytest.raises(BudgetError, match="already settled"):
        gov.settle("a#0", Cost(1))
    with pytest.raises(BudgetError, match="already settled"):
        gov.lose("a#0")


def test_a_fork_that_spends_more_than_it_reserved_is_recorded_and_reported() -> None:
    gov = BudgetGovernor(Budget(max_usd=1.0))
    assert gov.try_reserve("a#0", Cost(1, 0.5, 100))
    with pytest.raises(ReservationExceeded, match=r"'a#0' spent more.*usd \$0.7 > reserved \$0.5"):
        gov.settle("a#0", Cost(1, 0.7, 100))
    # The ledger tells the truth about the money, and the key is closed.
    assert gov.spent == Cost(1, 0.7, 100)
    assert gov.reserved == Cost()
    assert gov.in_flight == 0


def test_costs_must_be_whole_and_non_negative() -> None:
    gov = BudgetGovernor(Budget())
    with pytest.raises(BudgetError, match="must not be negative"):
        gov.try_reserve("a#0", Cost(1, -0.5))
    with pytest.raises(BudgetError, match="whole forks and tokens"):
        gov.try_reserve("a#0", Cost(1.5, 0.1))  # type: ignore[arg-type]
    with pytest.raises(BudgetError, match="finite dollars"):
        gov.try_reserve("a#0", Cost(1, float("nan")))
    assert gov.in_flight == 0
    with pytest.raises(ValueError, match="max_usd must be a finite number >= 0"):
        Budget(max_usd=-1.0)


def test_wall_time_ends_reservations() -> None:
    clock = FakeClock()
    gov = BudgetGovernor(Budget(max_wall_s=10.0), already_elapsed_s=4.0, clock=clock)
    assert gov.try_reserve("a#0", Cost(1))
    assert gov.remaining().wall_s == 6.0
    clock.now += 6.0
    assert not gov.try_reserve("b#0", Cost(1))
    assert gov.last_refusal == "max_wall_s: 10.0 s of wall time are used up"
    assert gov.exhausted == "max_wall_s"
    gov.settle("a#0", Cost(1))  # forks in flight still settle after the deadline
    assert gov.spent.forks == 1


def test_a_resumed_job_starts_from_its_spend_even_above_a_new_cap() -> None:
    gov = BudgetGovernor(Budget(max_forks=100), already_spent=Cost(120, 3.0, 9))
    assert gov.exhausted == "max_forks"
    assert not gov.try_reserve("a#0", Cost(1))
    assert gov.remaining().forks == 0
    gov = BudgetGovernor(Budget(max_forks=100), already_spent=Cost(60))
    assert gov.remaining().forks == 40


def test_carried_reservations_hold_the_cap_but_are_not_spent() -> None:
    gov = BudgetGovernor(
        Budget(max_usd=1.0), already_spent=Cost(3, 0.25, 0), carried=Cost(2, 0.5, 0)
    )
    assert gov.spent.usd == 0.25 and gov.carried.usd == 0.5
    assert gov.remaining().usd == 0.25
    assert not gov.try_reserve("a#0", Cost(1, 0.3))
    assert "carried $0.5" in (gov.last_refusal or "")
    assert gov.snapshot()["carried"] == {"forks": 2, "usd": 0.5, "tokens": 0}


def test_a_stopped_ledger_refuses_new_forks_and_settles_those_in_flight() -> None:
    gov = BudgetGovernor(Budget(max_forks=10))
    assert gov.try_reserve("a#0", Cost(1))
    gov.stop("interrupted")
    assert not gov.try_reserve("b#0", Cost(1))
    assert gov.last_refusal == "interrupted"
    gov.settle("a#0", Cost(1))
    assert gov.spent.forks == 1 and gov.in_flight == 0


def test_snapshot_is_plain_json_and_agrees_with_the_ledger() -> None:
    clock = FakeClock()
    gov = BudgetGovernor(Budget(max_forks=5, max_usd=2.0), clock=clock)
    gov.try_reserve("a#0", Cost(1, 0.5, 10))
    gov.try_reserve("b#0", Cost(1, 0.5, 10))
    gov.settle("a#0", Cost(1, 0.25, 7))
    gov.lose("b#0")
    gov.try_reserve("c#0", Cost(1, 0.5, 10))
    clock.now += 2.5
    snap = json.loads(json.dumps(gov.snapshot()))
    assert snap == {
        "caps": {"max_forks": 5, "max_usd": 2.0, "max_tokens": None, "max_wall_s": None},
        "spent": {"forks": 2, "usd": 0.75, "tokens": 17},
        "reserved": {"forks": 1, "usd": 0.5, "tokens": 10},
        "carried": {"forks": 0, "usd": 0.0, "tokens": 0},
        "open": {"c#0": {"forks": 1, "usd": 0.5, "tokens": 10}},
        "remaining": {"forks": 2, "usd": 0.75, "tokens": None, "wall_s": None},
        "in_flight": 1,
        "settled": 1,
        "lost": 1,
        "elapsed_s": 2.5,
        "exhausted": None,
        # a#0 reserved $0.5 and settled $0.25: reserved / settled is 2.
        "reservations": {
            "forks": 1,
            "reserved": {"forks": 0, "usd": 0.5, "tokens": 10},
            "settled": {"forks": 0, "usd": 0.25, "tokens": 7},
            "median_ratio": 2.0,
            "ratio_of": "usd",
        },
    }


def test_cost_is_a_vector() -> None:
    assert Cost(1, 0.5, 10) + Cost(2, 0.25, 5) == Cost(3, 0.75, 15)
    assert Cost(3, 0.75, 15) - Cost(2, 0.25, 5) == Cost(1, 0.5, 10)
    assert Cost().as_dict() == {"forks": 0, "usd": 0.0, "tokens": 0}
