"""dormouse's Triton kernel for SparseRowAdam's row update on CUDA (train/sparse.py).

For the touched rows idx (distinct) with their gradient rows g, the keep mask (a row with an all-zero
gradient, or every row of a skipped step, is kept as it is) and the per-row bias corrections (computed by
torch in float64 on the [k] counts, on either path), one pass does

    m ← β1 m + (1 − β1) g,   v ← β2 v + (1 − β2) g²                      where kept
    W ← W − step_size · m / (sqrt(v) / bc2 + eps)                          where kept and lr ≠ 0

reading g and the rows of m, v and W once and writing the three back. torch's form gathers each row set
into new tensors, runs ~15 elementwise ops on them and scatters them back (`index_copy_`): ~25 passes of
[k, D] where this is 7 (0.23 ms a step at `small` B 64 on an H200). The arithmetic is
torch's in fp32, with IEEE square root and division; the compiler may fuse a product and a sum into one
rounding where torch's kernels round twice (within fp32's error: tests/gpu/test_row_plan.py).

Imported only where Triton is (CUDA machines; the dev set-up, whose tests run it under Triton's
interpreter): `ops.row_sum.kernels()` looks it up. The block is fixed.
"""

import torch
import triton
import triton.language as tl

TILE = 1024  # elements of one [rows, D] tile: 16 rows of 64, 8 a thread (95 registers, not 206 at 2048)
WARPS = 4


@triton.jit
def _row_adam_kernel(
    idx, g, keep, step_size, bc2, m_all, v_all, w_all, k, beta1, one_minus_beta1, beta2, one_minus_beta2, eps,
    D: tl.constexpr, BR: tl.constexpr, BD: tl.constexpr, UPDATE_W: tl.constexpr,
):  # fmt: skip
    o_r = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)
    m_r = o_r < k
    o_d = tl.arange(0, BD)
    mask = m_r[:, None] & (o_d < D)[None, :]
    rows = tl.load(idx + o_r, mask=m_r, other=0)
    kept = (tl.load(keep + o_r, mask=m_r, other=0) != 0)[:, None]
    offs = rows[:, None] * D + o_d[None, :]
    b_g = tl.load(g + o_r[:, None] * D + o_d[None, :], mask=mask, other=0.0).to(tl.float32)
    b_m = tl.load(m_all + offs, mask=mask, other=0.0)
    b_v = tl.load(v_all + offs, mask=mask, other=0.0)
    b_m = tl.where(kept, b_m * beta1 + b_g * one_minus_beta1, b_m)
    b_v = tl.where(kept, b_v * beta2 + one_minus_beta2 * b_g * b_g, b_v)
    tl.store(m_all + offs, b_m, mask=mask)
    tl.store(v_all + offs, b_v, mask=mask)
    if UPDATE_W:
        b_step = tl.load(step_size + o_r, mask=m_r, other=0.0)[:, None]
        b_bc2 = tl.load(bc2 + o_r, mask=m_r, other=1.0)[:, None]
        denom = tl.div_rn(tl.sqrt_rn(b_v), b_bc2) + eps
        b_w = tl.load(w_all + offs, mask=mask, other=0.0)
        b_w = tl.where(kept, b_w - b_step * tl.div_rn(b_m, denom), b_w)
        tl.store(w_all + offs, b_w.to(w_all.dtype.element_ty), mask=mask)


def row_adam_(idx, g, keep, step_size, bc2, m_all, v_all, w_all, betas, eps: float) -> None:
    """The module docstring's update of the rows `idx` [k] (distinct) of the fp32 moments m_all, v_all and
    the table w_all [R, D] (contiguous), for gradient rows g [k, D] and keep [k] (bool); step_size and
    bc2 [k] fp32 are the rows' bias corrections, or both None to move the moments only (lr 0)."""
    k, D = g.shape
    if not all(t.is_contiguous() for t in (g, m_all, v_all, w_all)) or m_all.dtype != torch.float32:
        raise ValueError("the row-Adam kernel takes contiguous tables and fp32 moments")
    if k == 0:
        return
    width = triton.next_power_of_2(D)
    BR = max(1, TILE // width)
    update_w = step_size is not None
    (beta1, beta2) = betas
    _row_adam_kernel[(triton.cdiv(k, BR),)](
        idx, g, keep, step_size if update_w else g, bc2 if update_w else g, m_all, v_all, w_all, k,
        beta1, 1 - beta1, beta2, 1 - beta2, eps, D=D, BR=BR, BD=width, UPDATE_W=update_w, num_warps=WARPS,
    )  # fmt: skip
