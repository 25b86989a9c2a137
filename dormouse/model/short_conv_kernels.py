"""dormouse's own Triton kernels for the short conv's fused path: SiLU of a causal depthwise conv.

Why not fla's causal_conv1d: on the H200 at batch 64 its forward took 47 us and its backward 161 us
(a forward again, to recompute the pre-activation, then 114 us) per [64, 512, 512] bf16 call, three to
five times the time of the bytes they move; the backward here recomputes the pre-activation inside its
own tiles (benches/conv_probe.py measured both; docs/performance.md). Its results also differ in form:
the weight gradient is summed here in fp32 and returned in the weight's dtype (fla rounds it through the
input's dtype first).

Imported only where Triton is (CUDA machines): `short_conv.fused_kernels()` looks it up. Block sizes
are fixed constants, chosen once from the probe's sweep, so that two processes run the same kernels
and no autotuning happens at a cold start.

Layouts: x [B, T, C] with unit stride over C (a slice of a wider projection is fine), weight [C, W]
fp32 contiguous, y and dy [B, T, C] contiguous, dx [B, T, C] with unit stride over C.
"""

import torch
import triton
import triton.language as tl

# (time rows, channels, warps) per program, forward and backward: benches/conv_probe.py's sweep.
FWD_BLOCKS = (64, 64, 8)
BWD_BLOCKS = (64, 64, 8)


@triton.jit
def _fwd_kernel(
    x, w, y, T, stride_x_b, stride_x_t, C: tl.constexpr, W: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr
):
    i_d, i_t, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    o_t = (i_t * BT + tl.arange(0, BT)).to(tl.int64)
    o_d = i_d * BD + tl.arange(0, BD)
    m_d = o_d < C
    p_x = x + i_b.to(tl.int64) * stride_x_b
    acc = tl.zeros((BT, BD), dtype=tl.float32)
    for j in tl.static_range(W):  # y[t] = sum_j w[:, j] x[t - (W - 1) + j], zeros before the start
        t_src = o_t - (W - 1) + j
        m = ((t_src >= 0) & (t_src < T))[:, None] & m_d[None, :]
        b_x = tl.load(p_x + t_src[:, None] * stride_x_t + o_d[None, :], mask=m, other=0.0).to(tl.float32)
        b_w = tl.load(w + o_d * W + j, mask=m_d, other=0.0).to(tl.float32)
        acc += b_x * b_w[None, :]
    acc = acc * tl.sigmoid(acc)
    p_y = y + i_b.to(tl.int64) * T * C + o_t[:, None] * C + o_d[None, :]
    tl.store(p_y, acc.to(y.dtype.element_ty), mask=(o_t < T)[:, None] & m_d[None, :])


@triton.jit
def _bwd_kernel(
    x,
    w,
    dy,
    dx,
    dw,
    T,
    stride_x_b,
    stride_x_t,
    stride_dx_b,
    stride_dx_t,
    C: tl.constexpr,
    W: tl.constexpr,
    BT: tl.constexpr,
    BD: tl.constexpr,
):
    i_d, i_t, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    o_t = (i_t * BT + tl.arange(0, BT)).to(tl.int64)
    o_d = i_d * BD + tl.arange(0, BD)
    m_d = o_d < C
    p_x = x + i_b.to(tl.int64) * stride_x_b
    p_dy = dy + i_b.to(tl.int64) * T * C
    b_dx = tl.zeros((BT, BD), dtype=tl.float32)
    # dx[t] = sum_s w[:, W-1-s] da[t+s], da = dy * SiLU'(a) with a the pre-activation, recomputed here.
    for s in tl.static_range(W):
        t_s = o_t + s
        a = tl.zeros((BT, BD), dtype=tl.float32)
        for j in tl.static_range(W):
            t_src = t_s - (W - 1) + j
            m = ((t_src >= 0) & (t_src < T))[:, None] & m_d[None, :]
            b_x = tl.load(p_x + t_src[:, None] * stride_x_t + o_d[None, :], mask=m, other=0.0).to(tl.float32)
            a += b_x * tl.load(w + o_d * W + j, mask=m_d, other=0.0).to(tl.float32)[None, :]
        m_s = (t_s < T)[:, None] & m_d[None, :]
        b_dy = tl.load(p_dy + t_s[:, None] * C + o_d[None, :], mask=m_s, other=0.0).to(tl.float32)
        sig = tl.sigmoid(a)
        da = b_dy * sig * (1 + a * (1 - sig))
        b_dx += da * tl.load(w + o_d * W + (W - 1 - s), mask=m_d, other=0.0).to(tl.float32)[None, :]
        if s == 0:  # this tile's part of dw[:, j] = sum_t da[t] x[t - (W - 1) + j], summed over tiles later
            for j in tl.static_range(W):
                t_src = o_t - (W - 1) + j
                m = ((t_src >= 0) & (t_src < T))[:, None] & m_d[None, :]
                b_x = tl.load(p_x + t_src[:, None] * stride_x_t + o_d[None, :], mask=m, other=0.0).to(tl.float32)
                p_dw = dw + (i_b * tl.num_programs(1) + i_t).to(tl.int64) * C * W + o_d * W + j
                tl.store(p_dw, tl.sum(da * b_x, 0), mask=m_d)
    p_dx = dx + i_b.to(tl.int64) * stride_dx_b + o_t[:, None] * stride_dx_t + o_d[None, :]
    tl.store(p_dx, b_dx.to(dx.dtype.element_ty), mask=(o_t < T)[:, None] & m_d[None, :])


def forward(x: torch.Tensor, weight: torch.Tensor, blocks: tuple[int, int, int] = FWD_BLOCKS) -> torch.Tensor:
    """SiLU(causal depthwise conv of x [B, T, C] with weight [C, W]), contiguous [B, T, C] in x's dtype."""
    B, T, C = x.shape
    assert x.stride(-1) == 1 and weight.is_contiguous() and weight.shape[0] == C, (x.stride(), weight.shape)
    BT, BD, num_warps = blocks
    y = torch.empty(B, T, C, dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(C, BD), triton.cdiv(T, BT), B)
    _fwd_kernel[grid](
        x, weight, y, T, x.stride(0), x.stride(1), C=C, W=weight.shape[1], BT=BT, BD=BD, num_warps=num_warps
    )
    return y


def backward(
    x: torch.Tensor, weight: torch.Tensor, dy: torch.Tensor, dx: torch.Tensor, blocks: tuple[int, int, int] = BWD_BLOCKS
) -> torch.Tensor:
    """Writes the input's gradient into `dx` (x's shape, unit stride over C); returns the weight's [C, W],
    in the weight's dtype, summed in fp32 over per-tile parts in a fixed order."""
    B, T, C = x.shape
    W = weight.shape[1]
    assert dy.is_contiguous() and dx.stride(-1) == 1 and dx.shape == x.shape, (dy.stride(), dx.stride())
    BT, BD, num_warps = blocks
    grid = (triton.cdiv(C, BD), triton.cdiv(T, BT), B)
    parts = torch.empty(B * grid[1], C, W, dtype=torch.float32, device=x.device)
    _bwd_kernel[grid](
        x,
        weight,
        dy,
        dx,
        parts,
        T,
        x.stride(0),
        x.stride(1),
        dx.stride(0),
        dx.stride(1),
        C=C,
        W=W,
        BT=BT,
        BD=BD,
        num_warps=num_warps,
    )
    return parts.sum(0).to(weight.dtype)
