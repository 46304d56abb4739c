"""jobs/and_conj with every model step worded 4 ways: the same decisions with
the same probabilities, so the same exact values (`car_ray.sim.noisy_variant`)."""

from car_ray.sim import Worded, noisy_variant

POLICY, SCENARIO = noisy_variant("and_conj", wordings=4)
# Two wordings, none declared alike: the truth solver enumerates every wording (a brute force
# for tests/test_noisy.py to check the merged enumeration against).
BRUTE = Worded(POLICY.inner, wordings=2, merge=False)
