"""The rules of the held mechanism, one file each: the sign test, the paired t interval, the
clearance bound, the stopping rule built from them, the Shapley window and the answering
rule. Each says in its docstring what it guarantees; `.._tuning` says why its numbers are
what they are."""

from __future__ import annotations

from ._answering import Answering, earlier_if_blameless, later_always
from ._clearance import clean_to_clear, product_threshold
from ._separation import Failing, Judgement, Look, SignAndT, StopRule, split
from ._sign_test import sign_passes, signs_after, signs_agree
from ._t_interval import apart, mean_interval, mean_lower, seeds_needed
from ._window import FixedWindow, NarrowingWindow, ShapleyWindow, WindowLook

__all__ = [
    "Answering",
    "Failing",
    "FixedWindow",
    "Judgement",
    "Look",
    "NarrowingWindow",
    "ShapleyWindow",
    "SignAndT",
    "StopRule",
    "WindowLook",
    "apart",
    "clean_to_clear",
    "earlier_if_blameless",
    "later_always",
    "mean_interval",
    "mean_lower",
    "product_threshold",
    "seeds_needed",
    "sign_passes",
    "signs_after",
    "signs_agree",
    "split",
]
