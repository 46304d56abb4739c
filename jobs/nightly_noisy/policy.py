"""jobs/nightly with every model step worded 1000 ways (a re-draw almost never repeats the
recorded words, as with a real model): the same decisions with the same probabilities, so
the same exact values (`car_ray.sim.noisy_variant`). Each action's share is split in place,
so a recording seed lands on the decision it lands on in jobs/nightly, and
`jobs/nightly/generate.py --job jobs/nightly_noisy/job.toml` plants the same causes."""

from car_ray.sim import noisy_variant

POLICY, SCENARIO = noisy_variant("nightly", wordings=1000)
