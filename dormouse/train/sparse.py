"""SparseRowAdam: row-wise ("lazy") Adam for the Engram tables, and a gradient clip that takes sparse gradients.

Per 2-D parameter W [R, D] (a table of R rows) with gradient G, at every step:

    rows = { r : G[r] has a non-zero entry }            the row set comes from the gradient
    for r in rows (only):
        s_r ← s_r + 1                                   per-row step count
        m_r ← β1 m_r + (1 − β1) G[r]
        v_r ← β2 v_r + (1 − β2) G[r]²
        W[r] ← W[r] − lr / (1 − β1^{s_r}) · m_r / (sqrt(v_r) / sqrt(1 − β2^{s_r}) + eps)

(torch.optim.Adam's update, with the step count and so the bias correction kept per row.) Rows not in
the set are left bit-identical, and so are their moments and step counts: they do not decay while a
row is unused ("lazy Adam", as torch.optim.SparseAdam). A row seen for the first time has s_r = 1 and
gets a full-size first update, however many steps the table has taken. A row that was looked up but
whose gradient is exactly zero is not updated (it is indistinguishable from an unused row).

No weight decay, and the constructor refuses one: decoupled decay of every row at every step would
erase rows that are merely rare (the memory), and decay of only the touched rows would penalise a row
in proportion to how often it is used. `routing.WEIGHT_DECAY["sparse"]` must therefore not be passed.

Cost per step: the gradient of `nn.Embedding(..., sparse=True)` (dormouse.model.engram.Engram's
default) is a sparse COO tensor with one entry per lookup. It is coalesced (sort + sum of duplicates:
O(L log L) for L lookups), and only those rows of W, m, v, s are gathered, updated and scattered back
(`index_copy_` with distinct sorted indices: deterministic); a row whose summed gradient is exactly zero
is written back unchanged (`torch.where`), not dropped: dropping it would make the host wait for the GPU
to count such rows, and on the H200 the GPU sat idle while the host ran this step. On CUDA with fp32
moments one Triton pass reads and writes those rows of m, v and W (ops/row_adam/; the counts
and the float64 bias corrections stay torch's ops on the [k] rows). Nothing of
size R is touched after the first step; the first step allocates the state (m, v in the parameter's
dtype promoted to fp32 at least, s int64: 2·R·D floats + R ints, once). A dense gradient is accepted
too and gives the same update, but finding its non-zero rows reads all R·D entries (and backward has
already written them): O(table) per step.

State dict: torch's layout (`state` per parameter: exp_avg, exp_avg_sq [R, D], step [R] int64), plus
`load_state_dict` keeps the saved dtypes (torch would cast the moments to the parameter's dtype) and
moves every state tensor to the parameter's device. Like torch's, the state dict and a loaded state
share tensors with their source: serialise before stepping again.
"""

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from dormouse.ops import row_adam, row_sum
from dormouse.ops.row_adam.reference import distinct_rows_write


def _touched_rows(grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(sorted distinct row indices [k], their gradient rows [k, D], which of them have a non-zero entry
    [k] bool). A sparse gradient's looked-up rows whose sum is exactly zero stay in the first two, marked
    False: dropping them would make the host wait for the GPU to count them."""
    if grad.is_sparse:
        if grad.sparse_dim() != 1 or grad.dense_dim() != 1:
            raise ValueError(
                f"SparseRowAdam needs a row-sparse gradient (sparse_dim 1, dense_dim 1, as nn.Embedding's); "
                f"got sparse_dim {grad.sparse_dim()}, dense_dim {grad.dense_dim()}"
            )
        g = grad.coalesce()  # sums duplicate rows; indices sorted and distinct
        vals = g.values()
        return g.indices()[0], vals, vals.ne(0).any(dim=1)
    if grad.layout != torch.strided:
        raise ValueError(f"SparseRowAdam takes a dense or sparse COO gradient, got layout {grad.layout}")
    idx = grad.ne(0).any(dim=1).nonzero().squeeze(1)  # O(table): reads every entry
    return idx, grad.index_select(0, idx), torch.ones(idx.shape, dtype=torch.bool, device=idx.device)


class SparseRowAdam(torch.optim.Optimizer):
    """Lazy row-wise Adam with per-row step counts for 2-D tables (see the module docstring).

    `rows_updated` is the number of rows (over all parameters) the last `step()` updated.
    """

    def __init__(
        self,
        params,
        lr: float,
        betas: tuple[float, float] = (0.9, 0.95),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ):
        if lr < 0:
            raise ValueError(f"lr must be >= 0, got {lr}")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"betas must be in [0, 1), got {betas}")
        if eps < 0:
            raise ValueError(f"eps must be >= 0, got {eps}")
        if weight_decay != 0:
            raise ValueError(
                f"SparseRowAdam has no weight decay (got {weight_decay}): decaying table rows erases the "
                "memory of rare n-grams; route the tables with weight decay 0"
            )
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": 0.0}
        super().__init__(params, defaults)
        self._rows_updated: list[torch.Tensor] = []  # the last step's count per parameter, on its device
        # torch's GradScaler convention: a device scalar, 1 skips the step on the device (no row updated,
        # every row and moment left bit-identical); None steps unconditionally.
        self.found_inf: torch.Tensor | None = None

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        if group["weight_decay"] != 0:
            raise ValueError(f"SparseRowAdam has no weight decay; a param group asks for {group['weight_decay']}")
        for p in group["params"]:
            if p.ndim != 2:
                raise ValueError(f"SparseRowAdam updates 2-D tables [rows, dim]; got shape {tuple(p.shape)}")

    @staticmethod
    def _init_state(p: torch.Tensor) -> dict:
        dt = torch.promote_types(p.dtype, torch.float32)
        return {
            "exp_avg": torch.zeros(p.shape, dtype=dt, device=p.device),
            "exp_avg_sq": torch.zeros(p.shape, dtype=dt, device=p.device),
            "step": torch.zeros(p.shape[0], dtype=torch.int64, device=p.device),
        }

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._rows_updated = []
        for group in self.param_groups:
            lr, (beta1, beta2), eps = group["lr"], group["betas"], group["eps"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                idx, g, keep = _touched_rows(p.grad)
                if idx.numel() == 0:
                    continue
                if self.found_inf is not None:
                    keep = keep & (self.found_inf == 0)
                state = self.state[p]
                if not state:
                    state.update(self._init_state(p))
                m_all, v_all, s_all = state["exp_avg"], state["exp_avg_sq"], state["step"]
                g = g.to(m_all.dtype)
                # Every row of idx is gathered and written back; a row with a zero gradient (keep False)
                # gets its old count, moments and weight again, bit for bit.
                s = s_all.index_select(0, idx) + keep
                with distinct_rows_write():  # idx: coalesced, so distinct
                    s_all.index_copy_(0, idx, s)
                self._rows_updated.append(keep.sum())
                # lr 0: the moments and counts move as in Adam; the weights stay bit-identical. Else the
                # bias corrections per row, in float64 (as torch.optim.Adam's Python-float scalars); a
                # never-updated row (count 0, not kept) is corrected as if at 1 and then not written.
                step_size = bc2_sqrt = None
                if lr != 0:
                    sf = s.clamp(min=1).to(torch.float64)
                    step_size = (lr / (1 - torch.pow(beta1, sf))).to(m_all.dtype)
                    bc2_sqrt = torch.sqrt(1 - torch.pow(beta2, sf)).to(m_all.dtype)
                row_adam.row_adam_(idx, g, keep, step_size, bc2_sqrt, m_all, v_all, p, (beta1, beta2), eps)
        return loss

    @property
    def rows_updated(self) -> int:
        """How many rows (over all parameters) the last `step()` updated (reading it waits for the GPU)."""
        return int(sum(n.item() for n in self._rows_updated))

    def row_steps(self, p: torch.Tensor) -> torch.Tensor:
        """The per-row step counts [R] of parameter p (zeros before its first update)."""
        state = self.state.get(p)
        if not state:
            return torch.zeros(p.shape[0], dtype=torch.int64, device=p.device)
        return state["step"]

    def load_state_dict(self, state_dict: dict) -> None:
        ids = [i for g in state_dict["param_groups"] for i in g["params"]]
        params = [p for g in self.param_groups for p in g["params"]]
        if len(ids) != len(params):
            raise ValueError(f"optimizer state has {len(ids)} parameters; this optimizer has {len(params)}")
        saved = state_dict["state"]
        for i, p in zip(ids, params, strict=True):
            if i not in saved:
                continue
            st = saved[i]
            if set(st) != {"exp_avg", "exp_avg_sq", "step"}:
                raise ValueError(f"SparseRowAdam state for parameter {i} has keys {sorted(st)}")
            for key in ("exp_avg", "exp_avg_sq"):
                if tuple(st[key].shape) != tuple(p.shape):
                    raise ValueError(
                        f"state {key} of parameter {i} is {tuple(st[key].shape)}, table is {tuple(p.shape)}"
                    )
            if tuple(st["step"].shape) != (p.shape[0],) or st["step"].dtype != torch.int64:
                raise ValueError(
                    f"state step of parameter {i} is {st['step'].dtype} {tuple(st['step'].shape)}; "
                    f"needs int64 ({p.shape[0]},): one count per row"
                )
        super().load_state_dict(state_dict)
        # torch casts floating state to the parameter's dtype and leaves "step" on its saved device:
        # keep the saved dtypes (fp32 moments for a bf16 table, int64 counts), on the parameter's device.
        for i, p in zip(ids, params, strict=True):
            if i in saved:
                self.state[p] = {k: v.to(device=p.device) for k, v in saved[i].items()}


class RowPlan:
    """How to coalesce a table's gradient when its row indices are known before the gradient is: the
    indices sorted (stable), where each distinct row starts among them, and how many distinct rows.

    torch's `coalesce` counts the distinct rows on the GPU and waits for that count on the host, so it
    waits for the backward that made the gradient. A --cuda-graph step makes the plan of the next batch
    while the GPU runs this one (`GraphedStep.prefetch`): the count reaches the host by a copy queued
    then, and the next step coalesces without waiting (the coalesce's wait would leave the GPU idle while
    the host launches the update). The sums add each distinct row's gradient rows one by one in
    their order, from zero: torch's CUDA coalesce's additions (its CPU one adds in another order)."""

    def __init__(self, rows: torch.Tensor):
        self.sorted, self.order = torch.sort(rows.reshape(-1), stable=True)
        self.starts = torch.ones_like(self.sorted, dtype=torch.bool)  # where a distinct row begins
        self.starts[1:] = self.sorted[1:] != self.sorted[:-1]
        count = self.starts.sum()
        self._ready = None
        if count.is_cuda:  # copied while the GPU runs; read when the gradient exists
            self._count = torch.empty((), dtype=torch.int64, pin_memory=True).copy_(count, non_blocking=True)
            self._ready = torch.cuda.Event()
            self._ready.record()
        else:
            self._count = count

    @property
    def count(self) -> int:
        """The number of distinct rows (waits for the copy, long done when the plan was made ahead)."""
        if self._ready is not None:
            self._ready.synchronize()
            self._ready = None
        return int(self._count)

    def coalesce(self, values: torch.Tensor, num_rows: int) -> torch.Tensor:
        """The coalesced sparse gradient [num_rows, D] of `values` [N, D], one gradient row per index of
        the plan's rows in their order (nn.Embedding(sparse=True)'s uncoalesced values). On CUDA the sums
        run dormouse's Triton kernel (ops/row_sum/: torch's coalesce's additions and bits)."""
        k = self.count
        bounds = torch.nonzero_static(self.starts, size=k + 1, fill_value=self.starts.shape[0]).squeeze(1)
        summed = row_sum.row_sums(values, self.order, bounds, self.starts)
        rows = self.sorted.index_select(0, bounds[:k])
        # Unchecked: the rows are distinct and sorted by construction, and a check syncs the host.
        with torch.sparse.check_sparse_tensor_invariants(enable=False):
            return torch.sparse_coo_tensor(rows.unsqueeze(0), summed, (num_rows, values.shape[1]), is_coalesced=True)


@torch.no_grad()
def clip_grad_norm_(parameters, max_norm: float, *, split=(), world=None) -> torch.Tensor:
    """torch.nn.utils.clip_grad_norm_ (2-norm) that also takes sparse COO gradients (Engram tables).

    A sparse gradient is coalesced first (duplicate rows summed: the norm is of the summed gradient)
    and replaced by its coalesced form; its norm is that of its values. The total norm and the clip
    are torch's own (`get_total_norm`, `clip_grads_with_norm_`) for the dense gradients, so with no
    sparse gradient the result is torch's, bit for bit. Returns the total norm.

    Gradients that are DTensors (parameters sharded by FSDP2) join the total through the norm of all of
    them, whole (torch's `get_total_norm` gives a DTensor partial over the ranks; its `full_tensor()`
    all-reduces it); every other gradient (the replicated engram tables, identical on every rank) is
    counted once, from this rank's copy. `split` are parameters whose sparse gradients hold only this
    rank's rows (`--engram-shard`'s tables): their squared norms are summed over the ranks of `world`
    (one all-reduce, on every rank, with or without a gradient here).
    """
    dense, sparse = split_grads_(parameters)
    split_ids = {id(p) for p in split}
    whole = [p for p in sparse if id(p) not in split_ids]
    sharded = [p.grad for p in dense if isinstance(p.grad, DTensor)]
    if sharded:  # FSDP2: the shards' norm, all-reduced once; the replicated tables and the rest count once
        shards_norm = nn.utils.get_total_norm(sharded, 2.0)
        shards_norm = shards_norm.full_tensor() if isinstance(shards_norm, DTensor) else shards_norm
        rest = [p.grad for p in dense if not isinstance(p.grad, DTensor)] + [p.grad.values() for p in whole]
        total = nn.utils.get_total_norm([shards_norm, *rest], 2.0)
    else:
        norms_of = [p.grad for p in dense] + [p.grad.values() for p in whole]
        total = nn.utils.get_total_norm(norms_of, 2.0)
    if split_ids:
        sq = torch.zeros((), dtype=torch.float32, device=total.device)
        for p in split:
            if p.grad is not None:
                sq = sq + p.grad.values().float().pow(2).sum().to(sq.device)
        total = torch.sqrt(total.float() ** 2 + world.sum(sq))
    if dense:
        nn.utils.clip_grads_with_norm_(dense, max_norm, total)
    clip_sparse_grads_(sparse, max_norm, total)
    return total


def split_grads_(parameters) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The parameters with a gradient, as (dense, sparse); each sparse gradient is replaced by its
    coalesced form (duplicate rows summed), whose values are what its norm and clip see."""
    params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
    params = [p for p in params if p.grad is not None]
    sparse = [p for p in params if p.grad.is_sparse]
    for p in sparse:
        p.grad = p.grad.coalesce()
    return [p for p in params if not p.grad.is_sparse], sparse


def clip_sparse_grads_(sparse: list[torch.Tensor], max_norm: float, total: torch.Tensor) -> None:
    """Scale coalesced sparse gradients by the clip's coefficient, torch's min(max_norm / (total + 1e-6), 1)."""
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for p in sparse:
        p.grad.values().mul_(coef.to(p.grad.device, p.grad.dtype))
