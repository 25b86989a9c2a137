"""Held-out bits per byte and the eval line. Used by the trainer, `dormouse eval` and the tools.

The eval scores the held-out split through the same forward the trainer runs (same model, same
inputs: byte windows, memory slots prepended), walking it in order without overlap
(`data.sampler.heldout_windows`): every held-out byte after the first is scored once, or the fixed
prefix of `eval_bytes` bytes. bpb = total cross-entropy in nats / scored bytes / ln 2. The auxiliary
objectives (`dspark`, `jepa`) are scored on the same windows, each a mean over its own windows
(anchors, spans): `n/a` when no window fits, `off` when its weight is 0. Every number of an eval is
checked: a NaN or infinite one stops with a NonFiniteError naming the term, never printed as a score. Under data
parallelism the ranks share the walk's batches and add the per-batch sums in batch order, so the score
does not depend on the world size.
"""

import json
import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from tqdm import tqdm

from dormouse import counters, ledger, metrics
from dormouse.data.sampler import count_heldout_batches, count_heldout_targets, heldout_shapes, heldout_windows
from dormouse.data.shards import Corpus
from dormouse.errors import DormouseError
from dormouse.model import dspark, jepa
from dormouse.model.engram import EngramStats
from dormouse.ops.fla import pin as fla_pin
from dormouse.parallel.engram_shard import idle_lookups
from dormouse.parallel.fsdp import is_sharded
from dormouse.parallel.world import World

ALONE = World()  # one process: every collective is the identity
PROGRESS_AFTER_S = 2.0  # an eval shorter than this shows no bar
AUX_TERMS = ("dspark", "jepa")  # the auxiliary objectives the eval scores on the held-out windows


class NonFiniteError(DormouseError):
    """A loss or a score is NaN or infinite: the run stops here, and nothing is saved from this state."""


@dataclass
class HeldOut:
    ce: float  # nats per byte
    bytes: int
    engram: str = "off"  # distinct rows read / lookups over the whole eval, all memories ("off": arm off)
    aux: dict = field(default_factory=dict)  # {term: mean over its windows, None (no window fits) or "off"}

    @property
    def bpb(self) -> float:
        return self.ce / math.log(2)


@torch.no_grad()
def heldout_score(
    model,
    corpus: Corpus,
    *,
    seq_len: int,
    batch_size: int,
    eval_bytes: int,
    device,
    autocast,
    world: World = ALONE,
    depth: int | None = None,
    progress: bool = False,
):
    """Mean cross-entropy over the held-out walk; refuses a non-finite result. `depth` runs fewer loop
    iterations than the model's (`dormouse eval --depth`); None is the full depth. `progress`: a bar on
    stderr once the walk has taken `PROGRESS_AFTER_S` (a whole split on a CPU takes minutes).

    Under data parallelism rank r scores the walk's batches i with i mod W = r; the per-batch sums are
    all-reduced and added in batch order on every rank, the additions one process makes: the same
    score, bit for bit, at every world size. A sharded model's forward is a collective (FSDP gathers
    each unit's weights), so there every rank runs as many forwards as rank 0: one left without a batch
    in the last round scores the walk's last batch again and drops it.
    """
    was_training = model.training
    model.eval()
    m, weights = model.cfg, model.aux_weights()
    mine, engram, batches, x = {}, None, 0, None
    walk = tqdm(
        heldout_windows(corpus, seq_len, batch_size, eval_bytes or None),
        total=count_heldout_batches(corpus, seq_len, batch_size, eval_bytes or None),
        desc="eval",
        unit="batch",
        dynamic_ncols=True,
        leave=False,
        delay=PROGRESS_AFTER_S,
        disable=not (progress and world.is_main),
    )
    for i, (x, y) in enumerate(walk):
        batches = i + 1
        if i % world.size != world.rank:
            continue
        x, y = x.to(device), y.to(device)
        with autocast():
            out = model(x, jepa_starts=_eval_starts(m, i, x.shape), depth=depth)
        logits = out.logits
        if out.engram is not None:  # the same forward as training: the memories' keys come from x
            engram = out.engram if engram is None else engram + out.engram  # rows: a union over batches
        nats = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="sum").item()
        windows = _aux_windows(m, x.shape)
        aux = [(out.aux[name].item() * n, n) if n else (0.0, 0) for name, n in windows.items()]
        mine[i] = (nats, y.numel(), *(v for pair in aux for v in pair))
    if x is not None and is_sharded(model) and batches % world.size and world.rank >= batches % world.size:
        with autocast():  # rank 0 ran one more forward than this rank: join its collectives
            model(x.to(device), jepa_starts=_eval_starts(m, batches - 1, x.shape), depth=depth)
    idle_lookups(model, -(-batches // world.size) - len(mine))  # --engram-shard: join the rounds without a batch
    model.train(was_training)
    # (nats, bytes, then per auxiliary term: sum over its windows, windows); the other ranks' rows stay 0
    per_batch = torch.zeros(batches, 2 + 2 * len(AUX_TERMS), dtype=torch.float64)
    for i, sums in mine.items():
        per_batch[i] = torch.tensor(sums, dtype=torch.float64)
    total, scored, aux_sums = 0.0, 0, [0.0] * (2 * len(AUX_TERMS))
    for nats, count, *aux in world.sum(per_batch).tolist():
        total += nats
        scored += int(count)
        aux_sums = [a + b for a, b in zip(aux_sums, aux, strict=True)]
    expected = count_heldout_targets(corpus, eval_bytes or None)
    if scored != expected:
        raise AssertionError(f"held-out walk scored {scored} bytes, expected {expected}")
    ce = total / scored
    if not math.isfinite(ce):
        raise NonFiniteError(f"held-out cross-entropy is {ce} over {scored} bytes: not a score")
    engram = _united(engram, world)
    aux = {}
    for k, name in enumerate(AUX_TERMS):
        total_aux, windows = aux_sums[2 * k : 2 * k + 2]
        aux[name] = "off" if not weights[name] else (total_aux / windows if windows else None)
        if isinstance(aux[name], float) and not math.isfinite(aux[name]):
            raise NonFiniteError(f"held-out {name} term is {aux[name]} over {int(windows)} windows: not a score")
    return HeldOut(ce=ce, bytes=scored, engram="off" if engram is None else str(engram), aux=aux)


@torch.no_grad()
def dry_forwards(model, corpus: Corpus, *, seq_len: int, batch_size: int, eval_bytes: int, device, autocast) -> None:
    """A forward of each batch shape of the held-out walk, on zeros: the kernels `heldout_score` launches,
    for a dry pass (ops/precompile.py); their outputs are dropped."""
    was_training = model.training
    model.eval()
    for i, shape in enumerate(heldout_shapes(corpus, seq_len, batch_size, eval_bytes or None)):
        with autocast():
            model(torch.zeros(shape, dtype=torch.long, device=device), jepa_starts=_eval_starts(model.cfg, i, shape))
    model.train(was_training)


def _eval_starts(m, i: int, shape) -> torch.Tensor | None:
    """The JEPA span starts of held-out batch i, from the `jepa_eval` stream of seed 0 (the same spans for
    every run); None when JEPA is off or the window is too short for its spans."""
    if not m.jepa_weight or not jepa.fits(shape[1], m.jepa_span, m.jepa_spans):
        return None
    return jepa.span_starts(0, i, *shape, m.jepa_span, m.jepa_spans, "jepa_eval")


def _aux_windows(m, shape) -> dict[str, int]:
    """{term: its windows in a batch of `shape`}, in AUX_TERMS order: DSpark's anchors, JEPA's spans (0: off)."""
    batch, length = shape
    anchors = len(dspark.anchors(length, m.dspark_k, m.dspark_stride))
    spans = m.jepa_spans if jepa.fits(length, m.jepa_span, m.jepa_spans) else 0
    return {"dspark": batch * anchors if m.dspark_weight else 0, "jepa": batch * spans if m.jepa_weight else 0}


def _united(engram: EngramStats | None, world: World) -> EngramStats | None:
    """Every rank's engram reads of the eval, united (alone: its own)."""
    if world.size == 1:
        return engram
    mine = None if engram is None else EngramStats({j: r.cpu() for j, r in engram.reads.items()}, engram.arms)
    parts = [p for p in world.gather_objects(mine) if p is not None]
    return sum(parts[1:], parts[0]) if parts else None


def eval_record(step: int, held: HeldOut, *, train_ce, tokens, ms_per_step, depth, stress) -> dict:
    """One eval as a dict (metrics.jsonl); `eval_line` prints it. Kernel and fallback counters are read here."""
    fla_pin.count_unpinned()  # kernel choices made by timing since the last eval join `fallbacks=`
    fla_pin.count_borrowed()  # and those another card's pin made
    record = {
        "kind": "eval",
        "step": step,
        "bpb": held.bpb,
        "ce": held.ce,
        "train_ce": train_ce,
        "tokens": tokens,
        "heldout_bytes": held.bytes,
        "ms_per_step": ms_per_step,
        **{name: str(counter) for name, counter in counters.ALL.items()},
        "engram": held.engram,
        "depth": depth,
        **{name: held.aux.get(name, "off") for name in AUX_TERMS},
        "fallbacks": ledger.counted_summary(),
        "stress": stress,
    }
    for name, value in record.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise NonFiniteError(f"eval at step {step}: {name} is {value}; not a score")
    return record


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
    keys = ("step", "bpb", "ce", "train_ce", "tokens", "ms_per_step", *counters.ALL, "engram", "depth")
    keys += (*AUX_TERMS, "fallbacks")
    keys += ("wall_s",) if "wall_s" in record else ()  # a training run's; `dormouse eval` has none
    keys += ("window",) if "window" in record else ()  # `dormouse eval`'s window length in bytes
    keys += ("weights",) if "weights" in record else ()  # `ema<decay>`: the scored weights are the average
    fields = " ".join(f"{k}={_fmt(record[k])}" for k in keys)
    return f"eval {fields} {record['stress']}"


def append_jsonl(path, record: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")


def eval_records(run) -> list[dict]:
    """The eval records of run directory `run`'s metrics.jsonl, in order."""
    return [r for r in metrics.records(run) if r["kind"] == "eval"]
