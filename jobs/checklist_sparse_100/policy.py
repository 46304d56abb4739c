"""The checklist review (jobs/checklist) with two planted items of 50 (steps 22 and 74), waived
with probability 0.7 and 0.5; every model step worded four ways."""

from __future__ import annotations

from checklist.policy import Checklist, scenario

from car_ray.sim import Worded

BASE = Checklist(items=50, planted={11: 0.7, 37: 0.5})
POLICY = Worded(BASE, wordings=4)
# A hundred steps (or five players' worth of branches) take minutes to solve exactly: in
# `car-ray bench`, not in `car-ray validate`'s default suite.
SCENARIO = scenario(
    "checklist_sparse_100",
    BASE,
    (
        "A payout review whose every note varies its wording: two planted items of 50 "
        "(steps 22 and 74), waived with probability 0.7 and 0.5; a waived item releases "
        "the payout."
    ),
    heavy=True,
)
