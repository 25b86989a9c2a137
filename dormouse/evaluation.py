"""Held-out bits per byte and the eval line. Used by the trainer, `dormouse eval` and the tools.

The eval scores the held-out split through the same forward the trainer runs (same model, same
inputs: byte windows, memory slots prepended), walking it in order without overlap
(`data.sampler.heldout_windows`): every held-out byte after the first is scored once, or the fixed
prefix of `eval_bytes` bytes. bpb = total cross-entropy in nats / scored bytes / ln 2.
"""

import json
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from dormouse import counters, ledger
from dormouse.data.sampler import count_heldout_targets, heldout_windows
from dormouse.data.shards import Corpus
from dormouse.errors import DormouseError
from dormouse.model import fla_kernels


class NonFiniteError(DormouseError):
    """A loss or a score is NaN or infinite: the run stops here, and nothing is saved from this state."""


@dataclass
class HeldOut:
    ce: float  # nats per byte
    bytes: int
    engram: str = "off"  # distinct rows read / lookups over the whole eval, all memories ("off": arm off)

    @property
    def bpb(self) -> float:
        return self.ce / math.log(2)


@torch.no_grad()
def heldout_score(model, corpus: Corpus, *, seq_len: int, batch_size: int, eval_bytes: int, device, autocast):
    """Mean cross-entropy over the held-out walk; refuses a non-finite result."""
    was_training = model.training
    model.eval()
    total, scored, engram = 0.0, 0, None
    for x, y in heldout_windows(corpus, seq_len, batch_size, eval_bytes or None):
        x, y = x.to(device), y.to(device)
        with autocast():
            out = model(x)
        logits = out.logits
        if out.engram is not None:  # the same forward as training: the memories' keys come from x
            engram = out.engram if engram is None else engram + out.engram  # rows: a union over batches
        total += F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="sum").item()
        scored += y.numel()
    model.train(was_training)
    expected = count_heldout_targets(corpus, eval_bytes or None)
    if scored != expected:
        raise AssertionError(f"held-out walk scored {scored} bytes, expected {expected}")
    ce = total / scored
    if not math.isfinite(ce):
        raise NonFiniteError(f"held-out cross-entropy is {ce} over {scored} bytes: not a score")
    return HeldOut(ce=ce, bytes=scored, engram="off" if engram is None else str(engram))


def eval_record(step: int, held: HeldOut, *, train_ce, tokens, ms_per_step, depth, stress) -> dict:
    """One eval as a dict (metrics.jsonl); `eval_line` prints it. Kernel and fallback counters are read here."""
    fla_kernels.count_unpinned()  # kernel choices made by timing since the last eval join `fallbacks=`
    return {
        "kind": "eval",
        "step": step,
        "bpb": held.bpb,
        "ce": held.ce,
        "train_ce": train_ce,
        "tokens": tokens,
        "heldout_bytes": held.bytes,
        "ms_per_step": ms_per_step,
        "kda": str(counters.KDA),
        "norm": str(counters.NORM),
        "engram": held.engram,
        "depth": depth,
        "fallbacks": ledger.counted_summary(),
        "stress": stress,
    }


def depth_field(cfg, depths: list[int] | None = None) -> int | str:
    """The eval line's `depth=`: what training ran. The config's depth, or under --rand-depth the sampled
    range and the mean depth of the training steps since the previous eval (`1..2(mean1.50)`); the
    eval itself always runs the full depth."""
    m, t = cfg.model, cfg.train
    if not t.rand_depth:
        return m.depth
    mean = f"(mean{sum(depths) / len(depths):.2f})" if depths else ""
    return f"{t.rand_depth_min}..{m.depth}{mean}"


def _fmt(value) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.4f}" if abs(value) < 1e4 else f"{value:.4g}"
    return str(value)


def eval_line(record: dict) -> str:
    keys = ("step", "bpb", "ce", "train_ce", "tokens", "ms_per_step", "kda", "norm", "engram", "depth", "fallbacks")
    fields = " ".join(f"{k}={_fmt(record[k])}" for k in keys)
    return f"eval {fields} {record['stress']}"


def append_jsonl(path, record: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")
