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
import triton.testing
from triton.runtime.jit import JITFunction

from dormouse.model import fla_kernels, short_conv_kernels

COPY_TBPS = 4.2  # H200 copy rate measured in this workplace (shared/gpu): bytes moved / this = the floor


def median_ms(fn) -> float:
    return triton.testing.do_bench(fn, warmup=20, rep=100, return_mode="median")


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


def jit_of(kernel):
    """The JITFunction under fla's heuristics and autotuner wrappers."""
    while not isinstance(kernel, JITFunction):
        kernel = kernel.fn
    return kernel


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--channels", type=int, default=512)
    ap.add_argument("--packed", type=int, default=1672, help="width of the tensor the input is a slice of")
    ap.add_argument("--width", type=int, default=4)
    args = ap.parse_args()
    B, T, C, W = args.batch, args.seq_len, args.channels, args.width
    gen = torch.Generator().manual_seed(0)
    packed = torch.randn(B, T, args.packed, generator=gen).to(torch.bfloat16).cuda()
    x = packed[..., C : 2 * C]
    w = (0.5 * torch.randn(C, W, generator=gen)).cuda()
    dy = torch.randn(B, T, C, generator=gen).to(torch.bfloat16).cuda()
    y_ref, dx_ref, dw_ref = reference(x, w, dy)
    n = B * T * C * 2  # bytes of one [B, T, C] bf16 tensor
    floor = {"fwd": 2 * n, "bwd": 3 * n}
    print(f"shape [B {B}, T {T}, C {C}] bf16, width {W}, input a slice of [.., {args.packed}]")
    print(
        f"floors at {COPY_TBPS} TB/s: fwd {2 * n / COPY_TBPS / 1e9 * 1e3:.1f} us (x in, y out), "
        f"bwd {3 * n / COPY_TBPS / 1e9 * 1e3:.1f} us (x, dy in, dx out)"
    )

    # fla as the model called it: weight cast to the input's dtype, autograd Function, SiLU in the kernel.
    conv, _ = fla_kernels.causal_conv1d()
    ops = importlib.import_module("fla.modules.causal_conv1d.ops")
    wb = w.to(torch.bfloat16)
    xg = x.detach().clone().requires_grad_()  # contiguous copy only for the error check below
    y_fla, _ = conv(xg, wb, activation="silu")
    y_fla.backward(dy)
    print(f"fla errors vs float64: y {rel(y_fla, y_ref):.2e}, dx {rel(xg.grad, dx_ref):.2e} (weight rounded to bf16)")
    fwd_ms = median_ms(lambda: conv(x, wb, activation="silu"))
    bwd_ms = median_ms(lambda: ops.causal_conv1d_bwd(x=x, dy=dy, dht=None, weight=wb, activation="silu"))
    print(f"fla pinned: fwd {fwd_ms * 1e3:.1f} us, bwd {bwd_ms * 1e3:.1f} us (its bwd runs the fwd again)")

    fwd_jit, bwd_jit = jit_of(ops.causal_conv1d_fwd_kernel), jit_of(ops.causal_conv1d_bwd_kernel)
    NT = triton.cdiv(T, 64)
    y_pre, _ = ops.causal_conv1d_fwd(x=x, weight=wb, bias=None, residual=None, activation=None)
    y = torch.empty(B, T, C, dtype=x.dtype, device=x.device)
    dx = torch.empty(B, T, C, dtype=x.dtype, device=x.device)
    dw = torch.empty(B * NT, C, W, dtype=torch.float32, device=x.device)
    for bd in (16, 32, 64, 128):
        for nw in (4, 8, 16, 32):
            common = dict(
                x=x, weight=wb, initial_state=None, cu_seqlens=None, chunk_indices=None, B=B, T=T,
                stride_x_n=x.stride(0), stride_x_t=x.stride(1), stride_x_d=1, D=C, W=W, BT=64,
                BW=triton.next_power_of_2(W), ACTIVATION="silu", HAS_WEIGHT=True, HAS_BIAS=False,
                USE_INITIAL_STATE=False, IS_VARLEN=False, BD=bd, num_warps=nw,
            )  # fmt: skip
            grid = (triton.cdiv(C, bd), NT, B)
            fwd = functools.partial(fwd_jit[grid], y=y, bias=None, residual=None, HAS_RESIDUAL=False, **common)
            bwd = functools.partial(
                bwd_jit[grid], y=y_pre, dht=None, dy=dy, dx=dx, dw=dw, db=None, stride_dx_n=dx.stride(0),
                stride_dx_t=dx.stride(1), stride_dx_d=1, stride_dy_n=dy.stride(0), stride_dy_t=dy.stride(1),
                stride_dy_d=1, USE_FINAL_STATE=False, **common,
            )  # fmt: skip
            f, b = median_ms(fwd), median_ms(bwd)
            print(f"fla kernels BD {bd:3d} warps {nw:2d}: fwd {f * 1e3:6.1f} us, bwd kernel alone {b * 1e3:6.1f} us")

    # dormouse's kernels: errors at the chosen blocks, then the sweep.
    y = short_conv_kernels.forward(x, w)
    dw = short_conv_kernels.backward(x, w, dy, dx)
    print(f"dormouse errors vs float64: y {rel(y, y_ref):.2e}, dx {rel(dx, dx_ref):.2e}, dw {rel(dw, dw_ref):.2e}")
    print(f"dormouse chosen: fwd {short_conv_kernels.FWD_BLOCKS}, bwd {short_conv_kernels.BWD_BLOCKS}")
    for bt in (32, 64, 128):
        for bd in (32, 64, 128):
            for nw in (4, 8):
                blocks = (bt, bd, nw)
                f = median_ms(functools.partial(short_conv_kernels.forward, x, w, blocks))
                b = median_ms(functools.partial(short_conv_kernels.backward, x, w, dy, dx, blocks))
                print(
                    f"dormouse BT {bt:3d} BD {bd:3d} warps {nw}: fwd {f * 1e3:6.1f} us "
                    f"({floor['fwd'] / f / 1e9:.2f} TB/s), bwd {b * 1e3:6.1f} us ({floor['bwd'] / b / 1e9:.2f} TB/s)"
                )


if __name__ == "__main__":
    main()
