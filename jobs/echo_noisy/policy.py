"""jobs/echo with every model step worded 4 ways: the same decisions with
the same probabilities, so the same exact values (`car_ray.sim.noisy_variant`)."""

from car_ray.sim import noisy_variant

POLICY, SCENARIO = noisy_variant("echo", wordings=4)
