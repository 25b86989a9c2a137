"""`--steps auto`: a step budget fitted to the corpus and the model (docs/training.md, Step budget).

    bytes  = min(EPOCHS · training bytes, BYTES_PER_PARAM · parameters)
    steps  = max(1, round(bytes / (batch_size · seq_len)))

A small corpus is the limit: past some passes the model memorises it and the held-out score turns up, so
the budget is EPOCHS passes over it. On a large corpus the budget is BYTES_PER_PARAM bytes per parameter,
set past the point where the held-out score turns up for the recipe's model: early stopping (`--patience`)
then ends the run at its best, as it does any run that turns up sooner. The schedule (warm-up, cosine to
the floor) spans the chosen steps.

EPOCHS is the recipe's budget on tiny shakespeare, 2500 steps of 16 KiB on its 1,003,854 training bytes.
On the validation slice 2500 steps came within 0.0023 bpb of the best budget tried (3000 steps, best at
2750) and 0.0157 bpb under 2000 (evidence/recipe-sweep.json). BYTES_PER_PARAM: on python-stdlib the
recipe's `small` with the large-corpus settings gave 0.7781, 0.7453 and 0.7274 bpb at 10, 20 and 40 bytes
per parameter; the 40 run's best came at 32 bytes per parameter (16.2 passes) and early stopping ended
it at 38 (evidence/budget-small-python-stdlib.json). A model far smaller than its corpus is still
improving there: `nano` on python-stdlib gained 0.0811 bpb from 40 to 80
(evidence/budget-nano-python-stdlib.json).
"""

from dataclasses import replace

from dormouse.config import STEPS_AUTO, Config

EPOCHS = 40.8
BYTES_PER_PARAM = 40.0


def auto_steps(train_bytes: int, params: int, step_bytes: int) -> int:
    """The steps of `--steps auto` for a corpus of `train_bytes` training bytes and a model of `params`
    parameters, training `step_bytes` bytes per step."""
    budget = min(EPOCHS * train_bytes, BYTES_PER_PARAM * params)
    return max(1, round(budget / step_bytes))


def resolved(cfg: Config, train_bytes: int, params: int) -> tuple[Config, str | None]:
    """`cfg` with `--steps auto` replaced by its steps, and the line that says how they were chosen (None
    when the steps were given)."""
    t = cfg.train
    if t.steps != STEPS_AUTO:
        return cfg, None
    step_bytes = t.batch_size * t.seq_len
    steps = auto_steps(train_bytes, params, step_bytes)
    by_data = EPOCHS * train_bytes <= BYTES_PER_PARAM * params
    rule = (
        f"{EPOCHS:g} epochs of {train_bytes:,} training bytes"
        if by_data
        else f"{BYTES_PER_PARAM:g} bytes per parameter × {params:,} parameters"
    )
    note = f"steps auto: {steps} ({rule}, at {step_bytes:,} bytes a step; docs/training.md, Step budget)"
    return Config(model=cfg.model, train=replace(t, steps=steps), preset=cfg.preset), note
