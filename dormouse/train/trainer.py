"""The training loop: steps, evals, checkpoints, resume; each job in its own part, wired here.

    step_runner.py   one update on batch (seed, step), eager or replayed from CUDA graphs
    evaluator.py     the held-out evals, and the run's best and latest scores
    checkpointer.py  the training state to and from the run's checkpoints
    metrics.py       train.log, metrics.jsonl, config.json and run.json
    signals.py       Ctrl-C and SIGTERM: stop at the next step boundary, or at once on a second

Everything a resumed run needs is in the checkpoint (weights, optimizer state, step, best score,
StressMonitor), and the batch of a step is a pure function of (seed, step), so an interrupted and
resumed run is bitwise the uninterrupted one on the CPU. Under torchrun (`--parallel ddp` or `fsdp`,
docs/distributed.md) each rank trains its rows of that batch on a DDP replica or on its FSDP2 shards, and
rank 0 alone prints and writes. The run's result is its best held-out eval (`result_line`, run.json);
with `patience` on, the run stops early once that best is `patience` evals old.
"""

import json
import math
import secrets
import time
from pathlib import Path

import torch
from tqdm import tqdm

import dormouse
from dormouse import checkpoint, runs
from dormouse.config import Config, layer_mixers
from dormouse.data.sampler import Sampler, rank_rows
from dormouse.data.shards import Corpus
from dormouse.model import precision
from dormouse.model.model import DormouseLM
from dormouse.ops import passes, precompile
from dormouse.ops.fla import kernels as fla_kernels
from dormouse.ops.fla import pin as fla_pin
from dormouse.parallel.parallelize import parallelize
from dormouse.parallel.world import World
from dormouse.train import budget
from dormouse.train.checkpointer import Checkpointer
from dormouse.train.ema import WeightAverage
from dormouse.train.evaluator import Evaluator
from dormouse.train.graphed import CountSnapshot
from dormouse.train.metrics import MetricsWriter
from dormouse.train.routing import build_optimizers, describe, route
from dormouse.train.signals import DeferredInterrupt, lost_note, stopped_note
from dormouse.train.step_runner import StepRunner
from dormouse.train.stress import StressMonitor

_TIMED_OUT, _SIGNALLED = 1, 2  # why a run stops before its last step, as the ranks agree on it (the larger wins)


class Trainer:
    """A training run in `run_dir`: a new one, or with `resume` the run there from its last checkpoint."""

    def __init__(
        self,
        cfg: Config,
        corpus: Corpus,
        run_dir: Path,
        *,
        corpus_note: str,
        resume: bool = False,
        world: World | None = None,
    ):
        self.cfg, self.corpus, self.run = cfg, corpus, Path(run_dir)
        t = cfg.train
        self.world = world or World()
        rank_rows(t.batch_size, self.world.rank, self.world.size)  # refuse an indivisible batch at start-up
        self.device = self.world.device(t.device)
        self.precision_note = precision.apply(t.dtype)  # before any kernel compiles
        self.model = passes.schedule(DormouseLM(cfg.model, seed=t.seed)).to(self.device)
        # --steps auto: fitted to the corpus and this model, before anything reads the schedule's length
        cfg, self.budget_note = budget.resolved(cfg, corpus.split_size("train"), self.model.num_params())
        self.cfg, t = cfg, cfg.train
        # Under FSDP the model is sharded (and under --engram-shard its tables cut) before the optimizers see it.
        replica = parallelize(self.model, self.world, t)
        self.groups = route(self.model, t.opt)
        self.opt = build_optimizers(self.groups, t, capturable=t.cuda_graph and t.graph_update)
        self.ema = WeightAverage(self.model, t.ema_decay) if t.ema_decay else None  # what evals score
        self.stress = StressMonitor()
        sampler = Sampler(corpus, t.batch_size, t.seq_len, t.byte_noise, t.byte_noise_source)
        self.step_runner = StepRunner(cfg, self.model, replica, self.opt, sampler, self.world, self.device, self.ema)
        self.metrics = MetricsWriter(self.run, self.world.is_main)
        self.evaluator = Evaluator(
            cfg,
            corpus,
            self.model,
            self.world,
            self.device,
            self.step_runner.autocast,
            self.ema,
            self.stress,
            self.metrics,
        )
        self.checkpointer = Checkpointer(self.run, cfg, self.model, self.opt, self.ema, self.stress, self.world)
        self.step = 0
        self.early_stop_step: int | None = None  # the step this process stopped at early (patience), if it did
        self.step_ms: list[float] = []  # every training step this process ran, in run_loop's clock
        self.run_id = secrets.token_hex(6)
        if resume:
            self._restore()
        else:
            self.metrics.create(cfg, corpus, self.run_id, corpus_note)
        self.log_header(corpus_note)

    def _restore(self) -> None:
        restored = self.checkpointer.restore(self.corpus)
        self.step, self.run_id = restored.step, restored.run_id
        self.evaluator.best_bpb, self.evaluator.best_step = restored.best_bpb, restored.best_step
        self.evaluator.last_eval = self.metrics.resumed(self.step, self.cfg, restored.changed)

    def log_header(self, corpus_note: str) -> None:
        m, t, log = self.cfg.model, self.cfg.train, self.metrics.log
        log(f"run {self.run} id={self.run_id} start_step={self.step}")
        log(f"corpus: {corpus_note}")
        log(f"device: {self.device} dtype={t.dtype} torch={torch.__version__}; {self.precision_note}")
        backend = m.kda_backend if m.mixer == "kda" else "off (attention mixer)"
        fused = "fused (fla rms_norm, rms_norm_gated, layer norm with residual; dormouse add-norm backward)"
        norm = {"fused": fused, "plain": "plain (torch rms_norm)"}[m.norm_backend]
        has_conv = m.mixer == "kda" and m.short_conv
        conv = (
            {"fused": "fused (dormouse Triton)", "plain": "plain (torch conv1d)"}[m.conv_backend] if has_conv else "off"
        )
        glu = {"fused": "fused (dormouse Triton)", "plain": "plain (torch silu, mul)"}[m.swiglu_backend]
        log(f"kernels: kda={backend} norm={norm} conv={conv} swiglu={glu}")
        if m.attention_layers:  # a hybrid block
            log("mixers of the block layers: " + ", ".join(f"{i}:{k}" for i, k in enumerate(layer_mixers(m))))
        fused = (m.norm_backend, m.swiglu_backend, m.conv_backend if has_conv else "off")
        if backend == "fla" or "fused" in fused:
            log(fla_pin.pin_note())
        log(f"model: {self.model.num_params():,} parameters; optimizer groups:")
        if self.budget_note:
            log(self.budget_note)
        log(describe(self.groups))
        log("config: " + json.dumps(self.cfg.to_dict(), sort_keys=True))
        if self.world.size > 1:
            w, rows = self.world, t.batch_size // self.world.size
            log(f"parallel: {t.parallel}, {w.size} ranks ({w.backend}), {rows} rows of each batch per rank")

    def train_step(self, step: int) -> float:
        """One update on batch `step`; returns the training cross-entropy (nats)."""
        return self.step_runner.run(step)

    def evaluate(self, window_ce: list[float], window_ms: list[float]) -> dict:
        """The eval after `self.step` updates, of the training steps since the last one; returns its record."""
        record = self.evaluator.evaluate(self.step, window_ce, window_ms, self.step_runner.depths)
        self.step_runner.depths = []
        return record

    def save(self, *, is_best: bool) -> None:
        """Checkpoint the state after `self.step` updates (once per step; `best` when it is the new best)."""
        e = self.evaluator
        self.checkpointer.save(
            self.step, run_id=self.run_id, best_bpb=e.best_bpb, best_step=e.best_step, is_best=is_best
        )

    def run_loop(self, until_step: int | None = None) -> dict | None:
        """Train to `cfg.train.steps` (or `until_step`, or `--minutes`); returns the last eval record."""
        t = self.cfg.train
        end = t.steps if until_step is None else min(until_step, t.steps)
        deadline = time.monotonic() + t.minutes * 60 if t.minutes else math.inf
        bar = tqdm(
            total=t.steps,
            initial=self.step,
            unit="step",
            dynamic_ncols=True,
            leave=False,
            disable=not self.world.is_main,
        )
        if not self.step_ms and self.step < end:
            self.compile_ahead()
        record, window_ce, window_ms = None, [], []
        interrupt = DeferredInterrupt()
        stop = False
        try:
            while self.step < end and not stop:
                started = time.perf_counter()
                ce = self.train_step(self.step)
                self.step += 1
                window_ms.append((time.perf_counter() - started) * 1000)
                window_ce.append(ce)
                self._record_step(ce, window_ms[-1])
                bar.update(1)
                tok_s = t.batch_size * t.seq_len / (window_ms[-1] / 1000)
                bar.set_postfix_str(f"loss {ce:.3f} bpb {ce / math.log(2):.3f} {tok_s:,.0f} tok/s")
                # One decision for every rank: they stop after the same step, with one checkpoint. A signal's
                # stop before the end adds no eval the schedule did not ask for: a whole held-out split takes
                # minutes on a CPU, longer than a preemption's grace before its SIGKILL would leave the
                # checkpoint unwritten; the resume evaluates where the schedule does.
                timed_out = _TIMED_OUT if time.monotonic() >= deadline else 0
                why = self.world.max(_SIGNALLED if interrupt.requested else timed_out)
                stop = why > 0
                last = self.step == end or stop
                new_best = early = False
                if self.step % t.eval_every == 0 or self.step == end or why == _TIMED_OUT:
                    record = self.evaluate(window_ce, window_ms)
                    new_best = record["step"] == self.evaluator.best_step
                    early = not last and self.evaluator.patience_spent(self.step)
                    window_ce, window_ms = [], []
                if new_best or self.step % t.ckpt_every == 0 or last or early:
                    self.save(is_best=new_best)
                if early:
                    self.stop_early()
                    stop = True
        except KeyboardInterrupt:
            if interrupt.requested:  # a second signal: stopped at once, inside a step or a save
                self.metrics.log(lost_note(self.run, self.step, self.checkpointer.last_saved()))
            raise
        finally:
            interrupt.restore()
            bar.close()
        self.metrics.write_result(self.result())
        if interrupt.requested:
            self.metrics.log(stopped_note(self.run, self.step))
            raise KeyboardInterrupt
        return record

    def _record_step(self, ce: float, ms: float) -> None:
        """The bookkeeping of the step just run (`ce`, in `ms`): its time, the cold start's note, the
        loss-spike monitor, its metrics.jsonl record."""
        self.step_ms.append(ms)
        if len(self.step_ms) == 1:  # this process's first step: the cold start
            since = time.monotonic() - dormouse.IMPORTED
            self.metrics.log(
                f"first step: {self.first_step_s:.1f} s, {since:.1f} s since dormouse was imported "
                f"(before it: {since - self.first_step_s:.1f} s, fla's import {fla_kernels.import_s:.1f} s)"
            )
        if self.stress.update(ce):
            self.metrics.log(f"loss spike at step {self.step}: ce={ce:.4f} ({self.stress.summary()})")
        self.metrics.append({"kind": "train", "step": self.step, "ce": ce})

    def stop_early(self) -> None:
        """Say and record that the run stops here: its best is `patience` evals old (the checkpoint is saved)."""
        t, best_step, best_bpb = self.cfg.train, self.evaluator.best_step, self.evaluator.best_bpb
        self.early_stop_step = self.step
        evals = (self.step - best_step) // t.eval_every
        record = {"kind": "early_stop", "step": self.step, "patience": t.patience, "evals": evals}
        self.metrics.append(record | {"best_step": best_step, "best_bpb": best_bpb})
        self.metrics.log(
            f"early stop: {evals} evals without a better held-out bpb (patience {t.patience}); stopped after step "
            f"{self.step} of {t.steps} with a checkpoint; best {best_bpb:.4f} at step {best_step}"
        )

    def result(self) -> dict:
        """The run's result as run.json records it: its best held-out eval, the checkpoint that holds it
        (relative to the run directory; `--ckpt best` loads it), and its latest eval."""
        e = self.evaluator
        best = None if e.best_step is None else f"ckpt/{checkpoint.step_dir_name(e.best_step)}"
        last_step, last_bpb = e.last_eval or (None, None)
        return {
            "best_step": e.best_step,
            "best_bpb": e.best_bpb,
            "best_checkpoint": best,
            "last_eval_step": last_step,
            "last_eval_bpb": last_bpb,
            "early_stop_step": self.early_stop_step,
        }

    def compile_ahead(self) -> None:
        """This process's Triton kernels compiled side by side before its first step (ops/precompile.py):
        with --precompile, on CUDA, in one process; a torchrun job's ranks compile as their first step runs
        (counted on the ledger)."""
        if not (self.cfg.train.precompile and self.device.type == "cuda"):
            return  # off the GPU no Triton kernel compiles
        if self.world.size > 1:
            self.metrics.log(precompile.skipped(f"a job of {self.world.size} processes"))
            return
        self.metrics.log(precompile.compile_ahead(self.dry_pass))

    def dry_pass(self) -> None:
        """A training step's forward and backward and the eval's forwards, their values dropped: what
        ops/precompile.py records launches from. It leaves no gradient, buffer, counter or RNG state
        behind, also when it stops part-way (precompile ends it at an untimed autotune, in the backward)."""
        buffers = {name: b.clone() for name, b in self.model.named_buffers()}  # e.g. the experts' load
        counts = CountSnapshot()
        try:
            with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
                self.step_runner.dry_pass()
                self.evaluator.dry_pass()
        finally:
            self.model.zero_grad(set_to_none=True)  # the first step's backward would add to them
            counts.restore()
            with torch.no_grad():
                for name, b in self.model.named_buffers():
                    b.copy_(buffers[name])

    def result_line(self) -> str:
        return runs.result_line(self.run, self.result())

    @property
    def first_step_s(self) -> float | None:
        """This process's first training step in seconds (compiling, capture); None before it."""
        return self.step_ms[0] / 1000 if self.step_ms else None
