"""`dormouse train --record`: one history row for a whole training run, so a run's held-out
number (a recipe's, say) is a row as the A/B arms' are, not only a line in its log.

The row is an `ab --record` row of one run (docs/ab-protocol.md, Recording): `model` dormouse, the
setting cells of the run's resolved config (so it prices that setting for `dormouse ab` too),
`ms_per_step` the median of every step this process ran (the first, cold one included; resumed steps of
an earlier process are not in it), `first_step_s` this process's first step, `heldout_bpb` the best
eval's score (the run's result, as its last line says; of the weight average under `ema_decay`), `seeds`
1. The note names the run and its best step, and carries every eval's bpb and the wall time since
dormouse's import (start-up included).
"""

import datetime
from pathlib import Path

from dormouse.config import Config
from dormouse.tools.bench.device import fla_version
from dormouse.tools.bench.rows import COLUMNS, cell, shown_path, timing_columns
from dormouse.tools.history import setting


def train_row(cfg: Config, step_ms: list[float], evals: list[dict], *, run: Path, commit: str, torch_version: str):
    """The history row of a run of `cfg` whose steps took `step_ms` and whose eval records are `evals`
    (metrics.jsonl's, in order; the lowest bpb is the score, the earliest of equals)."""
    if not step_ms or not evals:
        raise ValueError("a run row needs at least one timed step and one eval")
    t, last = cfg.train, evals[-1]
    best = min(evals, key=lambda e: e["bpb"])
    curve = " ".join(f"{e['step']}:{e['bpb']:.4f}" for e in evals)
    weights = f" ({last['weights']} weights)" if "weights" in last else ""
    note = (
        f"train {shown_path(run)}: best at step {best['step']}; held-out bpb{weights} by step {curve}; "
        f"wall {last['wall_s']:.1f} s since import"
    )
    row = dict.fromkeys(COLUMNS, "-")
    row.update(
        {
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "commit": commit,
            "model": "dormouse",
            **setting(cfg),  # device, preset, batch, seq_len, dtype, arms, params
            "compiled": "no",
            **timing_columns([ms / 1000 for ms in step_ms], 0, t.batch_size * t.seq_len, None, None),
            "torch": torch_version,
            "fla": fla_version(),
            "log": shown_path(run / "metrics.jsonl"),
            "note": note,
            "heldout_bpb": f"{best['bpb']:.6f}",
            "seeds": "1",
        }
    )
    return {k: cell(v) for k, v in row.items()}
