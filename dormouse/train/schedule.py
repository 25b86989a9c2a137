"""The learning-rate schedule: one multiplier of every group's base lr, a pure function of the step.

Step counting: `step` is the number of optimizer updates already taken, so the first update is step 0
and the last of a `steps`-step run is step `steps − 1`. The trainer calls `set_lr(lr_multiplier(step,
cfg))` right before update `step`.

    warm-up   step < W:            (step + 1) / (W + 1)        (nanoGPT's form: the first update is never lr 0)
    decay     W ≤ step ≤ S − 1:    p = (step − W) / (S − 1 − W) from 0 to 1
              cosine   floor + (1 − floor) · ½ (1 + cos πp)
              linear   floor + (1 − floor) · (1 − p)
              constant 1
    after     step ≥ S − 1:        floor (constant: 1)

with W = warmup_steps, S = steps, floor = lr_floor. Warm-up reaches W/(W+1) at its last step, the peak
1 is at step W, and the last update of the run is taken at exactly `lr_floor`. When the warm-up
covers the whole run (W ≥ S − 1) there is no decay phase: steps from W on run at the peak.
"""

import math


def lr_multiplier(step: int, cfg) -> float:
    """Multiplier of the base lr for update `step` (0-based); `cfg` has warmup_steps, steps, lr_decay, lr_floor."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    warmup, last, floor = cfg.warmup_steps, cfg.steps - 1, cfg.lr_floor
    if cfg.lr_decay not in ("cosine", "linear", "constant"):
        raise ValueError(f"unknown lr_decay {cfg.lr_decay!r}; choose cosine, linear or constant")
    if step < warmup:
        return (step + 1) / (warmup + 1)
    if cfg.lr_decay == "constant" or last <= warmup:
        return 1.0
    p = min(1.0, (step - warmup) / (last - warmup))
    if cfg.lr_decay == "cosine":
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * p))
    return floor + (1.0 - floor) * (1.0 - p)
