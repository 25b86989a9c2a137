"""Row-sharded engram tables (`--engram-shard` under `--parallel ddp`): rank r of W holds the rows
i ≡ r (mod W) of every memory's table, and a lookup fetches the rows it needs from their owners.

Applied from outside the model, as DDP is (`parallelize`): `shard_tables_(model, world)` replaces each
`Engram.table` (an `nn.Embedding`) by a `ShardedTable` holding this rank's rows, before the optimizers are
built, so SparseRowAdam's moments and step counts are this rank's rows too. `Engram._lookup` calls the table as
before; the rest of the model does not know.

Partition: row i (of the one big table, `a·rows + key` for arm a) lives on rank `i mod W`, at local
index `i // W`. Keys are uniform within each arm, so every rank owns ~1/W of every arm's rows and gets
~1/W of each batch's distinct keys, whatever the orders and heads; contiguous blocks of W would hand
whole arms to one rank (the order-4 arms have far more distinct keys than the order-2 ones). W need
not divide the row count: ranks own ⌈N/W⌉ or ⌊N/W⌋ rows.

One lookup of idx [..., arms] (global rows) on every rank at once (`_Lookup`, an autograd.Function):

1. dedupe: `unique(idx)` (sorted), grouped by owner; the count per owner goes out first
   (`all_to_all_single` of W int64), then the row ids (`all_to_all_single` with those split sizes);
2. each owner gathers the rows asked of it from its shard and sends them back (`all_to_all_single`);
3. the requester scatters them into [..., arms, D] (`unique`'s inverse).

Backward sends each distinct row's gradient back to its owner the same way (one `all_to_all_single`);
the owner sums the ranks' contributions per row and divides by W (the mean over ranks that DDP takes
of dense gradients), a sparse COO gradient of its shard. SparseRowAdam then updates the owned rows only.
Every rank must make the same lookups in the same order (each forward; in the eval a rank without a
batch joins with an empty request: `idle_lookups`). Only dense `all_to_all_single`, `all_reduce` and
`gather` are used (gloo on the CPU has all three; tested there, NCCL never run).

Equal to the replicated path (`parallel/ddp.py`): the forward's rows are copies, so the forward is
bitwise. The gradient is summed in the replicated path's order (one `coalesce` of the rank's lookups,
then the ranks' sums added in rank order and divided by W), so at W = 2 (one addition per row,
commutative) the table gradients are bitwise. The gradient norm is not: it adds the shards' squared
norms (`train/sparse.py`'s `clip_grad_norm_`, its `split`), so a clipped step differs in the last
bits (docs/distributed.md has the measured difference).

Checkpoints stay in the one-process format: `gather_shards` sends every shard and its SparseRowAdam
state to rank 0, which writes whole tables; a whole table loads into a ShardedTable by taking its rows
(`ShardedTable._load_from_state_dict`, `local_table_state`). So a sharded run resumes at any world
size, sharded or not, and a replicated one resumes sharded.
"""

import torch
import torch.distributed as dist
from torch import nn

from dormouse.model.engram import Engram
from dormouse.parallel.world import World

# ---- the partition ---------------------------------------------------------------------------------------


def owner(rows: torch.Tensor, world_size: int) -> torch.Tensor:
    """The rank that holds each global row."""
    return rows % world_size


def local_index(rows: torch.Tensor, world_size: int) -> torch.Tensor:
    """Where each global row sits in its owner's shard."""
    return rows // world_size


def shard_size(num_rows: int, rank: int, world_size: int) -> int:
    """Rows rank `rank` holds of a table of `num_rows`: len(range(rank, num_rows, world_size))."""
    return max(0, (num_rows - rank + world_size - 1) // world_size)


# ---- one lookup, in stages (the unit test runs them for several ranks in one process) ---------------------


class Request:
    """What one rank asks for: its distinct rows, grouped by owner (`ids`, `counts` per owner)."""

    def __init__(self, idx: torch.Tensor, world_size: int):
        self.shape = tuple(idx.shape)
        self.flat = idx.reshape(-1)
        self.uniq, self.inverse = torch.unique(self.flat, sorted=True, return_inverse=True)
        own = owner(self.uniq, world_size)
        self.perm = torch.argsort(own, stable=True)  # distinct rows in owner order
        self.ids = self.uniq.index_select(0, self.perm)
        self.counts = torch.bincount(own, minlength=world_size)

    def assemble(self, rows: torch.Tensor) -> torch.Tensor:
        """The owners' rows [U, D] (in `ids` order) -> one row per lookup [*shape, D]."""
        by_value = torch.empty_like(rows).index_copy_(0, self.perm, rows)
        return by_value.index_select(0, self.inverse).reshape(*self.shape, rows.shape[-1])

    def gradients(self, grad: torch.Tensor, num_rows: int) -> torch.Tensor:
        """Per distinct row, the sum of its lookups' gradients [U, D] in `ids` order.

        Summed by `coalesce` of the lookups' sparse gradient, the very tensor nn.Embedding(sparse=True)
        produces and the replicated path coalesces: the same additions, in the same order."""
        dim = grad.shape[-1]
        g = torch.sparse_coo_tensor(self.flat.unsqueeze(0), grad.reshape(-1, dim), (num_rows, dim)).coalesce()
        return g.values().index_select(0, self.perm)


def serve(weight: torch.Tensor, ids: torch.Tensor, world_size: int) -> torch.Tensor:
    """An owner's rows for the global row ids asked of it."""
    return weight.index_select(0, local_index(ids, world_size))


def owner_gradient(ids: torch.Tensor, grads: torch.Tensor, shard_rows: int, world_size: int) -> torch.Tensor:
    """The sparse gradient of an owner's shard from the (row id, gradient) pairs the ranks sent, in rank
    order: summed per row (as `average_sparse_grads_` sums the gathered rows), divided by W."""
    dim = grads.shape[-1]
    total = torch.sparse_coo_tensor(local_index(ids, world_size).unsqueeze(0), grads, (shard_rows, dim)).coalesce()
    return torch.sparse_coo_tensor(total.indices(), total.values() / world_size, (shard_rows, dim), is_coalesced=True)


def _exchange(tensor: torch.Tensor, send: list[int], recv: list[int]) -> torch.Tensor:
    out = tensor.new_empty(sum(recv), *tensor.shape[1:])
    dist.all_to_all_single(out, tensor.contiguous(), recv, send)
    return out


class _Lookup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, weight, idx, num_rows, world_size):
        req = Request(idx, world_size)
        recv_counts = torch.empty_like(req.counts)
        dist.all_to_all_single(recv_counts, req.counts)
        send, recv = req.counts.tolist(), recv_counts.tolist()  # split sizes are host ints: one sync
        ids = _exchange(req.ids, send, recv)
        rows = _exchange(serve(weight, ids, world_size), recv, send)
        ctx.req, ctx.ids, ctx.send, ctx.recv = req, ids, send, recv
        ctx.num_rows, ctx.world_size, ctx.shard_rows = num_rows, world_size, weight.shape[0]
        return req.assemble(rows)

    @staticmethod
    def backward(ctx, grad):
        sent = ctx.req.gradients(grad, ctx.num_rows)
        got = _exchange(sent, ctx.send, ctx.recv)
        return owner_gradient(ctx.ids, got, ctx.shard_rows, ctx.world_size), None, None, None


# ---- the module ------------------------------------------------------------------------------------------


class ShardedTable(nn.Module):
    """This rank's rows (i ≡ rank mod W) of an engram table, called like the nn.Embedding it replaces.

    `weight` [shard_size, D] is declared sparse (SparseRowAdam); its gradient is sparse COO. Loading a
    whole table [num_rows, D] takes this rank's rows; a shard-sized one is loaded as is.
    """

    def __init__(self, table: nn.Embedding, rank: int, world_size: int):
        super().__init__()
        self.num_rows, self.dim = table.weight.shape
        self.rank, self.world_size = rank, world_size
        self.weight = nn.Parameter(table.weight.detach()[rank::world_size].clone())
        self._dormouse_route = "sparse"  # row-wise updates, as the table it replaces

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return _Lookup.apply(self.weight, idx, self.num_rows, self.world_size)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        key = prefix + "weight"
        whole = state_dict.get(key)
        if whole is not None and whole.shape[0] == self.num_rows != self.weight.shape[0]:
            state_dict[key] = whole[self.rank :: self.world_size]
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def extra_repr(self) -> str:
        return f"rows {self.rank}::{self.world_size} of {self.num_rows}, dim={self.dim}"


def shard_tables_(model: nn.Module, world: World) -> int:
    """Replace every engram memory's table by this rank's rows; returns how many were sharded.

    Alone (W = 1) nothing changes: one process holds every row, which is what sharding over one rank
    is. Call before the optimizers are built (they must hold the shards)."""
    if world.size == 1:
        return 0
    memories = [m for m in model.modules() if isinstance(m, Engram)]
    for m in memories:
        m.table = ShardedTable(m.table, world.rank, world.size)
    return len(memories)


def sharded_tables(model: nn.Module) -> list[tuple[str, ShardedTable]]:
    """(parameter name, module) of every sharded table, in module order (the same on every rank)."""
    return [(f"{name}.weight", m) for name, m in model.named_modules() if isinstance(m, ShardedTable)]


def idle_lookups(model: nn.Module, times: int = 1) -> None:
    """Join `times` forwards' lookups with nothing to ask (an eval rank without a batch): every memory's
    table once per forward, in the forward's order (ascending insertion layer)."""
    tables = [m for _, m in sharded_tables(model)]
    for _ in range(times):
        for t in tables:
            with torch.no_grad():
                t(torch.empty(0, dtype=torch.int64, device=t.weight.device))


# ---- checkpoints: whole tables on rank 0, this rank's rows on load -----------------------------------------


def gather_shards(model: nn.Module, opt, world: World) -> tuple[dict, dict] | None:
    """Every sharded table and its SparseRowAdam state, whole, on rank 0 (None elsewhere, and None
    everywhere without sharded tables). Every rank must call it: each shard goes to rank 0 by `gather`.

    Returns ({table parameter name: [N, D]}, {"<name>.<state key>": whole state}) in the keys of
    `checkpoint_parts` and `Optimizers.split_state_dict`. A rank whose rows never had a gradient holds
    no state yet; its rows are zeros then, SparseRowAdam's initial state (as in one process). Rank 0
    holds every table whole meanwhile: the memory a one-process checkpoint needs too.
    """
    tables = sharded_tables(model)
    if not tables:
        return None
    sparse = opt.optimizers.get("sparse")
    whole_tables, whole_state = {}, {}
    for name, m in tables:
        whole_tables[name] = _gather(m.weight.detach(), m, world)
        state = {} if sparse is None else sparse.state.get(m.weight, {})
        anywhere = world.sum(torch.tensor([float(bool(state))], device=m.weight.device))
        if not anywhere.item():
            continue
        if not state:
            state = sparse._init_state(m.weight)
        for key in ("exp_avg", "exp_avg_sq", "step"):
            whole_state[f"{name}.{key}"] = _gather(state[key], m, world)
    return (whole_tables, whole_state) if world.is_main else None


def _gather(shard: torch.Tensor, m: ShardedTable, world: World) -> torch.Tensor | None:
    width = shard_size(m.num_rows, 0, world.size)  # rank 0 holds the most rows
    padded = shard.new_zeros(width, *shard.shape[1:])
    padded[: shard.shape[0]] = shard
    parts = [torch.empty_like(padded) for _ in range(world.size)] if world.is_main else None
    dist.gather(padded, parts, dst=0)
    if not world.is_main:
        return None
    whole = shard.new_empty(m.num_rows, *shard.shape[1:])
    for r, part in enumerate(parts):
        whole[r :: world.size] = part[: shard_size(m.num_rows, r, world.size)]
    return whole


def with_whole_tables(whole, file: str, tensors: dict, optimizer_state: dict, table_state: dict):
    """Rank 0's checkpoint parts with the gathered tables and state in place of its own shards."""
    if whole is None:
        return tensors, optimizer_state, table_state
    tables, state = whole
    tensors = {**tensors, file: {**tensors.get(file, {}), **tables}}
    table_state = {**table_state, **state}
    return tensors, {**optimizer_state, "sparse_tensors": sorted(table_state)}, table_state


def local_table_state(model: nn.Module, table_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A checkpoint's whole SparseRowAdam state ({"<name>.<key>": [N, ...]}) cut to this rank's rows."""
    shards = dict(sharded_tables(model))
    out = {}
    for key, t in table_state.items():
        m = shards.get(key.rsplit(".", 1)[0])
        out[key] = t if m is None or t.shape[0] != m.num_rows else t[m.rank :: m.world_size].clone()
    return out
