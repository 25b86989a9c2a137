"""dormouse's own Triton kernels for the engram gate's fused path (ops/engram_gate/): one each way.

The gate of a row, with RMSNorm's x̂ = x·rstd, rstd = 1/sqrt(mean(x²) + eps) and gains w_h, w_k:

    s = Σ (x̂_h·w_h)(x̂_k·w_k) · scale,   α = σ(s),   out = α·v

Forward reads h, k and v once and writes `out` (v's dtype) and three fp32 numbers a row (rstd_h, rstd_k,
α) for the backward. The torch path ran two norm kernels, a cast, a product, a sum, the sigmoid, a cast
and a product forward (each a pass over [rows, D]) and about as many backward (docs/performance.md).
Backward, for the output's gradient g:

    dv = α·g,   ds = Σ g·v · α(1 − α) · scale
    dy_h = ds·(x̂_k·w_k),   dy_k = ds·(x̂_h·w_h)                  (the gradients of the two norms' outputs)
    dx = (w·dy − x̂·mean(x̂·w·dy))·rstd,   dw = Σ_rows dy·x̂      (fla's RMSNorm backward, for each norm)

Each backward program walks `LOOPS` tiles of `BT` rows and keeps its part of the gains' gradients in
registers; the parts are summed in a fixed order afterwards (deterministic). All arithmetic in fp32,
rounded once at each store.

Imported only where Triton is (CUDA machines; the dev set-up, whose tests run it under Triton's
interpreter): `engram_gate.fused_kernels()` looks it up. The blocks are fixed (no autotuning at a cold
start; two processes run the same kernels).

Layouts: rows [N, D] with unit column stride (v and k may be column slices of one [N, 2D] tensor); out
and dh contiguous.
"""

import torch
import triton
import triton.language as tl

TILE = 2048  # elements of one [BT, D] tile per operand: 4 rows at D 512
LOOPS = 8  # backward tiles a program walks: 1024 programs and 2 MB of gain-gradient parts at B 64, T 512
WARPS = 4


@triton.jit
def _tile(x, rows, s_x, cols, m):
    return tl.load(x + rows[:, None] * s_x + cols[None, :], mask=m, other=0.0).to(tl.float32)


@triton.jit
def _rstd(b_x, eps, D: tl.constexpr):
    return 1.0 / tl.sqrt(tl.sum(b_x * b_x, axis=1) / D + eps)


@triton.jit
def _fwd_kernel(
    h, v, k, w_h, w_k, out, rstd_h, rstd_k, alpha, N, s_h, s_v, s_k, eps_h, eps_k, scale,
    D: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr,
):  # fmt: skip
    o_t = tl.program_id(0).to(tl.int64) * BT + tl.arange(0, BT)
    o_d = tl.arange(0, BD)
    m_t, m_d = o_t < N, o_d < D
    m = m_t[:, None] & m_d[None, :]
    b_h, b_k, b_v = _tile(h, o_t, s_h, o_d, m), _tile(k, o_t, s_k, o_d, m), _tile(v, o_t, s_v, o_d, m)
    b_wh = tl.load(w_h + o_d, mask=m_d, other=0.0).to(tl.float32)
    b_wk = tl.load(w_k + o_d, mask=m_d, other=0.0).to(tl.float32)
    b_rh, b_rk = _rstd(b_h, eps_h, D), _rstd(b_k, eps_k, D)
    b_dot = tl.sum((b_h * b_wh[None, :]) * (b_k * b_wk[None, :]), axis=1)
    b_a = tl.sigmoid(b_dot * b_rh * b_rk * scale)
    tl.store(out + o_t[:, None] * D + o_d[None, :], (b_a[:, None] * b_v).to(out.dtype.element_ty), mask=m)
    tl.store(rstd_h + o_t, b_rh, mask=m_t)
    tl.store(rstd_k + o_t, b_rk, mask=m_t)
    tl.store(alpha + o_t, b_a, mask=m_t)


@triton.jit
def _norm_input_grad(b_xhat, b_w, b_dy, b_rstd, D: tl.constexpr):
    b_wdy = b_dy * b_w[None, :]
    b_c = tl.sum(b_xhat * b_wdy, axis=1) / D
    return (b_wdy - b_xhat * b_c[:, None]) * b_rstd[:, None]


@triton.jit
def _bwd_kernel(
    h, v, k, w_h, w_k, rstd_h, rstd_k, alpha, g, dh, dv, dk, dwh_part, dwk_part,
    N, s_h, s_v, s_k, s_g, s_dv, s_dk, scale,
    D: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr, LOOPS: tl.constexpr,
):  # fmt: skip
    i_p = tl.program_id(0).to(tl.int64)
    o_d = tl.arange(0, BD)
    m_d = o_d < D
    b_wh = tl.load(w_h + o_d, mask=m_d, other=0.0).to(tl.float32)
    b_wk = tl.load(w_k + o_d, mask=m_d, other=0.0).to(tl.float32)
    b_dwh = tl.zeros([BD], dtype=tl.float32)
    b_dwk = tl.zeros([BD], dtype=tl.float32)
    for i in range(LOOPS):
        o_t = (i_p * LOOPS + i) * BT + tl.arange(0, BT)
        m_t = o_t < N
        m = m_t[:, None] & m_d[None, :]
        b_g, b_v = _tile(g, o_t, s_g, o_d, m), _tile(v, o_t, s_v, o_d, m)
        b_a = tl.load(alpha + o_t, mask=m_t, other=0.0)
        b_rh = tl.load(rstd_h + o_t, mask=m_t, other=0.0)
        b_rk = tl.load(rstd_k + o_t, mask=m_t, other=0.0)
        b_ds = tl.sum(b_g * b_v, axis=1) * b_a * (1.0 - b_a) * scale
        tl.store(dv + o_t[:, None] * s_dv + o_d[None, :], (b_a[:, None] * b_g).to(dv.dtype.element_ty), mask=m)
        b_hhat = _tile(h, o_t, s_h, o_d, m) * b_rh[:, None]
        b_khat = _tile(k, o_t, s_k, o_d, m) * b_rk[:, None]
        b_dyh = b_ds[:, None] * (b_khat * b_wk[None, :])
        b_dyk = b_ds[:, None] * (b_hhat * b_wh[None, :])
        b_dwh += tl.sum(b_dyh * b_hhat, axis=0)
        b_dwk += tl.sum(b_dyk * b_khat, axis=0)
        b_dh = _norm_input_grad(b_hhat, b_wh, b_dyh, b_rh, D)
        b_dk = _norm_input_grad(b_khat, b_wk, b_dyk, b_rk, D)
        tl.store(dh + o_t[:, None] * D + o_d[None, :], b_dh.to(dh.dtype.element_ty), mask=m)
        tl.store(dk + o_t[:, None] * s_dk + o_d[None, :], b_dk.to(dk.dtype.element_ty), mask=m)
    tl.store(dwh_part + i_p * D + o_d, b_dwh, mask=m_d)
    tl.store(dwk_part + i_p * D + o_d, b_dwk, mask=m_d)


def _blocks(D: int) -> tuple[int, int]:
    """(rows of a tile, its padded width)."""
    width = triton.next_power_of_2(D)
    return max(1, TILE // width), width


def _check(*tensors: torch.Tensor) -> None:
    assert all(t.ndim == 2 and t.stride(1) == 1 for t in tensors), [(t.shape, t.stride()) for t in tensors]


def forward(h, v, k, w_h, w_k, eps_h: float, eps_k: float, scale: float):
    """Rows h, v, k [N, D]. Returns (out [N, D] in v's dtype, rstd_h, rstd_k, α: each [N] fp32)."""
    _check(h, v, k)
    N, D = h.shape
    out = torch.empty(N, D, dtype=v.dtype, device=v.device)
    rstd_h, rstd_k, alpha = torch.empty(3, N, dtype=torch.float32, device=v.device)
    if N == 0:
        return out, rstd_h, rstd_k, alpha
    BT, BD = _blocks(D)
    _fwd_kernel[(triton.cdiv(N, BT),)](
        h, v, k, w_h, w_k, out, rstd_h, rstd_k, alpha, N, h.stride(0), v.stride(0), k.stride(0),
        eps_h, eps_k, scale, D=D, BT=BT, BD=BD, num_warps=WARPS,
    )  # fmt: skip
    return out, rstd_h, rstd_k, alpha


def backward(h, v, k, w_h, w_k, rstd_h, rstd_k, alpha, g, dv, dk, scale: float):
    """The gradients of `forward`'s output for its gradient g [N, D]: writes v's and k's into dv and dk
    ([N, D] rows: the halves of one [N, 2D] gradient), returns (h's [N, D] in h's dtype, dw_h, dw_k in
    the gains' dtypes)."""
    _check(h, v, k, g, dv, dk)
    N, D = h.shape
    dh = torch.empty(N, D, dtype=h.dtype, device=h.device)
    BT, BD = _blocks(D)
    programs = triton.cdiv(N, BT * LOOPS)
    parts = torch.empty(2, programs, D, dtype=torch.float32, device=h.device)
    if N:
        _bwd_kernel[(programs,)](
            h, v, k, w_h, w_k, rstd_h, rstd_k, alpha, g, dh, dv, dk, parts[0], parts[1],
            N, h.stride(0), v.stride(0), k.stride(0), g.stride(0), dv.stride(0), dk.stride(0), scale,
            D=D, BT=BT, BD=BD, LOOPS=LOOPS, num_warps=WARPS,
        )  # fmt: skip
    dw = parts.sum(1)
    return dh, dw[0].to(w_h.dtype), dw[1].to(w_k.dtype)
