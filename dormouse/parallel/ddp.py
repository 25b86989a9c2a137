"""DDP (`--parallel ddp`): torch's DistributedDataParallel for the dense parameters, the engram tables'
sparse gradients all-gathered here (under FSDP too: dormouse/parallel/fsdp.py leaves the tables to it).

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
"""

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from dormouse.parallel.engram_shard import sharded_tables
from dormouse.parallel.world import World


def sparse_tables(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """(name, weight) of every embedding with sparse gradients: the rule DDP itself uses."""
    return [
        (f"{name}.weight", m.weight)
        for name, m in model.named_modules()
        if isinstance(m, nn.Embedding | nn.EmbeddingBag) and m.sparse
    ]


def replicate(model: nn.Module, world: World) -> nn.Module:
    """`model`'s DDP replica, the sparse tables (and `--engram-shard`'s shards) kept out of DDP."""
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
