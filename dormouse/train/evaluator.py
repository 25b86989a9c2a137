"""The training run's evals (dormouse/evaluation.py scores): the held-out bpb of the scored weights every
`eval_every` steps, its record and line, and the run's best and latest scores that its result and its
early stopping read.
"""

import contextlib
import time

import torch

import dormouse
from dormouse import counters, ledger
from dormouse.config import Config
from dormouse.data.shards import Corpus
from dormouse.evaluation import depth_field, dry_forwards, eval_line, eval_record, heldout_score
from dormouse.model.model import DormouseLM
from dormouse.parallel.world import World
from dormouse.train.ema import WeightAverage
from dormouse.train.metrics import MetricsWriter
from dormouse.train.stress import StressMonitor


class Evaluator:
    """Scores the model on the corpus's held-out split (`evaluate`); keeps the best held-out bpb and its
    step (`best_bpb`, `best_step`) and the latest eval's (step, bpb) (`last_eval`)."""

    def __init__(
        self,
        cfg: Config,
        corpus: Corpus,
        model: DormouseLM,
        world: World,
        device: torch.device,
        autocast,
        ema: WeightAverage | None,
        stress: StressMonitor,
        metrics: MetricsWriter,
    ):
        self.cfg, self.corpus, self.model, self.world, self.device = cfg, corpus, model, world, device
        self.autocast, self.ema, self.stress, self.metrics = autocast, ema, stress, metrics
        self.best_bpb: float | None = None
        self.best_step: int | None = None
        self.last_eval: tuple[int, float] | None = None  # (step, held-out bpb) of the run's latest eval

    def scored_weights(self):
        """The weights a score of this run is of, in the model for a `with` block: the weight average
        under `ema_decay` (swapped in and back), else the trained weights as they are."""
        return self.ema.in_model() if self.ema is not None else contextlib.nullcontext()

    def walk(self) -> dict:
        """The held-out walk of this run's evals: its windows, bytes, device and autocast."""
        t = self.cfg.train
        return {
            "seq_len": t.seq_len,
            "batch_size": t.batch_size,
            "eval_bytes": t.eval_bytes,
            "device": self.device,
            "autocast": self.autocast,
        }

    def dry_pass(self) -> None:
        """The eval's forwards on zeros, for a dry pass (ops/precompile.py)."""
        dry_forwards(self.model, self.corpus, **self.walk())

    def evaluate(self, step: int, window_ce: list[float], window_ms: list[float], depths: list[int]) -> dict:
        """The eval after `step` updates, of the training steps since the last one (their losses, times
        and loop depths): recorded in metrics.jsonl, its line logged; returns its record."""
        t = self.cfg.train
        with self.scored_weights():
            held = heldout_score(self.model, self.corpus, **self.walk(), world=self.world, progress=True)
        record = eval_record(
            step,
            held,
            train_ce=sum(window_ce) / len(window_ce) if window_ce else None,
            tokens=step * t.batch_size * t.seq_len,
            ms_per_step=sorted(window_ms)[len(window_ms) // 2] if window_ms else None,
            depth=depth_field(self.cfg, depths),
            stress=self.stress.summary(),
        )
        record["wall_s"] = time.monotonic() - dormouse.IMPORTED  # start-up and compiling included
        if self.ema is not None:
            record["weights"] = f"ema{t.ema_decay:g}"
        counters.reset_all()
        ledger.COUNTS.clear()
        self.metrics.append(record)
        self.metrics.log(eval_line(record))
        self.last_eval = (step, held.bpb)
        if self.best_bpb is None or held.bpb < self.best_bpb:
            self.best_bpb, self.best_step = held.bpb, step
        return record

    def patience_spent(self, step: int) -> bool:
        """Whether, after `step` updates, the best held-out bpb is `patience` evals old: none of the evals
        of the last patience × eval_every steps beat it (with evals every eval_every steps, `patience`
        evals in a row). Read from the step and the best step alone, so a resumed run applies the same rule."""
        t = self.cfg.train
        return bool(t.patience) and self.best_step is not None and step - self.best_step >= t.patience * t.eval_every
