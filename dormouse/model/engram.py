"""Engram: a hashed byte n-gram memory with a context-aware gate (DeepSeek, arXiv 2601.07372), byte-level.

Reference sheet: /work/shared/reference/components.md §2. Three parts, each with one implementation:

1. **Keys** (`engram_keys` in model/engram_keys.py, THE key function; training, eval and decode all call
   it, decode through `engram_keys_step`, which runs the same code on a rolling window). A pure function
   of (bytes, orders, heads, rows, seed); nothing else (no global RNG, no Python `hash()`, no device state).
2. **Tables**: one `nn.Embedding(arms · rows, dim)`; arm `a` owns rows `[a·rows, (a+1)·rows)`
   (`global_rows`). Updated row-wise by `dormouse.train.sparse.SparseRowAdam` (declared "sparse").
3. **Fusion** (`Engram.forward`): the arms' vectors, concatenated, are projected to a value and a key;
   the key is gated against the hidden state; the gated value, through the short conv
   (`EngramConv`), is what the caller adds to the residual.

A model may insert one `Engram` at each of several block layers (as the demo's `layer_ids`); each has
its own tables, projections, gate and conv, and hashes with its own seed `seed + 10007 · layer`
(`hash_seed`), so its multipliers differ from every other layer's.

The keys' hash formula, the contract, is model/engram_keys.py's docstring.
"""

from dataclasses import dataclass

import torch
from torch import nn

from dormouse.model.engram_keys import (
    EngramWindow,
    check_config,
    engram_keys,
    engram_keys_continue,
    engram_keys_step,
    key_fingerprint,
)
from dormouse.model.init import linear, normal_init_
from dormouse.model.norm import RMSNorm
from dormouse.model.short_conv import FusableConv
from dormouse.ops import engram_gate
from dormouse.ops import short_conv as conv_op

# ---- table rows ------------------------------------------------------------------------------------------


def global_rows(keys: torch.Tensor, rows: int) -> torch.Tensor:
    """Per-arm keys [..., arms] -> rows of the one big table: `a·rows + key` for arm a (same shape)."""
    arms = keys.shape[-1]
    return keys + torch.arange(arms, dtype=keys.dtype, device=keys.device) * rows


def table_rows_touched(keys: torch.Tensor, rows: int) -> torch.Tensor:
    """The sorted distinct table rows [k] that `keys` [..., arms] read: unique(global_rows(keys, rows))."""
    return torch.unique(global_rows(keys, rows).reshape(-1), sorted=True)


@dataclass
class EngramStats:
    """What engram lookups read, for the eval line's `engram=<rows>/<arms>`.

    reads  {insertion layer: the rows of that memory's table it read, int64 [n] (`global_rows`, the
           same row may repeat)}: one entry per memory, since each memory has its own table.
    arms   (position, arm) lookups made, over every memory (positions × arms per memory).

    `rows` = Σ over memories of the distinct rows of its table that were read (the same key in two
    arms is two rows). Adding stats (two memories of one forward, or the batches of an eval) unites
    the reads memory by memory, so over an eval pass a row read by several batches counts once;
    `arms` adds up. So 0 < rows ≤ arms whenever a memory ran on at least one position. The forward
    only keeps the row ids it looked up; the distinct count is taken when `rows` is read.
    """

    reads: dict[int, torch.Tensor]
    arms: int

    @property
    def rows(self) -> int:
        return sum(torch.unique(r).numel() for r in self.reads.values())

    def __add__(self, other: "EngramStats") -> "EngramStats":
        reads = dict(self.reads)
        for layer, rows in other.reads.items():
            mine = reads.get(layer)
            # Keep the union only: memory stays bounded by the distinct rows, however long the eval.
            reads[layer] = rows if mine is None else torch.unique(torch.cat([mine, rows.to(mine.device)]))
        return EngramStats(reads, self.arms + other.arms)

    def __str__(self) -> str:
        return f"{self.rows}/{self.arms}"


# ---- the short conv ------------------------------------------------------------------------------------

CONV_SIZE = 4  # the reference's kernel
LAYER_SEED_STRIDE = 10007  # the demo's per-layer hash seed: seed + 10007 · layer


class EngramConv(FusableConv):
    """The reference's short conv after the gate: `Y = ṽ + SiLU(CausalDWConv(RMSNorm(ṽ)))`.

    Depthwise over the d channels, kernel `size`, dilation `dilation` (max(orders) in the model),
    causal: with n = RMSNorm(ṽ) and w = weight[:, 0, :],

        Y_t = ṽ_t + SiLU( Σ_{i<size} w_i ⊙ n_{t − (size−1−i)·dilation} )      n_s = 0 for s < 0

    so Y_t reads ṽ at t, t − dilation, …, t − (size−1)·dilation only. A position before the sequence
    start reads zero: the demo's zero left padding (RMSNorm(0) = 0, so a zero ṽ is that padding).
    Decode carries the tail: the last (size−1)·dilation gated values ṽ.
    Init: weight N(0, 0.02), so Y ≈ ṽ at first; RMSNorm gain 1.

    The conv and its SiLU are the op ops/short_conv/ `dilated_short_conv`, the norm its fused input; which
    backend runs (`--conv-backend`, as for the KDA layers' short convs) is the op's choice.
    """

    def __init__(self, channels: int, size: int, dilation: int, eps: float):
        super().__init__()
        self.dilation = dilation
        self.norm = RMSNorm(channels, eps)
        self.weight = nn.Parameter(torch.empty(channels, 1, size))  # a depthwise conv filter [C, 1, k]

    def forward(self, v: torch.Tensor, tail: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """v [B, T, C] gated values, tail [B, (size−1)·dilation, C] of the positions before (None: the
        sequence start) -> (Y [B, T, C], the new tail)."""
        y, tail = conv_op.dilated_short_conv(v, tail, self.weight, self.dilation, self.norm, self.backend)
        return v + y, tail


@dataclass(frozen=True)
class EngramCache:
    """Decode state of a model's engram memories: the byte window (one for all of them: they hash the
    same bytes) and each memory's conv tail by insertion layer (absent or None: the sequence start)."""

    window: EngramWindow
    conv: dict[int, torch.Tensor | None]


# ---- the module ------------------------------------------------------------------------------------------


class Engram(nn.Module):
    """Hashed byte n-gram memory with a context-aware gate; returns what to add to the residual stream.

    For keys of the `arms = len(orders)·heads` arms at a position and hidden state `h ∈ R^d` there:

        e = concat_a table[a·rows + key_a]          ∈ R^{arms·dim}     (arm-major, as the keys)
        k = W_K e,  v = W_V e                       W_K, W_V: bias-free Linear(arms·dim → d)
        s = <RMSNorm_k(k), RMSNorm_h(h)> / sqrt(d)  (two RMSNorms with their own gains; s in fp32 at least)
        α = σ(s)                                    the paper's gate
        ṽ = α · v
        delta = ṽ + SiLU(CausalDWConv(RMSNorm(ṽ)))  with `conv` (EngramConv: kernel 4, dilation
                                                    max(orders)); delta = ṽ without

    k, v and ṽ are ops/engram_gate/'s: one matmul for both projections, and the gate fused into one
    Triton kernel each way where the norms run fused (`--norm-backend`, auto on CUDA).

    Not taken: the demo's signed square root of the logit, `σ(sign(s)·sqrt(max(|s|, 1e−6)))` (in
    deepseek-ai/Engram's engram_demo_v1.py, not in the paper's equation). Not implemented: the
    hyper-connection branches (M = 1 here). The tokenizer compression of the paper is the identity
    here (bytes are not case-folded).

    `layer` is the block layer the memory feeds; the keys hash with `hash_seed = seed + 10007·layer`
    (the demo's per-layer seed), so memories at different layers address their tables differently.

    Init (from `generator`, in this order): table N(0, 0.02), W_K, W_V N(0, 0.02), conv weight
    N(0, 0.02); RMSNorm gains 1.
    The table is declared `_dormouse_route = "sparse"` on its module (routing.py honours module
    declarations; they survive copies). With `sparse_grad=True` (default) its gradient is a sparse
    COO tensor with one entry per lookup, so backward and the optimizer cost O(lookups), not O(table);
    torch.nn.utils.clip_grad_norm_ and AdamW refuse sparse gradients (use
    dormouse.train.sparse.clip_grad_norm_ and SparseRowAdam). With `sparse_grad=False` the gradient is
    a dense table-sized tensor (O(table) per step).

    `forward(h, keys, conv_tail)`: h [B, T, d] with keys [B, T, arms] (from `self.keys`/`engram_keys`),
    or one decode position h [B, d] with keys [B, arms] (from `self.step_keys`); `conv_tail` continues
    the conv of earlier positions (None: the sequence start). Returns (delta shaped like h, in the
    projections' dtype (bf16 under autocast: the stream adds it in its own, model/loop.py's
    `Stream.join`), EngramStats, the conv's new tail or None without the conv).
    """

    def __init__(
        self,
        *,
        orders,
        heads: int,
        rows: int,
        dim: int,
        d_model: int,
        seed: int,
        generator: torch.Generator,
        layer: int = 0,
        conv: bool = True,
        eps: float = 1e-6,
        sparse_grad: bool = True,
    ):
        super().__init__()
        if layer < 0:
            raise ValueError(f"engram layer must be >= 0, got {layer}")
        self.hash_seed = seed + LAYER_SEED_STRIDE * layer
        self.orders = check_config(orders, heads, rows, self.hash_seed)
        self.heads, self.rows, self.dim, self.d_model = heads, rows, dim, d_model
        self.seed, self.layer = seed, layer
        self.arms = len(self.orders) * heads
        if dim < 1 or d_model < 1:
            raise ValueError(f"engram dim and d_model must be >= 1, got dim={dim} d_model={d_model}")
        n = self.arms * rows
        self.table = nn.Embedding(n, dim, _weight=torch.empty(n, dim), sparse=sparse_grad)
        self.table._dormouse_route = "sparse"  # row-wise updates (dormouse.train.sparse.SparseRowAdam)
        self.w_k = linear(self.arms * dim, d_model)
        self.w_v = linear(self.arms * dim, d_model)
        self.key_norm = RMSNorm(d_model, eps)
        self.hidden_norm = RMSNorm(d_model, eps)
        self.conv = EngramConv(d_model, CONV_SIZE, max(self.orders), eps) if conv else None
        # Set only while a CUDA graph captures a training step (dormouse/train/graphed.py): the looked-up
        # rows [B, T, arms, dim] the captured forward reads in place of the table, looked up eagerly.
        self.captured_rows: torch.Tensor | None = None
        self.reset_parameters(generator)

    def reset_parameters(self, gen: torch.Generator) -> None:
        normal_init_(self.table.weight, gen)
        normal_init_(self.w_k.weight, gen)
        normal_init_(self.w_v.weight, gen)
        self.key_norm.reset_parameters()
        self.hidden_norm.reset_parameters()
        if self.conv is not None:
            normal_init_(self.conv.weight, gen)
            self.conv.norm.reset_parameters()

    def extra_repr(self) -> str:
        return (
            f"layer={self.layer}, orders={self.orders}, heads={self.heads}, rows={self.rows}, dim={self.dim}, "
            f"hash_seed={self.hash_seed}"
        )

    # The key function with this module's configuration (so a model cannot hash with another one).

    def keys(self, input_ids: torch.Tensor, *, bytes_checked: bool = False) -> torch.Tensor:
        return engram_keys(input_ids, self.orders, self.heads, self.rows, self.hash_seed, bytes_checked=bytes_checked)

    def empty_window(self, batch_size: int, device: torch.device | str = "cpu") -> EngramWindow:
        return EngramWindow.empty(batch_size, self.orders, device)

    def step_keys(self, window: EngramWindow, byte: torch.Tensor) -> tuple[torch.Tensor, EngramWindow]:
        return engram_keys_step(window, byte, self.orders, self.heads, self.rows, self.hash_seed)

    def continue_keys(self, window: EngramWindow, input_ids: torch.Tensor) -> tuple[torch.Tensor, EngramWindow]:
        return engram_keys_continue(window, input_ids, self.orders, self.heads, self.rows, self.hash_seed)

    def fingerprint(self) -> str:
        return key_fingerprint(self.orders, self.heads, self.rows, self.hash_seed)

    @torch.compiler.disable
    def _lookup(self, idx: torch.Tensor) -> torch.Tensor:
        # Eager even inside torch.compile: AOTAutograd cannot trace the table's sparse gradient, so the
        # compiled graph breaks here and takes the looked-up rows as an input.
        if self.captured_rows is not None:
            if self.captured_rows.shape != (*idx.shape, self.dim):
                got = tuple(self.captured_rows.shape)
                raise ValueError(f"captured rows {got} do not match the lookups {tuple(idx.shape)} × dim {self.dim}")
            return self.captured_rows
        return self.table(idx)

    def forward(
        self, h: torch.Tensor, keys: torch.Tensor, conv_tail: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, EngramStats, torch.Tensor | None]:
        if keys.dtype != torch.int64:
            raise TypeError(f"engram keys must be int64, got {keys.dtype}")
        if keys.shape != (*h.shape[:-1], self.arms) or h.shape[-1] != self.d_model:
            raise ValueError(
                f"engram keys {tuple(keys.shape)} do not match hidden {tuple(h.shape)}: expected keys "
                f"{(*h.shape[:-1], self.arms)} ({self.arms} arms) and d_model {self.d_model}"
            )
        idx = global_rows(keys, self.rows)
        e = self._lookup(idx).flatten(-2)  # [..., arms·dim]
        delta = engram_gate.gate(h, e, self.w_v, self.w_k, self.hidden_norm, self.key_norm)
        if self.conv is not None:
            one = h.ndim == 2  # a decode position: the conv runs over time, so give it a time axis
            delta, conv_tail = self.conv(delta[:, None] if one else delta, conv_tail)
            delta = delta[:, 0] if one else delta
        stats = EngramStats({self.layer: idx.reshape(-1)}, keys.numel())
        return delta, stats, conv_tail
