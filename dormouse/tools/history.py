"""A history TSV as data: the rows `dormouse bench` (and `dormouse ab --record`) appended, and those
that measured one setting. The checkout's own measured rows are rows.COMMITTED (evidence/history.tsv):
`dormouse ab` prices from it unless told another file; nothing writes there unless told to.

A row measures a setting only when its device (torch's name, the CPU thread count included), preset,
batch, seq_len, dtype, arms and parameter count are the setting's, it timed dormouse itself,
uncompiled, and its ms_per_step is a number. The parameter count catches what the other columns do
not record (a --d-model on top of a preset, say). A figure from another device, preset or shape is
never used, however close.

A row of `dormouse ab --record` (its `heldout_bpb` a number) is a measurement too: its ms_per_step is
the median of `Trainer.train_step` over every training step of the arm, the step bench times, on a
resolved arm config whose setting is these same cells (docs/ab-protocol.md, Recording).
"""

import csv
import math
from pathlib import Path

import torch

from dormouse.config import Config
from dormouse.model.model import DormouseLM
from dormouse.tools.bench.device import device_name
from dormouse.tools.bench.rows import arms

MATCHED = ("device", "preset", "batch", "seq_len", "dtype", "arms", "params")


def read_history(path: str | Path) -> list[dict[str, str]]:
    """The rows of a history TSV in file order (oldest first); none when the file does not exist."""
    path = Path(path)
    if not path.is_file():
        return []
    with open(
        path, newline="", encoding="utf-8"
    ) as f:  # bench writes no quoting: a cell never holds a tab or a newline
        return list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))


def setting(cfg: Config) -> dict[str, str]:
    """The MATCHED cells a bench of `cfg` on this machine would write (the model is built on the CPU to count
    its parameters: seconds for `base`, nothing beside the runs it prices)."""
    t = cfg.train
    return {
        "device": device_name(torch.device(t.device)),
        "preset": cfg.preset,
        "batch": str(t.batch_size),
        "seq_len": str(t.seq_len),
        "dtype": t.dtype,
        "arms": arms(cfg),
        "params": str(DormouseLM(cfg.model, seed=t.seed).num_params()),
    }


def measured_rows(rows: list[dict[str, str]], wanted: dict[str, str]) -> list[dict[str, str]]:
    """The rows that measured `wanted` (a dict of MATCHED cells), oldest first."""
    return [
        r
        for r in rows
        if r.get("model") == "dormouse"
        and r.get("compiled") == "no"
        and all(r.get(k) == wanted[k] for k in MATCHED)
        and _is_number(r.get("ms_per_step", "-"))
    ]


def _is_number(cell: str) -> bool:
    try:
        return math.isfinite(float(cell)) and float(cell) > 0
    except ValueError:
        return False
