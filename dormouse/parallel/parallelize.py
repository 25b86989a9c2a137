"""The parallelize step: a plain model, built by dormouse.model as for one process, made this rank's part
of a torchrun job (`--parallel ddp` or `fsdp`, `--engram-shard`). The model's code knows none of it."""

from torch import nn

from dormouse.parallel.ddp import replicate
from dormouse.parallel.engram_shard import shard_tables_
from dormouse.parallel.fsdp import fully_shard_model
from dormouse.parallel.world import World


def parallelize(model: nn.Module, world: World, train_cfg) -> nn.Module:
    """What a training step calls, for a resolved TrainConfig: `model` alone, its DDP replica without the
    sparse tables, or under fsdp `model` itself, sharded in place (`fully_shard`). With `engram_shard` the
    engram tables are first cut to this rank's rows, so call it before the optimizers are built."""
    if train_cfg.engram_shard:  # each rank keeps its rows of the engram tables (docs/distributed.md)
        shard_tables_(model, world)
    if world.size == 1:
        return model
    if train_cfg.parallel == "fsdp":
        return fully_shard_model(model, world)
    return replicate(model, world)
