"""Probe: the short conv's kernels with their loop unrolled by four positions, against the kernels the model
runs (model/short_conv_kernels.py), at the model's shape. Measures; changes nothing.

Why: the model's kernels walk one position per iteration, one load of BD channels in flight per warp at
a time; at [64, 512, 512] bf16 (a slice of the KDA layer's [.., 1672] projection) they move ~2.0 TB/s
forward and ~1.7 backward where the card copies at 4.2 (session 19's profile: 33 and 59 us a call, 25
calls of each a step). Unrolled, a program issues four positions' loads before it uses any of them.

    python benches/conv_unroll_probe.py [--batch 64 --seq-len 512 --channels 512 --packed 1672]

Prints each variant's error against float64 and its median time (CUDA-graph replays), beside the
bytes it must move at the card's copy rate.
"""

import argparse
import functools

import torch
import triton
import triton.language as tl

from dormouse.model import short_conv_kernels

COPY_TBPS = 4.2


@triton.jit
def _load(p, t, s, m_d, n):
    return tl.load(p + t.to(tl.int64) * s, mask=m_d & (t >= 0) & (t < n), other=0.0).to(tl.float32)


@triton.jit
def _silu_store(p, t, s, a, m):
    tl.store(p + t.to(tl.int64) * s, (a * tl.sigmoid(a)).to(p.dtype.element_ty), mask=m)


@triton.jit
def _fwd4(x, w, y, T, stride_x_b, stride_x_t, C: tl.constexpr, L: tl.constexpr, BD: tl.constexpr, NS: tl.constexpr):
    i_d, i_t, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    o_d = i_d * BD + tl.arange(0, BD)
    m_d = o_d < C
    w0 = tl.load(w + o_d * 4, mask=m_d, other=0.0)
    w1 = tl.load(w + o_d * 4 + 1, mask=m_d, other=0.0)
    w2 = tl.load(w + o_d * 4 + 2, mask=m_d, other=0.0)
    w3 = tl.load(w + o_d * 4 + 3, mask=m_d, other=0.0)
    p_x = x + i_b.to(tl.int64) * stride_x_b + o_d
    p_y = y + i_b.to(tl.int64) * T * C + o_d
    t0 = i_t * L
    x1 = _load(p_x, t0 - 3, stride_x_t, m_d, T)
    x2 = _load(p_x, t0 - 2, stride_x_t, m_d, T)
    x3 = _load(p_x, t0 - 1, stride_x_t, m_d, T)
    for t in tl.range(t0, t0 + L, 4, num_stages=NS):
        xa = _load(p_x, t, stride_x_t, m_d, T)
        xb = _load(p_x, t + 1, stride_x_t, m_d, T)
        xc = _load(p_x, t + 2, stride_x_t, m_d, T)
        xd = _load(p_x, t + 3, stride_x_t, m_d, T)
        _silu_store(p_y, t, C, w0 * x1 + w1 * x2 + w2 * x3 + w3 * xa, m_d & (t < T))
        _silu_store(p_y, t + 1, C, w0 * x2 + w1 * x3 + w2 * xa + w3 * xb, m_d & (t + 1 < T))
        _silu_store(p_y, t + 2, C, w0 * x3 + w1 * xa + w2 * xb + w3 * xc, m_d & (t + 2 < T))
        _silu_store(p_y, t + 3, C, w0 * xa + w1 * xb + w2 * xc + w3 * xd, m_d & (t + 3 < T))
        x1, x2, x3 = xb, xc, xd


@triton.jit
def _da(x1, x2, x3, xt, dyt, w0, w1, w2, w3):
    a = w0 * x1 + w1 * x2 + w2 * x3 + w3 * xt
    sig = tl.sigmoid(a)
    return dyt * sig * (1 + a * (1 - sig))


@triton.jit
def _store_dx(p, u, s, du, m_d, t0, L, T):
    tl.store(p + u.to(tl.int64) * s, du.to(p.dtype.element_ty), mask=m_d & (u >= t0) & (u < t0 + L) & (u < T))


@triton.jit
def _bwd4(
    x, w, dy, dx, dw, T, stride_x_b, stride_x_t, stride_dx_b, stride_dx_t, C: tl.constexpr, L: tl.constexpr,
    BD: tl.constexpr, NS: tl.constexpr,
):  # fmt: skip
    i_d, i_t, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    o_d = i_d * BD + tl.arange(0, BD)
    m_d = o_d < C
    w0 = tl.load(w + o_d * 4, mask=m_d, other=0.0)
    w1 = tl.load(w + o_d * 4 + 1, mask=m_d, other=0.0)
    w2 = tl.load(w + o_d * 4 + 2, mask=m_d, other=0.0)
    w3 = tl.load(w + o_d * 4 + 3, mask=m_d, other=0.0)
    p_x = x + i_b.to(tl.int64) * stride_x_b + o_d
    p_dy = dy + i_b.to(tl.int64) * T * C + o_d
    p_dx = dx + i_b.to(tl.int64) * stride_dx_b + o_d
    t0 = i_t * L
    x1 = _load(p_x, t0 - 3, stride_x_t, m_d, T)
    x2 = _load(p_x, t0 - 2, stride_x_t, m_d, T)
    x3 = _load(p_x, t0 - 1, stride_x_t, m_d, T)
    # d1, d2, d3: the pre-activation's gradient at t - 1, t - 2, t - 3; g0..g3: this program's part of dw
    d1 = tl.zeros((BD,), dtype=tl.float32)
    d2 = tl.zeros((BD,), dtype=tl.float32)
    d3 = tl.zeros((BD,), dtype=tl.float32)
    g0 = tl.zeros((BD,), dtype=tl.float32)
    g1 = tl.zeros((BD,), dtype=tl.float32)
    g2 = tl.zeros((BD,), dtype=tl.float32)
    g3 = tl.zeros((BD,), dtype=tl.float32)
    # dx[u] needs da[u .. u + 3]: positions t0 .. t0 + L + 3 (one past, masked), dx written at t - 3.
    for t in tl.range(t0, t0 + L + 4, 4, num_stages=NS):
        xa = _load(p_x, t, stride_x_t, m_d, T)
        xb = _load(p_x, t + 1, stride_x_t, m_d, T)
        xc = _load(p_x, t + 2, stride_x_t, m_d, T)
        xd = _load(p_x, t + 3, stride_x_t, m_d, T)
        ya = _load(p_dy, t, C, m_d, T)
        yb = _load(p_dy, t + 1, C, m_d, T)
        yc = _load(p_dy, t + 2, C, m_d, T)
        yd = _load(p_dy, t + 3, C, m_d, T)
        da = _da(x1, x2, x3, xa, ya, w0, w1, w2, w3)
        db = _da(x2, x3, xa, xb, yb, w0, w1, w2, w3)
        dc = _da(x3, xa, xb, xc, yc, w0, w1, w2, w3)
        dd = _da(xa, xb, xc, xd, yd, w0, w1, w2, w3)
        _store_dx(p_dx, t - 3, stride_dx_t, w0 * da + w1 * d1 + w2 * d2 + w3 * d3, m_d, t0, L, T)
        _store_dx(p_dx, t - 2, stride_dx_t, w0 * db + w1 * da + w2 * d1 + w3 * d2, m_d, t0, L, T)
        _store_dx(p_dx, t - 1, stride_dx_t, w0 * dc + w1 * db + w2 * da + w3 * d1, m_d, t0, L, T)
        _store_dx(p_dx, t, stride_dx_t, w0 * dd + w1 * dc + w2 * db + w3 * da, m_d, t0, L, T)
        # dw from this block's positions only (da of positions >= t0 + L are its neighbour's)
        oa = tl.where(t < t0 + L, da, 0.0)
        ob = tl.where(t + 1 < t0 + L, db, 0.0)
        oc = tl.where(t + 2 < t0 + L, dc, 0.0)
        od = tl.where(t + 3 < t0 + L, dd, 0.0)
        g0 += oa * x1 + ob * x2 + oc * x3 + od * xa
        g1 += oa * x2 + ob * x3 + oc * xa + od * xb
        g2 += oa * x3 + ob * xa + oc * xb + od * xc
        g3 += oa * xa + ob * xb + oc * xc + od * xd
        x1, x2, x3 = xb, xc, xd
        d3, d2, d1 = db, dc, dd
    p_dw = dw + (i_b * tl.num_programs(1) + i_t).to(tl.int64) * C * 4 + o_d * 4
    tl.store(p_dw, g0, mask=m_d)
    tl.store(p_dw + 1, g1, mask=m_d)
    tl.store(p_dw + 2, g2, mask=m_d)
    tl.store(p_dw + 3, g3, mask=m_d)


def forward4(x, weight, blocks):
    B, T, C = x.shape
    L, BD, num_warps, ns = blocks
    y = torch.empty(B, T, C, dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(C, BD), triton.cdiv(T, L), B)
    _fwd4[grid](x, weight, y, T, x.stride(0), x.stride(1), C=C, L=L, BD=BD, NS=ns, num_warps=num_warps)
    return y


def backward4(x, weight, dy, dx, blocks):
    B, T, C = x.shape
    L, BD, num_warps, ns = blocks
    grid = (triton.cdiv(C, BD), triton.cdiv(T, L), B)
    parts = torch.empty(B * grid[1], C, 4, dtype=torch.float32, device=x.device)
    _bwd4[grid](
        x, weight, dy, dx, parts, T, x.stride(0), x.stride(1), dx.stride(0), dx.stride(1), C=C, L=L, BD=BD, NS=ns,
        num_warps=num_warps,
    )  # fmt: skip
    return parts.sum(0)


def reference(x, w, dy):
    """float64 y = SiLU(conv(x)), dx, dw by autograd."""
    xd, wd = x.double().requires_grad_(), w.double().requires_grad_()
    xp = torch.nn.functional.pad(xd.transpose(1, 2), (w.shape[1] - 1, 0))
    y = torch.nn.functional.silu(torch.nn.functional.conv1d(xp, wd[:, None], groups=w.shape[0])).transpose(1, 2)
    y.backward(dy.double())
    return y.detach(), xd.grad, wd.grad


def rel(x, ref) -> float:
    return ((x.double() - ref.double()).abs().max() / ref.double().abs().max()).item()


def median_us(fn) -> float:
    return triton.testing.do_bench_cudagraph(fn, rep=50, return_mode="median") * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--channels", type=int, default=512)
    ap.add_argument("--packed", type=int, default=1672, help="width of the tensor the input is a slice of")
    args = ap.parse_args()
    B, T, C = args.batch, args.seq_len, args.channels
    n = B * T * C * 2
    floor = {"fwd": 2 * n / COPY_TBPS / 1e6, "bwd": 3 * n / COPY_TBPS / 1e6}
    print(f"[B {B}, T {T}, C {C}] bf16 slice of [.., {args.packed}]; floors at {COPY_TBPS} TB/s: {floor} us")
    gen = torch.Generator().manual_seed(0)
    packed = torch.randn(B, T, args.packed, generator=gen).to(torch.bfloat16).cuda()
    x = packed[..., C : 2 * C]
    w = (0.5 * torch.randn(C, 4, generator=gen)).cuda()
    dy = torch.randn(B, T, C, generator=gen).to(torch.bfloat16).cuda()
    y_ref, dx_ref, dw_ref = reference(x, w, dy)
    dx = torch.empty_like(dy)
    model_f = median_us(functools.partial(short_conv_kernels.forward, x, w))
    model_b = median_us(functools.partial(short_conv_kernels.backward, x, w, dy, dx))
    model_blocks = f"{short_conv_kernels.FWD_BLOCKS} / {short_conv_kernels.BWD_BLOCKS}"
    print(f"model's kernels {model_blocks}: fwd {model_f:6.1f} us, bwd {model_b:6.1f} us")
    for blocks in (
        (32, 128, 1, 2), (32, 128, 1, 3), (64, 128, 1, 2), (32, 64, 1, 2), (64, 64, 1, 2), (16, 128, 1, 2),
        (32, 128, 2, 2), (64, 256, 2, 2), (32, 256, 2, 2), (128, 128, 1, 2), (64, 64, 1, 3), (32, 64, 1, 3),
    ):  # fmt: skip
        y = forward4(x, w, blocks)
        dx4 = torch.empty_like(dy)
        dw4 = backward4(x, w, dy, dx4, blocks)
        errs = f"y {rel(y, y_ref):.1e} dx {rel(dx4, dx_ref):.1e} dw {rel(dw4, dw_ref):.1e}"
        f = median_us(functools.partial(forward4, x, w, blocks))
        b = median_us(functools.partial(backward4, x, w, dy, dx4, blocks))
        print(
            f"unrolled L, BD, warps, stages {blocks}: fwd {f:6.1f} us ({floor['fwd'] / f * COPY_TBPS:.2f} TB/s), "
            f"bwd {b:6.1f} us ({floor['bwd'] / b * COPY_TBPS:.2f} TB/s); {errs}"
        )


if __name__ == "__main__":
    main()
