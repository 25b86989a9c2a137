"""dormouse's own Triton kernel for the backward of RMSNorm.add_and_norm's fused path.

fla's layer-norm backward with a residual gradient (`layer_norm_bwd`, `dres`) runs at 146 us a call on
an H200 at [64, 512, 512] (16 bytes an element: 1.8 TB/s, torch profiler), where its
backward without one runs at 3.1 TB/s: its programs, one per SM, walk their rows in turn and load the
residual gradient only after the rest of a tile's arithmetic. Here each program takes a few rows whole,
loads everything first, and writes the branch's gradient (its dtype), the stream's (fp32) and a part of
the weight's gradient; the parts are summed in a fixed order afterwards (deterministic). The arithmetic is
fla's: dx = (w·dy − x̂·mean(x̂·w·dy))·rstd + dres, dw = Σ dy·x̂.

Imported only where Triton is (CUDA machines; the dev set-up, whose tests run it under Triton's
interpreter): `ops.norm.fla.add_norm_kernels()` looks it up. The block is fixed (no autotuning at a cold start; two
processes run the same kernel).
"""

import torch
import triton
import triton.language as tl

TILE = 8192  # elements of one [rows, D] fp32 tile per operand: 16 rows of D = 512 (2048 programs at B 64)
WARPS = 4


@triton.jit
def _add_norm_bwd_kernel(
    s, w, rstd, dy, dsum, dx, dsum_in, dw_part, T,
    D: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr, HAS_DSUM: tl.constexpr,
):  # fmt: skip
    i_t = tl.program_id(0).to(tl.int64)
    o_t = i_t * BT + tl.arange(0, BT)
    o_d = tl.arange(0, BD)
    m_t, m_d = o_t < T, o_d < D
    m = m_t[:, None] & m_d[None, :]
    offs = o_t[:, None] * D + o_d[None, :]
    b_s = tl.load(s + offs, mask=m, other=0.0).to(tl.float32)
    b_dy = tl.load(dy + offs, mask=m, other=0.0).to(tl.float32)
    b_rstd = tl.load(rstd + o_t, mask=m_t, other=0.0)
    b_w = tl.load(w + o_d, mask=m_d, other=0.0).to(tl.float32)
    b_xhat = b_s * b_rstd[:, None]
    b_wdy = b_dy * b_w[None, :]
    b_c1 = tl.sum(b_xhat * b_wdy, axis=1) / D
    b_dx = (b_wdy - b_xhat * b_c1[:, None]) * b_rstd[:, None]
    if HAS_DSUM:
        b_dx += tl.load(dsum + offs, mask=m, other=0.0).to(tl.float32)
    tl.store(dsum_in + offs, b_dx.to(dsum_in.dtype.element_ty), mask=m)
    tl.store(dx + offs, b_dx.to(dx.dtype.element_ty), mask=m)
    tl.store(dw_part + i_t * D + o_d, tl.sum(b_dy * b_xhat, axis=0), mask=m_d)


def backward(dy, normed, weight, rstd, dsum, x_dtype):
    """Rows [T, D]: dy (the output's gradient), normed (the sum x + residual the forward normalised,
    fp32), rstd [T] fp32, dsum (the sum's own gradient, or None: nothing read the sum). Returns (dx in
    x_dtype, the residual's gradient in normed's dtype, dw in weight's dtype); where x_dtype is normed's,
    the two gradients are one tensor."""
    T, D = normed.shape
    dy = dy.contiguous()
    dsum = None if dsum is None else dsum.contiguous()
    dsum_in = torch.empty_like(normed)
    dx = dsum_in if x_dtype == normed.dtype else torch.empty(T, D, dtype=x_dtype, device=normed.device)
    block = triton.next_power_of_2(D)
    rows = max(1, TILE // block)
    programs = triton.cdiv(T, rows)
    dw_part = torch.empty(programs, D, dtype=torch.float32, device=normed.device)
    _add_norm_bwd_kernel[(programs,)](
        normed, weight, rstd, dy, dy if dsum is None else dsum, dx, dsum_in, dw_part, T, D=D, BT=rows, BD=block,
        HAS_DSUM=dsum is not None, num_warps=WARPS,
    )  # fmt: skip
    return dx, dsum_in, dw_part.sum(0).to(weight.dtype)
