"""Data parallelism for the trainer, applied from outside the model: torch's DistributedDataParallel
(`--parallel ddp`) or FSDP2 (`--parallel fsdp`, `fully_shard`) for the dense parameters, the engram
tables' sparse gradients all-gathered here under both.

Every rank holds a whole replica. DDP averages each dense gradient over the ranks during backward, so
after `backward()` every rank holds the gradient of the whole global batch (each rank's slice has the
same number of targets: the mean of the ranks' mean losses is the batch mean) and steps the routed
optimizers on whole tensors. NesterovSinkhorn's row/column normalisation therefore sees whole
matrices, as in one process; under FSDP it gathers them (dormouse.train.optim).
`find_unused_parameters=True`: some steps leave parameters without a gradient (unchosen experts, the
memories under `rand_depth_bptt`); DDP then traverses the autograd graph once per step to find them.

Engram tables (`nn.Embedding(sparse=True)`) are left out of DDP. DDP would reduce them through the
backend's sparse all-reduce (gloo has one); `average_sparse_grads_` instead uses only dense
`all_gather`, which every backend has, so the CPU tests run the GPU's path. Per table and step: an
all-gather of each rank's row count, then of its coalesced row indices (int64) and rows (D floats),
padded to the largest rank's k rows: W·k·(8 + 4D) bytes received per rank, against R·4D for a dense
all-reduce of the whole table (R rows). Every rank adds the same gathered rows in the same order
(rank order, then `coalesce`), so the tables stay bit-identical on every rank.

FSDP2 shards each block layer and the root on dim 0 of every dense parameter (DTensors); the tables
are `ignored_params`: replicated, as under DDP. A sharded forward is a collective (the eval keeps the
ranks in step: `evaluation.heldout_score`), and so is a checkpoint: `gathered` consolidates the
weights and the optimizer state into rank 0's one-process format, and `sharded_model_state` /
`shard_optimizer_state_` slice a loaded one-process state back to each rank's shards, so checkpoints
move between world sizes and between ddp and fsdp (docs/distributed.md).
"""

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.nn.parallel import DistributedDataParallel

from dormouse.distributed import World
from dormouse.model.engram_shard import sharded_tables


def sparse_tables(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """(name, weight) of every embedding with sparse gradients: the rule DDP itself uses."""
    return [
        (f"{name}.weight", m.weight)
        for name, m in model.named_modules()
        if isinstance(m, nn.Embedding | nn.EmbeddingBag) and m.sparse
    ]


def data_parallel(model: nn.Module, world: World, parallel: str = "ddp") -> nn.Module:
    """What a training step calls: `model` alone, its DDP replica without the sparse tables, or under
    `parallel` fsdp `model` itself, sharded in place (`fully_shard`)."""
    if world.size == 1:
        return model
    if parallel == "fsdp":
        return _fully_sharded(model, world)
    tables = sparse_tables(model)
    shards = [name for name, _ in sharded_tables(model)]  # --engram-shard: each rank's own rows, kept out of DDP
    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, [name for name, _ in tables] + shards)
    for _, table in tables:  # DDP starts the replicas from rank 0's state: the tables too
        dist.broadcast(table.data, src=0)
    device_ids = [world.local_rank] if world.backend == "nccl" else None
    return DistributedDataParallel(model, device_ids=device_ids, find_unused_parameters=True, broadcast_buffers=False)


@torch.no_grad()
def average_sparse_grads_(model: nn.Module, world: World) -> None:
    """Replace each sparse table gradient by its mean over the ranks, coalesced (alone: nothing to do).

    A table no rank looked up keeps `grad` None, as in one process.
    """
    if world.size == 1:
        return
    for _, table in sparse_tables(model):
        grad = None if table.grad is None else table.grad.coalesce()
        k = -1 if grad is None else grad.indices().shape[1]
        counts = _all_gather(torch.tensor([k], device=table.device), world)
        if all(int(c) < 0 for c in counts):
            continue
        width = max(1, *(int(c) for c in counts))  # gloo and NCCL gather no empty tensors
        rows = torch.zeros(width, dtype=torch.int64, device=table.device)
        values = torch.zeros(width, table.shape[1], dtype=table.dtype, device=table.device)
        if k > 0:
            rows[:k], values[:k] = grad.indices()[0], grad.values()
        all_rows, all_values = _all_gather(rows, world), _all_gather(values, world)
        kept = [max(int(c), 0) for c in counts]
        rows = torch.cat([r[:n] for r, n in zip(all_rows, kept, strict=True)])
        values = torch.cat([v[:n] for v, n in zip(all_values, kept, strict=True)])
        total = torch.sparse_coo_tensor(rows.unsqueeze(0), values, table.shape).coalesce()
        table.grad = torch.sparse_coo_tensor(
            total.indices(), total.values() / world.size, table.shape, is_coalesced=True
        )


def _all_gather(tensor: torch.Tensor, world: World) -> list[torch.Tensor]:
    out = [torch.empty_like(tensor) for _ in range(world.size)]
    dist.all_gather(out, tensor)
    return out


# ---- FSDP2 -----------------------------------------------------------------------------------------------------


def _fully_sharded(model: nn.Module, world: World) -> nn.Module:
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
