"""jobs/support_refund with every model step worded 1000 ways (a re-draw almost never
repeats the recorded words, as with a real model): the same decisions with the same
probabilities, so the same exact values (`car_ray.sim.noisy_variant`)."""

from car_ray.sim import noisy_variant

POLICY, SCENARIO = noisy_variant("support_refund", wordings=1000)
