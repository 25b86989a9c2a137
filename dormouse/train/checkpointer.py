"""A run's training state to and from its checkpoints (dormouse/checkpoint.py writes and verifies the files).

The state is everything a resumed run needs to go on bitwise as the uninterrupted one: the weights, the
optimizers' state, the weight average, the StressMonitor, the step and the best held-out score. The files
hold the one-process format at any world size: under FSDP or --engram-shard the ranks send rank 0 their
shards and rows to write, and each rank takes its own part back at a resume.
"""

from pathlib import Path
from typing import NamedTuple

from dormouse import checkpoint, runs
from dormouse.config import Config
from dormouse.data.shards import Corpus
from dormouse.errors import ConfigError
from dormouse.model.model import ENGRAM_FILE, DormouseLM
from dormouse.parallel.engram_shard import gather_shards, local_table_state, with_whole_tables
from dormouse.parallel.fsdp import gathered, is_sharded, shard_optimizer_state_, sharded_model_state
from dormouse.parallel.world import World
from dormouse.train.ema import EMA_FILE, WeightAverage
from dormouse.train.routing import Optimizers
from dormouse.train.stress import StressMonitor


class Restored(NamedTuple):
    """What a resume takes from the last checkpoint besides the tensors and monitor state it loads."""

    step: int
    run_id: str
    best_bpb: float | None
    best_step: int | None
    changed: dict  # the config fields this resume changed: runs.config_changes


class Checkpointer:
    """Saves run directory `run`'s training state (`save`, once per step) and loads its last one (`restore`)."""

    def __init__(
        self,
        run: Path,
        cfg: Config,
        model: DormouseLM,
        opt: Optimizers,
        ema: WeightAverage | None,
        stress: StressMonitor,
        world: World,
    ):
        self.run, self.cfg, self.world = run, cfg, world
        self.model, self.opt, self.ema, self.stress = model, opt, ema, stress
        self.saved_step: int | None = None  # the step of this process's latest save or restore

    def restore(self, corpus: Corpus) -> Restored:
        """Load the last checkpoint into the model, optimizers, weight average and monitor; refuse a resume
        on other data, or with a config that changes more than the RESUMABLE fields."""
        ck = checkpoint.load(self.run, "last")
        run_meta = runs.run_meta(self.run)
        # Only the RESUMABLE fields may differ from the config the checkpoint was trained with.
        changed = runs.config_changes(self.cfg.to_dict(), ck, "this resume's config")
        if run_meta["fingerprint"] != corpus.fingerprint:
            raise ConfigError(
                f"run {self.run} was trained on corpus {run_meta['fingerprint'][:12]}, this corpus is "
                f"{corpus.fingerprint[:12]}: resume on the same data"
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
        self.saved_step = ck.step
        state = ck.state
        return Restored(ck.step, state["run_id"], state["best_bpb"], state["best_step"], changed)

    def save(self, step: int, *, run_id: str, best_bpb: float | None, best_step: int | None, is_best: bool) -> None:
        """Checkpoint the state after `step` updates (once per step; `best` when it is the new best)."""
        if self.saved_step == step:
            return
        whole = gather_shards(self.model, self.opt, self.world)  # --engram-shard: every rank sends rank 0 its rows
        sharded = is_sharded(self.model)  # FSDP: every rank sends its shards, rank 0 writes the whole state
        if not self.world.is_main and not sharded:  # every replica holds the same state: rank 0 is the one writer
            self.saved_step = step
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
            self.saved_step = step
            return
        if self.ema is not None:
            tensors = {**tensors, EMA_FILE: self.ema.state_dict()}
        state = {
            "run_id": run_id,
            "best_bpb": best_bpb,
            "best_step": best_step,
            "sampler": {"seed": self.cfg.train.seed, "next_step": step},
            "stress": self.stress.state_dict(),
        }
        state["extra"] = {"config": self.cfg.to_dict(), **stamp}
        checkpoint.save(
            self.run,
            step,
            model_state=model_state,
            tensors=tensors,
            optimizer_state=optimizer_state,
            optimizer_tensors={ENGRAM_FILE: table_state} if table_state else None,
            state=state,
            is_best=is_best,
            keep_last=self.cfg.train.keep_last,
        )
        self.saved_step = step

    def last_saved(self) -> int | None:
        """The step of the run's last committed checkpoint: read from disk on rank 0 (a save a signal cut
        short committed nothing), this process's last save elsewhere."""
        return checkpoint.last_step(self.run) if self.world.is_main else self.saved_step
