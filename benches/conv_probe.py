"""Probe the short conv's kernels on a GPU at one shape: fla's causal_conv1d (as the model called it
before session 16) against dormouse's own (model/short_conv_kernels.py, a sweep of block sizes). Prints
each path's error against float64 and its median time, beside the time the bytes it must move take at
the card's copy rate. Measures; changes nothing.

    python benches/conv_probe.py [--batch 64 --seq-len 512 --channels 512 --packed 1672]

The input is a slice of a wider tensor, as q, k and v are slices of the KDA layer's packed projection.
"""

import argparse
import functools
import importlib

import torch
import triton
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--channels", type=int, default=512)
    ap.add_argument(
        "--packed", default="1672,1680,0", help="widths of the tensor the input is a slice of (0: a contiguous input)"
    )
    ap.add_argument("--width", type=int, default=4, help="taps (at most 4: the kernels' window)")
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
        y = short_conv_kernels.forward(x, w)[0][0]
        dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        dw = short_conv_kernels.backward(x, w, (dy,), dx)
        print(f"dormouse errors vs float64: y {rel(y, y_ref):.1e}, dx {rel(dx, dx_ref):.1e}, dw {rel(dw, dw_ref):.1e}")
        chosen = (short_conv_kernels.FWD_BLOCKS, short_conv_kernels.BWD_BLOCKS)
        for blocks in (
            (32, 128, 1, 2), (32, 128, 1, 3), (64, 128, 1, 2), (32, 64, 1, 2), (64, 64, 1, 2), (16, 128, 1, 2),
            (32, 128, 2, 2), (64, 256, 2, 2), (32, 256, 2, 2), (128, 128, 1, 2), (64, 64, 1, 3), (32, 64, 1, 3),
        ):  # fmt: skip
            f = median_ms(functools.partial(short_conv_kernels.forward, x, w, blocks=blocks))
            b = median_ms(functools.partial(short_conv_kernels.backward, x, w, (dy,), dx, blocks=blocks))
            mark = " ".join(name for name, c in zip(("fwd", "bwd"), chosen, strict=True) if c == blocks)
            print(
                f"dormouse L, BD, warps, stages {blocks}: fwd {f * 1e3:6.1f} us ({floor['fwd'] / f / 1e9:.2f} TB/s), "
                f"bwd {b * 1e3:6.1f} us ({floor['bwd'] / b / 1e9:.2f} TB/s){'  <- chosen ' + mark if mark else ''}"
            )


if __name__ == "__main__":
    main()
