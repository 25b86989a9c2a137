"""Worker of tests/test_distributed.py, run under torchrun (gloo, one thread per rank):

    torchrun --standalone --nproc-per-node 2 tests/ddp_worker.py train CORPUS OUT SINGLE_RUN
    torchrun --standalone --nproc-per-node 2 tests/ddp_worker.py hang CORPUS OUT

`train`: trains OUT/run with `tiny_config()` under --parallel ddp (rank 0 writes it) and saves each
rank's model state to OUT/rank-<r>.pt; then resumes SINGLE_RUN (a one-process run of the same config)
at this world size and writes the eval of its last checkpoint to OUT/resumed-<r>.json; last, trains
OUT/unused with `UNUSED` (steps where parameters get no gradient) and saves OUT/unused-<r>.pt; then
OUT/ema with the weight average on (`EMA_DECAY`) and saves each rank's average to OUT/ema-<r>.pt, then
OUT/aux with both auxiliary terms (`AUX`), OUT/mor with MoR (`MOR`) and OUT/odd with 3 heads (`ODD`),
saving each rank's state to OUT/<name>-<r>.pt; then a
step whose loss is NaN on rank 1 only: each rank writes the error it raised to OUT/nan-<r>.txt.
Then the same run under --parallel fsdp: trains OUT/fsdp (FSDP2), saves each rank's whole model state,
gathered, to OUT/fsdp-rank-<r>.pt and its last grad norm and shard sizes to OUT/fsdp-<r>.json; then
resumes SINGLE_RUN sharded and writes its eval to OUT/fsdp-resumed-<r>.json; last, trains
OUT/fsdp-unused with `UNUSED`, OUT/fsdp-aux with `AUX`, OUT/fsdp-mor with `MOR` and OUT/fsdp-odd with
`ODD`, saving each rank's gathered state to OUT/fsdp-<name>-<r>.pt.
`hang`: rank 1 sleeps instead of joining the first collective; rank 0 must fail within `dist_timeout`.

    torchrun --standalone --nproc-per-node 2 tests/ddp_worker.py shard CORPUS OUT SINGLE_RUN

`shard`: trains OUT/replicated (`tiny_config()`) and OUT/sharded (the same with --engram-shard), the
same pair without gradient clipping (OUT/replicated-noclip, OUT/sharded-noclip), then resumes SINGLE_RUN
with its tables sharded and writes the eval of its last checkpoint to OUT/shard-resumed-<r>.json.

    torchrun --standalone --nproc-per-node 2 tests/ddp_worker.py kill CORPUS OUT

`kill`: trains OUT/run under --parallel fsdp; rank 1 SIGKILLs itself when step KILL_AT starts, after the
checkpoint of step 2. torchrun must notice, stop rank 0 and exit non-zero naming rank 1.

    python tests/ddp_worker.py teardown N

`teardown` (no torchrun): N process groups of one rank in turn, each block ending right after a
collective on a temporary tensor, with a DDP replica freed after the block. Before `joined` kept the
group until exit, freeing the replica destroyed the group while gloo's worker thread still held the
collective's tensor, and the process deadlocked (hung within 5-34 of 100 blocks in 8 of 8 runs).
"""

import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

import torch

from dormouse import config
from dormouse.data.shards import load_corpus
from dormouse.evaluation import NonFiniteError
from dormouse.parallel.world import joined
from dormouse.resolve import resolve
from dormouse.train.trainer import Trainer

# The engram on (its tables replicated or sharded), dropout off (a rank draws its own masks, so a parallel run
# is not one process's with it), the Sinkhorn routing (the matrices FSDP shards with their momentum), no
# weight average (refused with sharded parameters; the EMA run sets its own), and the schedule, decay and
# clean bytes test_distributed.py's tolerances were measured with.
MODEL = {"d_model": 32, "n_heads": 2, "ffn_hidden": 64, "kda_chunk_size": 16, "engram_rows": 1024, "engram_dim": 8}
MODEL |= {"engram": True, "dropout": 0.0}
TRAIN = {"seq_len": 32, "batch_size": 4, "steps": 4, "warmup_steps": 2, "eval_every": 2, "ckpt_every": 2}
TRAIN |= {"opt": "sinkhorn", "ema_decay": 0.0, "lr_floor": 0.1, "weight_decay": 0.1, "byte_noise": 0.0}


def tiny_config(model=None, **train):
    """The test's config; `parallel` resolves to ddp under torchrun (WORLD_SIZE 2), to none alone."""
    layers = {"model": {**MODEL, **(model or {})}, "train": {**TRAIN, **train}}
    return resolve(config.build("nano", layers), cuda_available=False)


# Steps that leave parameters without a gradient: experts no row chose, and at depth 2 with one
# iteration of backprop the memory (first iteration only) and the first iteration's inputs.
UNUSED = {"model": {"n_experts": 4}, "rand_depth": True, "rand_depth_bptt": 1, "steps": 3, "eval_every": 3}
EMA_DECAY = 0.8  # the weight average's run: every eval scores the average
AUX = {"model": {"dspark_weight": 0.2, "jepa_weight": 0.2}}  # both auxiliary terms on
MOR = {"model": {"mor": True}}  # routed iterations: top-k over each sequence, the router's BCE term
ODD = {"model": {"d_model": 48, "n_heads": 3}}  # 3 heads: beta's projection has 3 rows, odd for 2 ranks


def train(corpus_dir: str, out: str, single_run: str) -> None:
    corpus, out = load_corpus(corpus_dir), Path(out)
    cfg = tiny_config()
    with joined(cfg.train) as world:
        trainer = Trainer(cfg, corpus, out / "run", corpus_note="ddp test", world=world)
        trainer.run_loop()
        torch.save(trainer.model.state_dict(), out / f"rank-{world.rank}.pt")
        resumed = Trainer(cfg, corpus, single_run, corpus_note="ddp test", resume=True, world=world)
        record = resumed.evaluate([], [])
        (out / f"resumed-{world.rank}.json").write_text(json.dumps(record))
        sparse = Trainer(tiny_config(**UNUSED), corpus, out / "unused", corpus_note="ddp test", world=world)
        sparse.run_loop()
        torch.save(sparse.model.state_dict(), out / f"unused-{world.rank}.pt")
        averaged = Trainer(tiny_config(ema_decay=EMA_DECAY), corpus, out / "ema", corpus_note="ddp test", world=world)
        averaged.run_loop()
        torch.save(averaged.ema.state_dict(), out / f"ema-{world.rank}.pt")
        for name, extra in (("aux", AUX), ("mor", MOR), ("odd", ODD)):
            other = Trainer(tiny_config(**extra), corpus, out / name, corpus_note="ddp test", world=world)
            other.run_loop()
            torch.save(other.model.state_dict(), out / f"{name}-{world.rank}.pt")
        poisoned = Trainer(tiny_config(), corpus, out / "nan", corpus_note="ddp test", world=world)
        if world.rank == 1:  # a NaN loss on one rank only
            forward = poisoned.model.forward
            poisoned.model.forward = lambda *args, **kwargs: _nan_loss(forward(*args, **kwargs))
        try:
            poisoned.train_step(0)
        except NonFiniteError as e:
            (out / f"nan-{world.rank}.txt").write_text(str(e))
        fsdp(corpus, out, single_run, world)


def fsdp(corpus, out: Path, single_run: str, world) -> None:
    """The `train` mode's FSDP2 part, in the same process group."""
    from dormouse.parallel.fsdp import gathered

    cfg = tiny_config(parallel="fsdp")
    trainer = Trainer(cfg, corpus, out / "fsdp", corpus_note="fsdp test", world=world)
    trainer.run_loop()
    torch.save(gathered(trainer.model.state_dict()), out / f"fsdp-rank-{world.rank}.pt")
    matrices = trainer.opt.optimizers["matrices"]
    params = matrices.param_groups[0]["params"]
    facts = {
        "grad_norm": trainer.step_runner.grad_norm.item(),  # of the last step: the clip's global norm
        # (global rows, this rank's rows) of each matrix and of its momentum buffer
        "rows": [[p.shape[0], p.to_local().shape[0]] for p in params],
        "momentum_rows": [matrices.state[p]["momentum_buffer"].to_local().shape[0] for p in params],
    }
    (out / f"fsdp-{world.rank}.json").write_text(json.dumps(facts))
    resumed = Trainer(cfg, corpus, single_run, corpus_note="fsdp test", resume=True, world=world)
    (out / f"fsdp-resumed-{world.rank}.json").write_text(json.dumps(resumed.evaluate([], [])))
    for name, extra in (("unused", UNUSED), ("aux", AUX), ("mor", MOR), ("odd", ODD)):
        other = Trainer(
            tiny_config(parallel="fsdp", **extra), corpus, out / f"fsdp-{name}", corpus_note="x", world=world
        )
        other.run_loop()
        torch.save(gathered(other.model.state_dict()), out / f"fsdp-{name}-{world.rank}.pt")


KILL_AT = 3  # 0-based: the 4th step; the last checkpoint is step 2's


def kill(corpus_dir: str, out: str) -> None:
    cfg = tiny_config(parallel="fsdp", dist_timeout=20.0)
    with joined(cfg.train) as world:
        trainer = Trainer(cfg, load_corpus(corpus_dir), Path(out) / "run", corpus_note="kill test", world=world)
        if world.rank == 1:
            step = trainer.train_step
            trainer.train_step = lambda s: os.kill(os.getpid(), signal.SIGKILL) if s == KILL_AT else step(s)
        trainer.run_loop()


def shard(corpus_dir: str, out: str, single_run: str) -> None:
    corpus, out = load_corpus(corpus_dir), Path(out)
    sharded = tiny_config(engram_shard=True)
    with joined(sharded.train) as world:
        pairs = {"": {}, "-noclip": {"grad_clip": 0.0}}
        for suffix, train in pairs.items():
            for name, shard_rows in (("replicated", False), ("sharded", True)):
                cfg = tiny_config(engram_shard=shard_rows, **train)
                Trainer(cfg, corpus, out / f"{name}{suffix}", corpus_note="shard test", world=world).run_loop()
        resumed = Trainer(sharded, corpus, single_run, corpus_note="shard test", resume=True, world=world)
        (out / f"shard-resumed-{world.rank}.json").write_text(json.dumps(resumed.evaluate([], [])))


def _nan_loss(out):
    out.loss = out.loss * float("nan")
    return out


def hang(corpus_dir: str, out: str) -> None:
    cfg = tiny_config(dist_timeout=3.0)
    with joined(cfg.train) as world:
        if world.rank == 1:
            time.sleep(60)
        Trainer(cfg, load_corpus(corpus_dir), Path(out) / "run", corpus_note="ddp test", world=world)


def teardown(blocks: str) -> None:
    from torch import distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    for _ in range(int(blocks)):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        with joined(tiny_config(parallel="ddp", dist_timeout=20.0).train):
            replica = DistributedDataParallel(torch.nn.Linear(4, 4))
            dist.all_reduce(torch.ones(1))  # its tensor's last owner is gloo's worker thread
        del replica  # the replica's reducer held the group: freeing it must not destroy the group here


if __name__ == "__main__":
    torch.set_num_threads(1)
    {"train": train, "hang": hang, "kill": kill, "shard": shard, "teardown": teardown}[sys.argv[1]](*sys.argv[2:])
