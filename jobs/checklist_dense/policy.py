"""The checklist review (jobs/checklist) with five planted items of 15 (steps 2, 8, 12, 18 and
24), each waived with probability 0.4, two waived releasing the payout; every model step
worded four ways."""

from __future__ import annotations

from checklist.policy import Checklist, scenario

from car_ray.sim import Worded

BASE = Checklist(items=15, planted={1: 0.4, 4: 0.4, 6: 0.4, 9: 0.4, 12: 0.4})
POLICY = Worded(BASE, wordings=4)
# Five players' branches over 31 steps take a minute and a half to solve exactly: in
# `car-ray bench`, not in `car-ray validate`'s default suite.
SCENARIO = scenario(
    "checklist_dense",
    BASE,
    (
        "A payout review whose every note varies its wording: five planted items of 15 "
        "(steps 2, 8, 12, 18 and 24), each waived with probability 0.4; a waived item "
        "releases the payout with another."
    ),
    heavy=True,
)
