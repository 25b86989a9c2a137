"""Probe the short conv's kernels on a GPU at one shape: fla's causal_conv1d (as the model calls it, and
each of its autotune configurations) against dormouse's own (model/short_conv_kernels.py, a sweep of
block sizes). Prints each path's error against float64 and its median time, beside the time the bytes
it must move take at the card's copy rate. Measures; changes nothing.

    python benches/conv_probe.py [--batch 64 --seq-len 512 --channels 512 --packed 1672]

The input is a slice of a wider tensor, as q, k and v are slices of the KDA layer's packed projection.
"""

import argparse
import functools
import importlib

import torch
import triton
import triton.language as tl
import triton.testing

from dormouse.model import fla_kernels, short_conv_kernels

COPY_TBPS = 4.2  # H200 copy rate measured in this workplace (shared/gpu): bytes moved / this = the floor


def median_ms(fn) -> float:
    """Median ms of `fn` replayed in a CUDA graph: no launch overhead, as in the model's graphed step."""
    return triton.testing.do_bench_cudagraph(fn, rep=50, return_mode="median")


def rel(x, ref) -> float:
    return ((x.double() - ref).abs().max() / ref.abs().max()).item()


def reference(x, w, dy):
    """float64 y = SiLU(conv(x)), dx, dw by autograd."""
    xd, wd = x.double().requires_grad_(), w.double().requires_grad_()
    a = torch.nn.functional.conv1d(
        torch.nn.functional.pad(xd.transpose(1, 2), (w.shape[1] - 1, 0)), wd[:, None], groups=w.shape[0]
    )
    y = torch.nn.functional.silu(a).transpose(1, 2)
    y.backward(dy.double())
    return y.detach(), xd.grad, wd.grad


@triton.jit
def stream_fwd_kernel(x, w, y, T, stride_x_b, stride_x_t, C: tl.constexpr, L: tl.constexpr, BD: tl.constexpr):
    """A prototype, width 4 only: each program walks L rows of BD channels, the last 3 inputs in registers."""
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
    x1 = tl.load(p_x + (t0 - 3) * stride_x_t, mask=m_d & (t0 >= 3), other=0.0).to(tl.float32)
    x2 = tl.load(p_x + (t0 - 2) * stride_x_t, mask=m_d & (t0 >= 2), other=0.0).to(tl.float32)
    x3 = tl.load(p_x + (t0 - 1) * stride_x_t, mask=m_d & (t0 >= 1), other=0.0).to(tl.float32)
    for t in tl.range(t0, t0 + L, num_stages=3):
        xt = tl.load(p_x + t * stride_x_t, mask=m_d & (t < T), other=0.0).to(tl.float32)
        a = w0 * x1 + w1 * x2 + w2 * x3 + w3 * xt
        tl.store(p_y + t * C, (a * tl.sigmoid(a)).to(y.dtype.element_ty), mask=m_d & (t < T))
        x1, x2, x3 = x2, x3, xt


@triton.jit
def stream_bwd_kernel(
    x, w, dy, dx, dw, T, stride_x_b, stride_x_t, stride_dx_b, stride_dx_t, C: tl.constexpr, L: tl.constexpr,
    BD: tl.constexpr,
):  # fmt: skip
    """A prototype, width 4 only: walks rows t0 .. t0 + L + 2, writing dx[t - 3] once da[t] is known."""
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
    x1 = tl.load(p_x + (t0 - 3) * stride_x_t, mask=m_d & (t0 >= 3), other=0.0).to(tl.float32)
    x2 = tl.load(p_x + (t0 - 2) * stride_x_t, mask=m_d & (t0 >= 2), other=0.0).to(tl.float32)
    x3 = tl.load(p_x + (t0 - 1) * stride_x_t, mask=m_d & (t0 >= 1), other=0.0).to(tl.float32)
    d1 = tl.zeros((BD,), dtype=tl.float32)
    d2 = tl.zeros((BD,), dtype=tl.float32)
    d3 = tl.zeros((BD,), dtype=tl.float32)
    g0 = tl.zeros((BD,), dtype=tl.float32)
    g1 = tl.zeros((BD,), dtype=tl.float32)
    g2 = tl.zeros((BD,), dtype=tl.float32)
    g3 = tl.zeros((BD,), dtype=tl.float32)
    for t in tl.range(t0, t0 + L + 3, num_stages=3):
        m = m_d & (t < T)
        xt = tl.load(p_x + t * stride_x_t, mask=m, other=0.0).to(tl.float32)
        a = w0 * x1 + w1 * x2 + w2 * x3 + w3 * xt
        sig = tl.sigmoid(a)
        da = tl.load(p_dy + t * C, mask=m, other=0.0).to(tl.float32) * sig * (1 + a * (1 - sig))
        u = t - 3
        tl.store(
            p_dx + u * stride_dx_t,
            (w0 * da + w1 * d1 + w2 * d2 + w3 * d3).to(dx.dtype.element_ty),
            mask=m_d & (u >= t0) & (u < T),
        )
        own = tl.where(t < t0 + L, da, 0.0)
        g0 += own * x1
        g1 += own * x2
        g2 += own * x3
        g3 += own * xt
        x1, x2, x3 = x2, x3, xt
        d3, d2, d1 = d2, d1, da
    p_dw = dw + (i_b * tl.num_programs(1) + i_t).to(tl.int64) * C * 4 + o_d * 4
    tl.store(p_dw, g0, mask=m_d)
    tl.store(p_dw + 1, g1, mask=m_d)
    tl.store(p_dw + 2, g2, mask=m_d)
    tl.store(p_dw + 3, g3, mask=m_d)


def stream_forward(x, w, blocks):
    B, T, C = x.shape
    L, BD, num_warps = blocks
    y = torch.empty(B, T, C, dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(C, BD), triton.cdiv(T, L), B)
    stream_fwd_kernel[grid](x, w, y, T, x.stride(0), x.stride(1), C=C, L=L, BD=BD, num_warps=num_warps)
    return y


def stream_backward(x, w, dy, dx, blocks):
    B, T, C = x.shape
    L, BD, num_warps = blocks
    grid = (triton.cdiv(C, BD), triton.cdiv(T, L), B)
    parts = torch.empty(B * grid[1], C, 4, dtype=torch.float32, device=x.device)
    stream_bwd_kernel[grid](
        x, w, dy, dx, parts, T, x.stride(0), x.stride(1), dx.stride(0), dx.stride(1), C=C, L=L, BD=BD,
        num_warps=num_warps,
    )  # fmt: skip
    return parts.sum(0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--channels", type=int, default=512)
    ap.add_argument(
        "--packed", default="1672,1680,0", help="widths of the tensor the input is a slice of (0: a contiguous input)"
    )
    ap.add_argument("--width", type=int, default=4)
    args = ap.parse_args()
    B, T, C, W = args.batch, args.seq_len, args.channels, args.width
    n = B * T * C * 2  # bytes of one [B, T, C] bf16 tensor
    floor = {"fwd": 2 * n, "bwd": 3 * n}
    print(
        f"[B {B}, T {T}, C {C}] bf16, width {W}; floors at {COPY_TBPS} TB/s: fwd {2 * n / COPY_TBPS / 1e6:.1f} us "
        f"(x in, y out), bwd {3 * n / COPY_TBPS / 1e6:.1f} us (x, dy in, dx out); times: medians of CUDA-graph replays"
    )
    conv, _ = fla_kernels.causal_conv1d()
    ops = importlib.import_module("fla.modules.causal_conv1d.ops")
    for width in (int(v) for v in args.packed.split(",")):
        gen = torch.Generator().manual_seed(0)
        packed = torch.randn(B, T, max(width, 2 * C), generator=gen).to(torch.bfloat16).cuda()
        x = packed[..., C : 2 * C] if width else packed[..., C : 2 * C].contiguous()
        w = (0.5 * torch.randn(C, W, generator=gen)).cuda()
        dy = torch.randn(B, T, C, generator=gen).to(torch.bfloat16).cuda()
        y_ref, dx_ref, dw_ref = reference(x, w, dy)
        print(f"-- input: a slice of [.., {width}] (row stride {x.stride(1)})" if width else "-- input: contiguous")
        # fla as the model calls it: weight cast to the input's dtype, SiLU in the kernel.
        wb = w.to(torch.bfloat16)
        xg = x.detach().clone().requires_grad_()
        y_fla, _ = conv(xg, wb, activation="silu")
        y_fla.backward(dy)
        f = median_ms(functools.partial(conv, x, wb, activation="silu"))
        b = median_ms(functools.partial(ops.causal_conv1d_bwd, x=x, dy=dy, dht=None, weight=wb, activation="silu"))
        print(
            f"fla pinned: fwd {f * 1e3:6.1f} us, bwd {b * 1e3:6.1f} us (a fwd again, then its bwd kernel); "
            f"errors vs float64 y {rel(y_fla, y_ref):.1e}, dx {rel(xg.grad, dx_ref):.1e} (weight rounded to bf16)"
        )
        y = short_conv_kernels.forward(x, w)
        dx = torch.empty(B, T, C, dtype=x.dtype, device=x.device)
        dw = short_conv_kernels.backward(x, w, dy, dx)
        print(f"dormouse errors vs float64: y {rel(y, y_ref):.1e}, dx {rel(dx, dx_ref):.1e}, dw {rel(dw, dw_ref):.1e}")
        for blocks in ((32, 128, 4), (32, 64, 4), (64, 64, 4), (64, 32, 4), (32, 32, 4), (16, 128, 4), (64, 64, 8)):
            f = median_ms(functools.partial(short_conv_kernels.forward, x, w, blocks))
            b = median_ms(functools.partial(short_conv_kernels.backward, x, w, dy, dx, blocks))
            print(
                f"dormouse BT, BD, warps {blocks}: fwd {f * 1e3:6.1f} us ({floor['fwd'] / f / 1e9:.2f} TB/s), "
                f"bwd {b * 1e3:6.1f} us ({floor['bwd'] / b / 1e9:.2f} TB/s)"
            )
        if W != 4:
            continue
        y = stream_forward(x, w, (64, 128, 1))
        dw = stream_backward(x, w, dy, dx, (64, 128, 1))
        print(f"streaming errors vs float64: y {rel(y, y_ref):.1e}, dx {rel(dx, dx_ref):.1e}, dw {rel(dw, dw_ref):.1e}")
        for blocks in (
            (64, 128, 1),
            (64, 128, 2),
            (64, 256, 2),
            (32, 128, 1),
            (128, 128, 1),
            (64, 64, 1),
            (16, 128, 1),
        ):
            f = median_ms(functools.partial(stream_forward, x, w, blocks))
            b = median_ms(functools.partial(stream_backward, x, w, dy, dx, blocks))
            print(
                f"streaming L, BD, warps {blocks}: fwd {f * 1e3:6.1f} us ({floor['fwd'] / f / 1e9:.2f} TB/s), "
                f"bwd {b * 1e3:6.1f} us ({floor['bwd'] / b / 1e9:.2f} TB/s)"
            )


if __name__ == "__main__":
    main()
