"""One training update: batch `step` → forward → backward → clip → routed optimizers, eager or replayed.

Step s (0-based) trains on `sampler.batch(seed, s)` with lr multiplier `lr_multiplier(s)`; its loop depth,
JEPA span starts and dropout masks are pure functions of (seed, s) too, so a step is the same whenever it
runs. Under --cuda-graph the forward and backward replay from a CUDA graph (train/graphed.py), and with
--graph-update the clip and NesterovSinkhorn's step as well (train/graphed_update.py).
"""

import math

import torch
from torch.profiler import record_function

from dormouse.config import Config
from dormouse.data.sampler import Sampler, rank_rows
from dormouse.evaluation import NonFiniteError
from dormouse.model import precision
from dormouse.model.dropout import draws_masks, step_generator, step_seed
from dormouse.model.jepa import span_starts
from dormouse.model.loop import sample_depth
from dormouse.model.model import DormouseLM
from dormouse.parallel.ddp import average_sparse_grads_
from dormouse.parallel.engram_shard import sharded_tables
from dormouse.parallel.world import World
from dormouse.train.ema import WeightAverage
from dormouse.train.graphed import GraphedStep
from dormouse.train.graphed_update import GraphedUpdate
from dormouse.train.routing import Optimizers
from dormouse.train.schedule import lr_multiplier
from dormouse.train.sparse import clip_grad_norm_


class StepRunner:
    """Runs training step `step` on this rank's rows of its batch (`run`); keeps the loop depths it ran
    since they were last read (`depths`) and the last step's gradient norm before clipping (`grad_norm`)."""

    def __init__(
        self,
        cfg: Config,
        model: DormouseLM,
        replica: torch.nn.Module,
        opt: Optimizers,
        sampler: Sampler,
        world: World,
        device: torch.device,
        ema: WeightAverage | None,
    ):
        self.cfg, self.model, self.opt, self.sampler = cfg, model, opt, sampler
        self.world, self.device, self.ema = world, device, ema
        # What a step calls; under FSDP the model itself, sharded (and under --engram-shard the engram
        # tables cut to this rank's rows) before the optimizers saw it.
        self.replica = replica
        t = cfg.train
        # --cuda-graph: forward + backward captured at the first step and replayed (train/graphed.py).
        # Then the clip and NesterovSinkhorn's step, captured at the second step (train/graphed_update.py).
        self.graphed, self.graphed_update = None, None
        if t.cuda_graph:
            self.graphed = GraphedStep(model, self.forward, device, dropout=draws_masks(cfg.model))
            if t.graph_update:  # else the update runs as the eager step runs it
                self.graphed_update = GraphedUpdate(model, opt)
        self.grad_norm: torch.Tensor | None = None  # of the last step, before clipping
        self.next_batch: tuple[int, tuple] | None = None  # (step, its x, y, JEPA starts): read_batch
        self.depths: list[int] = []  # loop depths of the steps run since the caller last emptied it

    def autocast(self):
        return precision.autocast(self.cfg.train.dtype, self.device.type)

    def step_depth(self, step: int) -> int:
        """The loop depth training step `step` runs: sampled under --rand-depth, else the config's."""
        m, t = self.cfg.model, self.cfg.train
        return sample_depth(t.seed, step, t.rand_depth_min, m.depth) if t.rand_depth else m.depth

    def jepa_starts(self, step: int) -> torch.Tensor | None:
        """The JEPA span starts of this rank's rows of batch `step`, from the (seed, step) stream; None: JEPA off."""
        m, t = self.cfg.model, self.cfg.train
        if not m.jepa_weight:
            return None
        starts = span_starts(t.seed, step, t.batch_size, t.seq_len, m.jepa_span, m.jepa_spans)
        rows = rank_rows(t.batch_size, self.world.rank, self.world.size)
        return self.to_device(starts[rows.start : rows.stop])

    def dropout_gen(self, step: int) -> torch.Generator | None:
        """This rank's dropout generator of step `step` (keyed by (seed, step, rank): model/dropout.py); None:
        no masks (model/dropout.py's draws_masks), nothing drawn."""
        if not draws_masks(self.cfg.model):
            return None
        return step_generator(self.cfg.train.seed, step, self.world.rank, self.device)

    def forward(self, x, y, jepa_starts, dropout_gen, depth):
        """A training step's forward, eager or as a CUDA graph captures it (one graph per loop depth)."""
        with self.autocast():
            return self.replica(
                x,
                y,
                depth=depth,
                grad_iterations=self.cfg.train.rand_depth_bptt,
                jepa_starts=jepa_starts,
                dropout_gen=dropout_gen,
            )

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Batch `step` on the device, (x, y, JEPA starts): the one the previous step read while the GPU
        ran it (the host would otherwise read it while the GPU waits: ~0.7 ms a step at B 64 on the H200),
        else read now."""
        if self.next_batch is not None and self.next_batch[0] == step:
            return self.next_batch[1]
        return self.read_batch(step)

    def read_batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        t = self.cfg.train
        rows = self.sampler.batch(t.seed, step, rank=self.world.rank, world_size=self.world.size)
        x, y = (self.to_device(z) for z in rows)
        return x, y, self.jepa_starts(step)

    def to_device(self, t: torch.Tensor) -> torch.Tensor:
        """A host tensor of the step on the run's device without the host waiting for the GPU: from pinned
        memory, asynchronously (from pageable memory CUDA may synchronise the stream to stage the copy,
        which would make the host wait for the previous update before it queues this step)."""
        if self.device.type != "cuda":
            return t.to(self.device)
        return t.pin_memory().to(self.device, non_blocking=True)

    def dry_pass(self) -> None:
        """Step 0's forward and backward: the kernels a training step launches, for a dry pass
        (Trainer.dry_pass drops the gradients). Its dropout generator is keyed like every step's: nothing
        a later step draws moves."""
        x, y, starts = self.read_batch(0)
        self.forward(x, y, starts, self.dropout_gen(0), self.step_depth(0)).loss.backward()

    def run(self, step: int) -> float:
        """One update on batch `step`; returns the training cross-entropy (nats). Its phases are named
        ranges for the profiler (`dormouse bench --profile`: the idle gaps line says which phase the host
        was in while the device waited)."""
        t = self.cfg.train
        with record_function("dormouse.batch"):
            x, y, starts = self.batch(step)
            self.opt.set_lr(lr_multiplier(step, t))
            depth = self.step_depth(step)
            self.depths.append(depth)
        max_norm = t.grad_clip or math.inf  # grad_clip 0 = the norm only
        with record_function("dormouse.forward_backward"):
            if self.graphed is not None:  # forward and backward replayed; the gradients are set
                seed = step_seed(t.seed, step) if draws_masks(self.cfg.model) else None
                out = self.graphed(x, y, starts, seed, depth=depth)
                terms = {"loss": out.loss, "ce": out.ce, **out.aux}
            else:
                out = self.forward(x, y, starts, self.dropout_gen(step), depth)
                # Averaged over the ranks (equal targets per rank: the whole batch's mean), so all stop together.
                terms = self.world.mean({"loss": out.loss, "ce": out.ce, **out.aux})
                out.loss.backward()
        with record_function("dormouse.prefetch"):  # while the GPU runs this step; a pure function of (seed, step)
            self.next_batch = (step + 1, self.read_batch(step + 1))
            if self.graphed is not None:
                self.graphed.prefetch(self.next_batch[1][0])
        with record_function("dormouse.update"):
            if self.graphed_update is not None:  # the clip and NesterovSinkhorn's step replayed (graphed_update.py)
                # Queued before the check, skipped on the device if a term is not finite: the GPU runs the
                # update while the host waits for the loss, instead of waiting for the host to launch it.
                stacked = _stacked(terms)
                self.grad_norm = self.graphed_update(max_norm, skip=~torch.isfinite(stacked).all())
                self.graphed.stage(*self.next_batch[1])
                with record_function("dormouse.check"):
                    values = _checked_values(step, terms, stacked)
            else:  # eager, and --cuda-graph --no-graph-update (one process: the averaging and shards are no-ops)
                average_sparse_grads_(self.model, self.world)  # DDP averaged the dense gradients during backward
                # The global grad norm before clipping (a tensor, no sync); `dormouse replay` compares it bitwise.
                # The sparse-aware clip: the engram table's gradient is sparse.
                shards = [m.weight for _, m in sharded_tables(self.model)]  # --engram-shard: this rank's rows only
                self.grad_norm = clip_grad_norm_(self.model.parameters(), max_norm, split=shards, world=self.world)
                with record_function("dormouse.check"):
                    values = _checked_values(step, terms, _stacked(terms))
                self.opt.step()
            if self.ema is not None:
                self.ema.update(step)
            self.opt.zero_grad(set_to_none=True)
        return values["ce"]


def _stacked(terms: dict[str, torch.Tensor]) -> torch.Tensor:
    """A step's loss terms in one fp32 vector on their device (one copy to the host reads them all)."""
    return torch.stack([v.detach().float() for v in terms.values()])


def _checked_values(step: int, terms: dict[str, torch.Tensor], stacked: torch.Tensor) -> dict[str, float]:
    """The step's one host sync, after the backward has been queued: every term's value at once (from
    `stacked`, `_stacked(terms)`); a non-finite one stops the run before the update (the eager path runs
    the update after this check, the graphed one skips it on the device)."""
    values = dict(zip(terms, stacked.tolist(), strict=True))
    for name, value in values.items():
        if not math.isfinite(value):
            raise NonFiniteError(f"step {step}: training {name} is {value}; stopping before the update")
    return values
