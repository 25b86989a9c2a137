"""FSDP2 (`--parallel fsdp`, `fully_shard`): each block layer and the root sharded on dim 0 of every dense
parameter (DTensors); the engram tables are `ignored_params`: replicated, their sparse gradients averaged
as under DDP (dormouse/parallel/ddp.py).

A sharded forward is a collective (the eval keeps the ranks in step: `evaluation.heldout_score`), and so
is a checkpoint: `gathered` consolidates the weights and the optimizer state into rank 0's one-process
format, and `sharded_model_state` / `shard_optimizer_state_` slice a loaded one-process state back to
each rank's shards, so checkpoints move between world sizes and between ddp and fsdp (docs/distributed.md).
"""

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor

from dormouse.parallel.ddp import sparse_tables
from dormouse.parallel.world import World


def fully_shard_model(model: nn.Module, world: World) -> nn.Module:
    """`model` sharded in place by FSDP2: each block layer one unit, the root (embedding, head, norms, the
    engram memories' projections, ...) another; every dense parameter becomes a DTensor sharded on dim 0.
    The engram tables stay out (`ignored_params`): replicated, their sparse gradients averaged by
    `average_sparse_grads_` as under DDP. Every rank starts from rank 0's weights, as DDP's replicas do."""
    for p in model.parameters():
        dist.broadcast(p.data, src=0)
    mesh = init_device_mesh("cuda" if world.backend == "nccl" else "cpu", (world.size,))
    tables = {table for _, table in sparse_tables(model)}
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh, ignored_params=tables)
    return model


def is_sharded(model: nn.Module) -> bool:
    """Whether `model` is sharded by FSDP2: every forward is then a collective, and so is a checkpoint."""
    return isinstance(model, FSDPModule)


def gathered(state, keep: bool = True):
    """`state` (a state dict, nested as optimizers nest theirs) with every DTensor replaced by its whole
    tensor on the CPU, everything else as it is. Under FSDP a collective: every rank calls it, on state
    of the same layout; with `keep` False (the ranks that do not write) each whole tensor is dropped as
    soon as it is gathered, so only one is held at a time."""
    if isinstance(state, DTensor):
        whole = state.full_tensor()
        return whole.cpu() if keep else None
    if isinstance(state, dict):
        return {k: gathered(v, keep) for k, v in state.items()}
    if isinstance(state, list | tuple):
        return type(state)(gathered(v, keep) for v in state)
    return state


def shard_like(full: torch.Tensor, like: DTensor) -> DTensor:
    """This rank's shard of `full` (the same on every rank) placed as `like`: a local slice, no communication."""
    return distribute_tensor(full.to(like.device), like.device_mesh, like.placements, src_data_rank=None)


def sharded_model_state(model: nn.Module, full: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A whole (one-process) state dict of `model`, each entry placed as the model's own: loadable by
    `load_state_dict` into the sharded model (alone or under DDP: `full` itself)."""
    own = model.state_dict()
    return {k: shard_like(v, own[k]) if isinstance(own.get(k), DTensor) else v for k, v in full.items()}


@torch.no_grad()
def shard_optimizer_state_(optimizers) -> None:
    """After a whole (one-process) optimizer state was loaded: each state tensor of a sharded parameter's
    shape (moments, momentum buffers) becomes the shard of it placed as the parameter; step counts stay."""
    for opt in optimizers.optimizers.values():
        for p, state in opt.state.items():
            if not isinstance(p, DTensor):
                continue
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and not isinstance(value, DTensor) and value.shape == p.shape:
                    state[key] = shard_like(value, p)
