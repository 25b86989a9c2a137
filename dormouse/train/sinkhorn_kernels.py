"""dormouse's Triton kernels for SR-Sinkhorn on CUDA (train/optim.py's `sr_sinkhorn` of a stack [N, m, n]).

torch's form launches a norm, a clamp, a division and a product per half-iteration: ~280 small kernels a
`small` step, 1.25 ms on the H200 in CUDA-graph replays (session 18, `benches/sinkhorn_probe.py`). Here an
iteration is three kernels: every row scaled to norm √n by one program each; each column's sum of squares
taken in blocks of rows; each column scaled to norm √m, its blocks' sums added in a fixed order. 0.41 ms
a step in the same replays. The arithmetic is torch's (norms clamped below at eps, so an all-zero row or
column stays zero; the targets √n, √m and eps fp32 scalars, as in torch's fp32 arithmetic); only the
order of the sums differs (~3e-7 relative). fp32 only: fp64, the reference precision, stays torch's.
Blocks are fixed: no autotuning, the same kernels in every process, and the same bits from call to call.

Imported only where Triton is (CUDA machines): `optim.sinkhorn_kernels()` looks it up.
"""

import math

import torch
import triton
import triton.language as tl

ROW_BLOCK = 4096  # columns a row program holds at once (it loops over wider rows)
ROWS_PER_PART = 64  # rows one column-sum program adds: parts [N, ⌈m / 64⌉, n]
PARTS_AT_ONCE = 64  # parts a column program loads at once (it loops over more)
COLUMN_TILE = (32, 64)  # (rows, columns) one column program rescales


@triton.jit
def _rows_kernel(src, dst, n, target, eps, BLOCK: tl.constexpr, WHOLE: tl.constexpr):
    """dst row = src row · target / max(‖src row‖, eps); one program a row."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    if WHOLE:  # the row fits one block: load it once
        m = cols < n
        x = tl.load(src + row * n + cols, mask=m, other=0.0)
        scale = target / tl.maximum(tl.sqrt(tl.sum(x * x, axis=0)), eps)
        tl.store(dst + row * n + cols, x * scale, mask=m)
    else:
        acc = tl.zeros([BLOCK], dtype=src.dtype.element_ty)
        for start in range(0, n, BLOCK):
            m = start + cols < n
            x = tl.load(src + row * n + start + cols, mask=m, other=0.0)
            acc += x * x
        scale = target / tl.maximum(tl.sqrt(tl.sum(acc, axis=0)), eps)
        for start in range(0, n, BLOCK):
            m = start + cols < n
            x = tl.load(src + row * n + start + cols, mask=m, other=0.0)
            tl.store(dst + row * n + start + cols, x * scale, mask=m)


@triton.jit
def _column_parts_kernel(x, part, m, n, parts, RB: tl.constexpr, BC: tl.constexpr):
    """part[matrix, row block, column] = Σ x² over the block's RB rows."""
    mat, i_c, i_r = tl.program_id(0).to(tl.int64), tl.program_id(1), tl.program_id(2)
    cols = i_c * BC + tl.arange(0, BC)
    rows = i_r * RB + tl.arange(0, RB)
    mask = (rows[:, None] < m) & (cols[None, :] < n)
    v = tl.load(x + mat * m * n + rows[:, None] * n + cols[None, :], mask=mask, other=0.0)
    tl.store(part + (mat * parts + i_r) * n + cols, tl.sum(v * v, axis=0), mask=cols < n)


@triton.jit
def _columns_kernel(x, part, m, n, parts, target, eps, PB: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr):
    """x column ·= target / max(‖column‖, eps), the squared norm summed from the parts in their order."""
    mat, i_c, i_r = tl.program_id(0).to(tl.int64), tl.program_id(1), tl.program_id(2)
    cols = i_c * BC + tl.arange(0, BC)
    ss = tl.zeros([BC], dtype=part.dtype.element_ty)
    for start in range(0, parts, PB):
        blocks = start + tl.arange(0, PB)
        mask = (blocks[:, None] < parts) & (cols[None, :] < n)
        ss += tl.sum(tl.load(part + (mat * parts + blocks[:, None]) * n + cols[None, :], mask=mask, other=0.0), axis=0)
    scale = target / tl.maximum(tl.sqrt(ss), eps)
    rows = i_r * BR + tl.arange(0, BR)
    mask = (rows[:, None] < m) & (cols[None, :] < n)
    p = x + mat * m * n + rows[:, None] * n + cols[None, :]
    tl.store(p, tl.load(p, mask=mask, other=0.0) * scale[None, :], mask=mask)


def sr_sinkhorn(u: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """SR-Sinkhorn of a CUDA fp32 stack u [N, m, n], in a new tensor; u unchanged."""
    if u.dtype != torch.float32 or u.ndim != 3:
        raise ValueError(f"the SR-Sinkhorn kernels take an fp32 stack [N, m, n]; got {u.dtype} {tuple(u.shape)}")
    u = u.contiguous()
    N, m, n = u.shape
    x = torch.empty_like(u)
    parts = triton.cdiv(m, ROWS_PER_PART)
    part = torch.empty(N, parts, n, dtype=u.dtype, device=u.device)
    block = min(triton.next_power_of_2(n), ROW_BLOCK)
    rows_of, cols_of = COLUMN_TILE
    col_blocks = triton.cdiv(n, cols_of)
    src = u
    for _ in range(iters):
        _rows_kernel[(N * m,)](src, x, n, math.sqrt(n), eps, BLOCK=block, WHOLE=block >= n)
        _column_parts_kernel[(N, col_blocks, parts)](x, part, m, n, parts, RB=ROWS_PER_PART, BC=cols_of)
        grid = (N, col_blocks, triton.cdiv(m, rows_of))
        _columns_kernel[grid](x, part, m, n, parts, math.sqrt(m), eps, PB=PARTS_AT_ONCE, BR=rows_of, BC=cols_of)
        src = x
    return x
