"""The training loop: batches → forward → backward → routed optimizers, evals, checkpoints, resume.

Step s (0-based) trains on `sampler.batch(seed, s)` with lr multiplier `lr_multiplier(s)`; after it,
`step` completed updates exist. Everything a resumed run needs is in the checkpoint (weights,
optimizer state, step, best score, StressMonitor), and the batch of a step is a pure function of
(seed, step), so an interrupted and resumed run is bitwise the uninterrupted one on the CPU. Under
torchrun (`--parallel ddp` or `fsdp`, docs/distributed.md) each rank trains its rows of that batch on a
DDP replica or on its FSDP2 shards, and rank 0 alone prints and writes. The run's result is its best
held-out eval (`result_line`, run.json); with `patience` on, the run stops early once that best is
`patience` evals old.
"""

import contextlib
import json
import math
import secrets
import signal
import threading
import time
from pathlib import Path

import torch
from torch.profiler import record_function
from tqdm import tqdm

import dormouse
from dormouse import checkpoint, counters, ledger, run_lock, runs
from dormouse.config import Config, layer_mixers
from dormouse.data.sampler import Sampler, rank_rows
from dormouse.data.shards import Corpus
from dormouse.errors import ConfigError
from dormouse.evaluation import NonFiniteError, append_jsonl, depth_field, eval_line, eval_record, heldout_score
from dormouse.model import precision
from dormouse.model.dropout import draws_masks, step_generator, step_seed
from dormouse.model.jepa import span_starts
from dormouse.model.loop import sample_depth
from dormouse.model.model import ENGRAM_FILE, DormouseLM
from dormouse.ops.fla import kernels as fla_kernels
from dormouse.ops.fla import pin as fla_pin
from dormouse.parallel.ddp import average_sparse_grads_
from dormouse.parallel.engram_shard import gather_shards, local_table_state, sharded_tables, with_whole_tables
from dormouse.parallel.fsdp import gathered, is_sharded, shard_optimizer_state_, sharded_model_state
from dormouse.parallel.parallelize import parallelize
from dormouse.parallel.world import World
from dormouse.train.ema import EMA_FILE, WeightAverage
from dormouse.train.graphed import GraphedStep
from dormouse.train.graphed_update import GraphedUpdate
from dormouse.train.routing import build_optimizers, describe, route
from dormouse.train.schedule import lr_multiplier
from dormouse.train.sparse import clip_grad_norm_
from dormouse.train.stress import StressMonitor


class Trainer:
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
        self.model = DormouseLM(cfg.model, seed=t.seed).to(self.device)
        # What a training step calls; under FSDP the model itself, sharded (and under --engram-shard the
        # engram tables cut to this rank's rows) before the optimizers see it.
        self.replica = parallelize(self.model, self.world, t)
        self.groups = route(self.model, t.opt)
        self.opt = build_optimizers(self.groups, t, capturable=t.cuda_graph and t.graph_update)
        self.sampler = Sampler(corpus, t.batch_size, t.seq_len, t.byte_noise, t.byte_noise_source)
        # --cuda-graph: forward + backward captured at the first step and replayed (train/graphed.py).
        # Then the clip and NesterovSinkhorn's step, captured at the second step (train/graphed_update.py).
        self.graphed, self.graphed_update = None, None
        if t.cuda_graph:
            self.graphed = GraphedStep(self.model, self._forward, self.device, dropout=draws_masks(cfg.model))
            if t.graph_update:  # else the update runs as the eager step runs it
                self.graphed_update = GraphedUpdate(self.model, self.opt)
        self.ema = WeightAverage(self.model, t.ema_decay) if t.ema_decay else None  # what evals score
        self.stress = StressMonitor()
        self.step, self.best_bpb, self.best_step = 0, None, None
        self.last_eval: tuple[int, float] | None = None  # (step, held-out bpb) of the run's latest eval
        self.early_stop_step: int | None = None  # the step this process stopped at early (patience), if it did
        self.grad_norm: torch.Tensor | None = None  # of the last train_step, before clipping
        self.next_batch: tuple[int, tuple] | None = None  # (step, its x, y, JEPA starts): _read_batch
        self.depths: list[int] = []  # loop depths of the training steps since the last eval
        self.step_ms: list[float] = []  # every training step this process ran, in run_loop's clock
        self.saved_step = None
        self.run_id = secrets.token_hex(6)
        if resume:
            self._restore()
        else:
            self._create_run_dir(corpus_note)
        self.log_header(corpus_note)

    # ---- run directory ---------------------------------------------------------------------------------------

    def _create_run_dir(self, corpus_note: str) -> None:
        if not self.world.is_main:
            return
        if self.run.exists() and any(p.name != run_lock.LOCK for p in self.run.iterdir()):
            raise ConfigError(f"run directory {self.run} is not empty: pass --resume {self.run} or a new --out")
        self.run.mkdir(parents=True, exist_ok=True)
        runs.write_atomic(self.run / "config.json", self.cfg.to_json() + "\n")
        meta = {"run_id": self.run_id, "corpus": str(self.corpus.root), "fingerprint": self.corpus.fingerprint}
        runs.write_atomic(self.run / "run.json", json.dumps({**meta, "corpus_note": corpus_note}, indent=2) + "\n")

    def _restore(self) -> None:
        ck = checkpoint.load(self.run, "last")
        run_meta = runs.run_meta(self.run)
        # Only the RESUMABLE fields may differ from the config the checkpoint was trained with.
        changed = runs.config_changes(self.cfg.to_dict(), ck, "this resume's config")
        if run_meta["fingerprint"] != self.corpus.fingerprint:
            raise ConfigError(
                f"run {self.run} was trained on corpus {run_meta['fingerprint'][:12]}, this corpus is "
                f"{self.corpus.fingerprint[:12]}: resume on the same data"
            )
        # The one-process format at any world size; under FSDP each rank keeps its shards of it.
        model_state = sharded_model_state(self.model, ck.model_state) if is_sharded(self.model) else ck.model_state
        self.model.load_checkpoint_parts(model_state, ck.tensors, ck.state["extra"])
        table_state = local_table_state(self.model, ck.optimizer_tensors.get(ENGRAM_FILE, {}))  # sharded: my rows
        self.opt.load_split_state_dict(ck.optimizer_state, table_state)
        shard_optimizer_state_(self.opt)
        if self.ema is not None:
            self.ema.load_state_dict(ck.tensors.get(EMA_FILE))
        self.stress.load_state_dict(ck.state["stress"])
        self.step, self.run_id = ck.step, ck.state["run_id"]
        self.saved_step = ck.step
        self.best_bpb, self.best_step = ck.state["best_bpb"], ck.state["best_step"]
        # Records the interrupted run wrote after its last checkpoint are replayed now: drop them.
        metrics = self.run / "metrics.jsonl"
        if self.world.is_main and metrics.exists():
            kept = [line for line in metrics.read_text().splitlines() if json.loads(line)["step"] <= self.step]
            runs.write_atomic(metrics, "".join(line + "\n" for line in kept))
            scored = [r for r in map(json.loads, kept) if r["kind"] == "eval"]
            self.last_eval = (scored[-1]["step"], scored[-1]["bpb"]) if scored else None
        if self.world.is_main:  # what this resume changed, kept: a later plain --resume goes on with it
            runs.write_atomic(self.run / "config.json", self.cfg.to_json() + "\n")
            append_jsonl(metrics, {"kind": "resume", "step": self.step, "changed": changed})

    def log(self, text: str) -> None:
        if not self.world.is_main:
            return
        tqdm.write(text)
        with open(self.run / "train.log", "a") as f:
            f.write(text + "\n")

    def log_header(self, corpus_note: str) -> None:
        m, t = self.cfg.model, self.cfg.train
        self.log(f"run {self.run} id={self.run_id} start_step={self.step}")
        self.log(f"corpus: {corpus_note}")
        self.log(f"device: {self.device} dtype={t.dtype} torch={torch.__version__}; {self.precision_note}")
        backend = m.kda_backend if m.mixer == "kda" else "off (attention mixer)"
        fused = "fused (fla rms_norm, rms_norm_gated, layer norm with residual; dormouse add-norm backward)"
        norm = {"fused": fused, "plain": "plain (torch rms_norm)"}[m.norm_backend]
        has_conv = m.mixer == "kda" and m.short_conv
        conv = (
            {"fused": "fused (dormouse Triton)", "plain": "plain (torch conv1d)"}[m.conv_backend] if has_conv else "off"
        )
        glu = {"fused": "fused (dormouse Triton)", "plain": "plain (torch silu, mul)"}[m.swiglu_backend]
        self.log(f"kernels: kda={backend} norm={norm} conv={conv} swiglu={glu}")
        if m.attention_layers:  # a hybrid block
            self.log("mixers of the block layers: " + ", ".join(f"{i}:{k}" for i, k in enumerate(layer_mixers(m))))
        fused = (m.norm_backend, m.swiglu_backend, m.conv_backend if has_conv else "off")
        if backend == "fla" or "fused" in fused:
            self.log(fla_pin.pin_note())
        self.log(f"model: {self.model.num_params():,} parameters; optimizer groups:")
        self.log(describe(self.groups))
        self.log("config: " + json.dumps(self.cfg.to_dict(), sort_keys=True))
        if self.world.size > 1:
            w, rows = self.world, t.batch_size // self.world.size
            self.log(f"parallel: {t.parallel}, {w.size} ranks ({w.backend}), {rows} rows of each batch per rank")

    # ---- the loop --------------------------------------------------------------------------------------------

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
        return self._to_device(starts[rows.start : rows.stop])

    def dropout_gen(self, step: int) -> torch.Generator | None:
        """This rank's dropout generator of step `step` (keyed by (seed, step, rank): model/dropout.py); None:
        no masks (model/dropout.py's draws_masks), nothing drawn."""
        if not draws_masks(self.cfg.model):
            return None
        return step_generator(self.cfg.train.seed, step, self.world.rank, self.device)

    def _forward(self, x, y, jepa_starts, dropout_gen, depth):
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

    def _batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Batch `step` on the device, (x, y, JEPA starts): the one the previous step read while the GPU
        ran it (the host would otherwise read it while the GPU waits: ~0.7 ms a step at B 64 on the H200),
        else read now."""
        if self.next_batch is not None and self.next_batch[0] == step:
            return self.next_batch[1]
        return self._read_batch(step)

    def _read_batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        t = self.cfg.train
        rows = self.sampler.batch(t.seed, step, rank=self.world.rank, world_size=self.world.size)
        x, y = (self._to_device(z) for z in rows)
        return x, y, self.jepa_starts(step)

    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        """A host tensor of the step on the run's device without the host waiting for the GPU: from pinned
        memory, asynchronously (from pageable memory CUDA may synchronise the stream to stage the copy,
        which would make the host wait for the previous update before it queues this step)."""
        if self.device.type != "cuda":
            return t.to(self.device)
        return t.pin_memory().to(self.device, non_blocking=True)

    def train_step(self, step: int) -> float:
        """One update on batch `step`; returns the training cross-entropy (nats). Its phases are named
        ranges for the profiler (`dormouse bench --profile`: the idle gaps line says which phase the host
        was in while the device waited)."""
        t = self.cfg.train
        with record_function("dormouse.batch"):
            x, y, starts = self._batch(step)
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
                out = self._forward(x, y, starts, self.dropout_gen(step), depth)
                # Averaged over the ranks (equal targets per rank: the whole batch's mean), so all stop together.
                terms = self.world.mean({"loss": out.loss, "ce": out.ce, **out.aux})
                out.loss.backward()
        with record_function("dormouse.prefetch"):  # while the GPU runs this step; a pure function of (seed, step)
            self.next_batch = (step + 1, self._read_batch(step + 1))
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
                    values = self._checked_values(step, terms, stacked)
            else:  # eager, and --cuda-graph --no-graph-update (one process: the averaging and shards are no-ops)
                average_sparse_grads_(self.model, self.world)  # DDP averaged the dense gradients during backward
                # The global grad norm before clipping (a tensor, no sync); `dormouse replay` compares it bitwise.
                # The sparse-aware clip: the engram table's gradient is sparse.
                shards = [m.weight for _, m in sharded_tables(self.model)]  # --engram-shard: this rank's rows only
                self.grad_norm = clip_grad_norm_(self.model.parameters(), max_norm, split=shards, world=self.world)
                with record_function("dormouse.check"):
                    values = self._checked_values(step, terms, _stacked(terms))
                self.opt.step()
            if self.ema is not None:
                self.ema.update(step)
            self.opt.zero_grad(set_to_none=True)
        return values["ce"]

    @staticmethod
    def _checked_values(step: int, terms: dict[str, torch.Tensor], stacked: torch.Tensor) -> dict[str, float]:
        """The step's one host sync, after the backward has been queued: every term's value at once (from
        `stacked`, `_stacked(terms)`); a non-finite one stops the run before the update (the eager path
        runs the update after this check, the graphed one skips it on the device)."""
        values = dict(zip(terms, stacked.tolist(), strict=True))
        for name, value in values.items():
            if not math.isfinite(value):
                raise NonFiniteError(f"step {step}: training {name} is {value}; stopping before the update")
        return values

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
        record, window_ce, window_ms = None, [], []
        interrupt = _DeferredInterrupt()
        stop = False
        try:
            while self.step < end and not stop:
                started = time.perf_counter()
                ce = self.train_step(self.step)
                self.step += 1
                window_ms.append((time.perf_counter() - started) * 1000)
                self.step_ms.append(window_ms[-1])
                if len(self.step_ms) == 1:  # this process's first step: the cold start
                    since = time.monotonic() - dormouse.IMPORTED
                    self.log(
                        f"first step: {self.first_step_s:.1f} s, {since:.1f} s since dormouse was imported "
                        f"(before it: {since - self.first_step_s:.1f} s, fla's import {fla_kernels.import_s:.1f} s)"
                    )
                window_ce.append(ce)
                spike = self.stress.update(ce)
                if spike:
                    self.log(f"loss spike at step {self.step}: ce={ce:.4f} ({self.stress.summary()})")
                if self.world.is_main:
                    append_jsonl(self.run / "metrics.jsonl", {"kind": "train", "step": self.step, "ce": ce})
                bar.update(1)
                tok_s = t.batch_size * t.seq_len / (window_ms[-1] / 1000)
                bar.set_postfix_str(f"loss {ce:.3f} bpb {ce / math.log(2):.3f} {tok_s:,.0f} tok/s")
                # One decision for every rank: they stop after the same step, with one eval and checkpoint.
                stop = self.world.any(time.monotonic() >= deadline or interrupt.requested)
                last = self.step == end or stop
                new_best = early = False
                if self.step % t.eval_every == 0 or last:
                    record = self.evaluate(window_ce, window_ms)
                    new_best = record["step"] == self.best_step
                    early = not last and self.patience_spent()
                    window_ce, window_ms = [], []
                if new_best or self.step % t.ckpt_every == 0 or last or early:
                    self.save(is_best=new_best)
                if early:
                    self.stop_early()
                    stop = True
        except KeyboardInterrupt:
            if interrupt.requested:  # a second signal: stopped at once, inside a step or a save
                self.log(self._lost_note())
            raise
        finally:
            interrupt.restore()
            bar.close()
        self.write_result()
        if interrupt.requested:
            self.log(f"interrupted: stopped after step {self.step} with a checkpoint; --resume {self.run} goes on")
            raise KeyboardInterrupt
        return record

    def patience_spent(self) -> bool:
        """Whether the best held-out bpb is `patience` evals old: none of the evals of the last
        patience × eval_every steps beat it (with evals every eval_every steps, `patience` evals in a row).
        Read from the step and the best step alone, so a resumed run applies the same rule."""
        t = self.cfg.train
        return (
            bool(t.patience) and self.best_step is not None and self.step - self.best_step >= t.patience * t.eval_every
        )

    def stop_early(self) -> None:
        """Say and record that the run stops here: its best is `patience` evals old (the checkpoint is saved)."""
        t = self.cfg.train
        self.early_stop_step = self.step
        evals = (self.step - self.best_step) // t.eval_every
        if self.world.is_main:
            record = {"kind": "early_stop", "step": self.step, "patience": t.patience, "evals": evals}
            append_jsonl(self.run / "metrics.jsonl", record | {"best_step": self.best_step, "best_bpb": self.best_bpb})
        self.log(
            f"early stop: {evals} evals without a better held-out bpb (patience {t.patience}); stopped after step "
            f"{self.step} of {t.steps} with a checkpoint; best {self.best_bpb:.4f} at step {self.best_step}"
        )

    def result(self) -> dict:
        """The run's result as run.json records it: its best held-out eval, the checkpoint that holds it
        (relative to the run directory; `--ckpt best` loads it), and its latest eval."""
        best = None if self.best_step is None else f"ckpt/{checkpoint.step_dir_name(self.best_step)}"
        last_step, last_bpb = self.last_eval or (None, None)
        return {
            "best_step": self.best_step,
            "best_bpb": self.best_bpb,
            "best_checkpoint": best,
            "last_eval_step": last_step,
            "last_eval_bpb": last_bpb,
            "early_stop_step": self.early_stop_step,
        }

    def result_line(self) -> str:
        return runs.result_line(self.run, self.result())

    def write_result(self) -> None:
        """run.json gets the result (its other keys kept); train.log its line."""
        if not self.world.is_main:
            return
        meta = json.loads((self.run / "run.json").read_text())
        runs.write_atomic(self.run / "run.json", json.dumps({**meta, **self.result()}, indent=2) + "\n")
        with open(self.run / "train.log", "a") as f:
            f.write(self.result_line() + "\n")

    def _lost_note(self) -> str:
        """What a stop at once loses: the steps after the last committed checkpoint (read from disk: a save
        the signal cut short committed nothing)."""
        saved = checkpoint.last_step(self.run) if self.world.is_main else self.saved_step
        if saved is None:
            return f"interrupted again: steps 1-{self.step} not saved; no checkpoint yet"
        if self.step <= saved:
            return f"interrupted again: nothing lost; last checkpoint step {saved}; --resume {self.run} goes on"
        lost = f"step {self.step}" if self.step == saved + 1 else f"steps {saved + 1}-{self.step}"
        return f"interrupted again: {lost} not saved; last checkpoint step {saved}; --resume {self.run} goes on"

    @property
    def first_step_s(self) -> float | None:
        """This process's first training step in seconds (compiling, capture); None before it."""
        return self.step_ms[0] / 1000 if self.step_ms else None

    def scored_weights(self):
        """The weights a score of this run is of, in the model for a `with` block: the weight average
        under `ema_decay` (swapped in and back), else the trained weights as they are."""
        return self.ema.in_model() if self.ema is not None else contextlib.nullcontext()

    def evaluate(self, window_ce: list[float], window_ms: list[float]) -> dict:
        t = self.cfg.train
        with self.scored_weights():
            held = heldout_score(
                self.model,
                self.corpus,
                seq_len=t.seq_len,
                batch_size=t.batch_size,
                eval_bytes=t.eval_bytes,
                device=self.device,
                autocast=self.autocast,
                world=self.world,
            )
        record = eval_record(
            self.step,
            held,
            train_ce=sum(window_ce) / len(window_ce) if window_ce else None,
            tokens=self.step * t.batch_size * t.seq_len,
            ms_per_step=sorted(window_ms)[len(window_ms) // 2] if window_ms else None,
            depth=depth_field(self.cfg, self.depths),
            stress=self.stress.summary(),
        )
        record["wall_s"] = time.monotonic() - dormouse.IMPORTED  # start-up and compiling included
        if self.ema is not None:
            record["weights"] = f"ema{t.ema_decay:g}"
        self.depths = []
        counters.reset_all()
        ledger.COUNTS.clear()
        if self.world.is_main:
            append_jsonl(self.run / "metrics.jsonl", record)
        self.log(eval_line(record))
        self.last_eval = (self.step, held.bpb)
        if self.best_bpb is None or held.bpb < self.best_bpb:
            self.best_bpb, self.best_step = held.bpb, self.step
        return record

    def save(self, *, is_best: bool) -> None:
        """Checkpoint the state after `self.step` updates (once per step; `best` when it is the new best)."""
        if self.saved_step == self.step:
            return
        whole = gather_shards(self.model, self.opt, self.world)  # --engram-shard: every rank sends rank 0 its rows
        sharded = is_sharded(self.model)  # FSDP: every rank sends its shards, rank 0 writes the whole state
        if not self.world.is_main and not sharded:  # every replica holds the same state: rank 0 is the one writer
            self.saved_step = self.step
            return
        keep = self.world.is_main
        model_state, tensors, stamp = self.model.checkpoint_parts(
            gathered(self.model.state_dict(), keep) if sharded else None
        )
        # The tables' row-wise optimizer state is table-sized: it travels in the tables' own file.
        optimizer_state, table_state = self.opt.split_state_dict()
        optimizer_state = gathered(optimizer_state, keep) if sharded else optimizer_state
        tensors, optimizer_state, table_state = with_whole_tables(
            whole, ENGRAM_FILE, tensors, optimizer_state, table_state
        )
        if not keep:
            self.saved_step = self.step
            return
        if self.ema is not None:
            tensors = {**tensors, EMA_FILE: self.ema.state_dict()}
        state = {
            "run_id": self.run_id,
            "best_bpb": self.best_bpb,
            "best_step": self.best_step,
            "sampler": {"seed": self.cfg.train.seed, "next_step": self.step},
            "stress": self.stress.state_dict(),
        }
        state["extra"] = {"config": self.cfg.to_dict(), **stamp}
        checkpoint.save(
            self.run,
            self.step,
            model_state=model_state,
            tensors=tensors,
            optimizer_state=optimizer_state,
            optimizer_tensors={ENGRAM_FILE: table_state} if table_state else None,
            state=state,
            is_best=is_best,
            keep_last=self.cfg.train.keep_last,
        )
        self.saved_step = self.step


def _stacked(terms: dict[str, torch.Tensor]) -> torch.Tensor:
    """A step's loss terms in one fp32 vector on their device (one copy to the host reads them all)."""
    return torch.stack([v.detach().float() for v in terms.values()])


class _DeferredInterrupt:
    """Ctrl-C (SIGINT) or SIGTERM (a scheduler's preemption; what torchrun forwards to its workers when it
    is itself stopped) ends the run at the next step boundary, after an eval and a checkpoint, never inside
    an update: a state saved between two optimizers' steps would be half-updated. A second signal stops
    at once."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.requested = False
        self.previous = {}
        if threading.current_thread() is threading.main_thread():
            self.previous = {sig: signal.signal(sig, self._handle) for sig in self.SIGNALS}

    def _handle(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def restore(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
