"""Several bias-free Linears that read one input, run as one matmul; the block's Linears under CUDA bf16 autocast.

A KDA layer projects its normalised input six ways (q, k, v, the two gates' low-rank halves, beta) and a
SwiGLU two ways. As separate Linears under bf16 autocast, each matmul casts the fp32 input again and
each gradient comes back through a cast of its own, to be summed in fp32: on the H200 these casts and
sums were a large part of the step's elementwise kernels (docs/performance.md). Concatenating the
weights (kept as separate parameters, so init, optimizers and checkpoints do not change) gives one cast
of the input, one matmul forward and one per gradient, and the input's gradient summed inside the
matmul in fp32. The outputs are views of one tensor, each with the row stride of the whole.

Without autograd (evals, decoding) there is no gradient to fuse and the concatenation would copy every
weight on every call: a decode step of `small` on the CPU spent 21 of its 35 ms copying weights. There
each Linear runs alone.

Under bf16 autocast on CUDA a matmul of fp32 weights runs as `_Bf16Linear`: the weights concatenated
straight into one bf16 tensor (one kernel, where autocast took a cat and a cast), and their gradient
written in fp32 by the matmul itself (`torch.mm(..., out_dtype=torch.float32)`), where autocast rounded
it to bf16 and cast it back: 40 fewer cast kernels a `small` step on an H200 (torch profiler; the wall
time within the card's spread), and the weights' gradient is not rounded to bf16.
The output and the input's gradient are autocast's bit for bit (tests/gpu/test_projections_cuda.py).
A Linear with a bias (`affine_of`) runs the same way, its bias added in the matmul and its gradient
summed by one.

The looped block applies each layer `depth` times a step. Inside `shared_casts()` (around the model's
loop) the applications of one weight group share its bf16 concatenation, made by the first: as separate
applications each cast the weights again (24 cast kernels a `small` step at depth 2). The arithmetic is
unchanged, bit for bit. Their fp32 weight gradients are still summed by autograd: adding the second into
the first inside the matmul (`addmm`, beta 1) makes cuBLAS choose split-K kernels with a reduction
kernel of their own on an H200, as many launches as the adds it would save (torch profiler).
"""

from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

_casts: dict[tuple[int, ...], torch.Tensor] | None = None  # inside `shared_casts()`: weight group -> bf16 cat


@contextmanager
def shared_casts():
    """Within: the bf16 applications (`_Bf16Linear`) of one weight group share its concatenation into
    bf16, made by the first (module docstring). Not under torch.compile, which traces the Function (a
    Python-side cache would not survive it): there each application casts its own."""
    global _casts
    outer = _casts
    _casts = None if torch.compiler.is_compiling() else {}
    try:
        yield
    finally:
        _casts = outer


def _bf16_weights(weights: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """cat(weights) in bf16 (the cast inside the copy); inside `shared_casts()` once per group."""
    key = tuple(map(id, weights))
    w = None if _casts is None else _casts.get(key)
    if w is None:
        rows = sum(t.shape[0] for t in weights)
        w = torch.empty(rows, weights[0].shape[1], dtype=torch.bfloat16, device=weights[0].device)
        torch.cat(weights, out=w)  # the cast inside the copy
        if _casts is not None:
            _casts[key] = w
    return w


def packed(x: torch.Tensor, linears: tuple[nn.Linear, ...]) -> torch.Tensor:
    """x @ cat(weights).T: every (bias-free) Linear's output side by side in one tensor, in the order given."""
    weights = [lin.weight for lin in linears]
    if bf16_matmul(x):
        return _Bf16Linear.apply(x, None, *weights)
    return F.linear(x, weights[0] if len(weights) == 1 else torch.cat(weights))


def linear_of(x: torch.Tensor, lin: nn.Linear) -> torch.Tensor:
    """lin(x) for a bias-free Linear, through `packed` (its CUDA bf16 path: the fp32 weight gradient)."""
    return packed(x, (lin,))


def affine_of(x: torch.Tensor, lin: nn.Linear) -> torch.Tensor:
    """lin(x) for a Linear with a bias. On CUDA under bf16 autocast the bias is added inside the matmul
    (cuBLAS's epilogue; autocast's Linear of a strided input adds it in a kernel of its own, after
    rounding the product to bf16) and its gradient is the column sum of the output's gradient taken by a
    matmul, in fp32 (torch's sum over the rows of a [B·T, n] gradient ran at ~0.7 TB/s on the H200)."""
    if bf16_matmul(x):
        return _Bf16Linear.apply(x, lin.bias, lin.weight)
    return F.linear(x, lin.weight, lin.bias)


def bf16_matmul(x: torch.Tensor) -> bool:
    """Whether `packed` runs `_Bf16Linear` for `x`: on CUDA under bf16 autocast."""
    return x.is_cuda and torch.is_autocast_enabled("cuda") and torch.get_autocast_dtype("cuda") == torch.bfloat16


def _mm_fp32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b of bf16 operands with an fp32 product (cuBLAS; torch has no CPU kernel for it)."""
    return torch.mm(a, b, out_dtype=torch.float32)


class _Bf16Linear(torch.autograd.Function):
    """x @ cat(weights).T (+ bias) in bf16 (CUDA, under bf16 autocast), the weights' and the bias's
    gradients in fp32 from matmuls."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, bias: torch.Tensor | None, *weights: torch.Tensor) -> torch.Tensor:
        w = _bf16_weights(weights)
        x = x.to(torch.bfloat16)
        ctx.save_for_backward(x, w)
        ctx.rows, ctx.has_bias = [t.shape[0] for t in weights], bias is not None
        if bias is None:
            return F.linear(x, w)
        # reshape: a view for the projections' column slices too (their rows keep one stride)
        y = torch.addmm(bias.to(torch.bfloat16), x.reshape(-1, x.shape[-1]), w.t())
        return y.view(*x.shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x, w = ctx.saved_tensors
        dy = dy.to(torch.bfloat16)
        dx = dy @ w if ctx.needs_input_grad[0] else None
        dy = dy.reshape(-1, dy.shape[-1])
        dw = _mm_fp32(dy.t(), x.reshape(-1, x.shape[-1]))
        db = _mm_fp32(dy.new_ones(1, dy.shape[0]), dy).view(-1) if ctx.has_bias else None
        return dx, db, *dw.split(ctx.rows)


def project(x: torch.Tensor, linears: tuple[nn.Linear, ...]) -> tuple[torch.Tensor, ...]:
    """(lin(x) for lin in linears): `packed` split by output width when autograd records."""
    if not torch.is_grad_enabled():
        return tuple(F.linear(x, lin.weight) for lin in linears)
    return packed(x, linears).split([lin.out_features for lin in linears], dim=-1)
