"""`dormouse ab`'s cost: priced before anything trains from measured history rows of each arm's own
setting (tools/history.py), and the pricing run that turns `--minutes` into each arm's steps.

The cost of evals is an estimate: a forward ≈ FORWARD_SHARE of a training step, times the eval batches
a run walks (every eval_every steps and at the end, then the full held-out walk when evals score a prefix).
"""

import math
import statistics
import tempfile
import time
from pathlib import Path

from dormouse.config import Config
from dormouse.data.sampler import heldout_windows
from dormouse.data.shards import Corpus
from dormouse.tools.history import measured_rows, read_history, setting
from dormouse.train.trainer import Trainer

PRICE_WARMUP, PRICE_STEPS = 1, 5  # the --minutes pricing run: untimed first step (cold start), then timed steps
FORWARD_SHARE = 1 / 3  # an eval forward ≈ a third of a training step (backward ≈ 2 forwards, bench's 6 = 2·(1+2))


def measure_ms_per_step(cfg: Config, corpus: Corpus, note: str) -> float:
    """The median of PRICE_STEPS timed steps after PRICE_WARMUP untimed ones, in a temporary run."""
    with tempfile.TemporaryDirectory(prefix="dormouse-ab-price-") as tmp:
        trainer = Trainer(cfg, corpus, Path(tmp) / "run", corpus_note=note)
        step_ms = []
        for step in range(PRICE_WARMUP + PRICE_STEPS):  # run_loop's clock: train_step ends in .item(), synced
            started = time.perf_counter()
            trainer.train_step(step)
            step_ms.append((time.perf_counter() - started) * 1000)
    return statistics.median(step_ms[PRICE_WARMUP:])


def fitted_steps(ms: dict[str, float], equal: str, *, minutes: float = 0.0, steps: int | None = None) -> dict[str, int]:
    """Each arm's steps at `ms` per step. The budget is `minutes`, else arm A's `steps` (and their time).
    Equal steps: both arms train what the slower one fits in `minutes`, or `steps`. Equal time: each arm
    trains what it fits itself; with `steps`, arm A trains exactly those and B what fits in A's time."""
    if not minutes:
        if equal == "steps":
            return dict.fromkeys(ms, steps)
        return {"a": steps, "b": max(1, round(steps * ms["a"] / ms["b"]))}
    if equal == "time":
        return {arm: max(1, int(minutes * 60_000 // ms[arm])) for arm in ms}
    return dict.fromkeys(ms, max(1, int(minutes * 60_000 // max(ms.values()))))


def one_or_per_arm(steps: dict[str, int]) -> int | dict[str, int]:
    """ab.json's `steps`: one count when both arms train it, else one per arm."""
    return steps["a"] if steps["a"] == steps["b"] else steps


def eval_batches(cfg: Config, corpus: Corpus, steps: int) -> int:
    """Forward batches one run evaluates: an eval every eval_every steps and at the end, then the full walk."""
    t = cfg.train

    def walk(max_bytes: int | None) -> int:
        return sum(1 for _ in heldout_windows(corpus, t.seq_len, t.batch_size, max_bytes))

    per_eval = walk(t.eval_bytes or None)
    return math.ceil(steps / t.eval_every) * per_eval + (walk(None) if t.eval_bytes else 0)


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.2f} h"
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.1f} s"


def price(
    history: Path,
    cfgs: dict[str, Config],
    corpus: Corpus,
    *,
    steps: int | None,
    minutes: float,
    seeds: int,
    equal: str = "steps",
) -> dict:
    """The experiment's cost from measured history rows of each arm's own setting, or why it is unknown."""
    rows = read_history(history)
    found = {}
    for arm, cfg in cfgs.items():
        wanted = setting(cfg)
        matches = measured_rows(rows, wanted)
        if not matches:
            shape = (
                f"batch {wanted['batch']}, seq_len {wanted['seq_len']}, {wanted['dtype']}, arms {wanted['arms']}, "
                f"{wanted['params']} parameters"
            )
            text = (
                f"cost unknown: no bench row for {wanted['device']} {wanted['preset']} ({shape}; arm "
                f"{arm.upper()}) in {history}; `dormouse bench` with that arm's flags measures one"
            )
            if minutes:
                text += f". The training budget alone is {_duration(minutes * 60 * len(cfgs) * seeds)}"
            return {"known": False, "text": text}
        found[arm] = matches[-1]  # the newest
    ms = {arm: float(row["ms_per_step"]) for arm, row in found.items()}
    n = fitted_steps(ms, equal, minutes=minutes, steps=steps)
    train_s = sum(ms[arm] * n[arm] for arm in ms) * seeds / 1000
    forwards = {arm: eval_batches(cfg, corpus, n[arm]) for arm, cfg in cfgs.items()}
    eval_s = sum(ms[arm] * FORWARD_SHARE * forwards[arm] for arm in cfgs) * seeds / 1000
    used = "; ".join(
        f"{arm.upper()} {ms[arm]:.4g} ms/step (row {row['date']} {row['commit']}, {row['log']})"
        for arm, row in found.items()
    )
    if equal == "time":
        budget = f"{minutes:g} min" if minutes else f"arm A's {steps} steps"
        steps_text = f"~{n['a']}/{n['b']} A/B steps (what each arm fits in {budget})"
    elif steps is not None:
        steps_text = f"{steps} steps"
    else:
        steps_text = f"~{n['a']} steps (what the slower arm fits in {minutes:g} min)"
    text = (
        f"cost from {history}: {used}. Training: {len(cfgs)} arms x {seeds} seeds x {steps_text} = "
        f"{_duration(train_s)}; evals ≈ {_duration(eval_s)} (estimate: a forward ≈ 1/3 of a step, "
        f"{forwards['a']}/{forwards['b']} eval batches per A/B run); total ≈ {_duration(train_s + eval_s)}"
    )
    return {
        "known": True,
        "text": text,
        "rows": found,
        "steps": one_or_per_arm(n),
        "train_s": train_s,
        "eval_s": eval_s,
    }
