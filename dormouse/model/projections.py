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
it to bf16 and cast it back: 40 fewer cast kernels a `small` step on the H200 (session 18, call 4's
profile; its wall time within the machine's spread), and the weights' gradient no longer rounded to bf16.
The output and the input's gradient are autocast's bit for bit (tests/gpu/test_projections_cuda.py).
A Linear with a bias (`affine_of`) runs the same way, its bias added in the matmul and its gradient
summed by one.

The looped block applies each layer `depth` times a step. Inside `shared_casts()` (the model's loop
under autograd) the applications of one weight group share its bf16 concatenation (made by the first)
and its fp32 gradient: each backward but the last adds its product into the one before it inside the
matmul (`addmm`), and the last returns the sum. As separate applications each cast the weights again
and autograd summed their fp32 gradients in an add kernel of its own: at depth 2, 24 casts and 44
adds a `small` step. An application whose backward never runs would lose the others' gradient: the
end of the backward pass checks that every group's last backward ran, and raises otherwise.
"""

from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn


class _SharedCast:
    """One weight group's applications inside `shared_casts()`: its bf16 concatenation, how many
    applications ran forward (`uses`) and backward (`seen`), and the gradients summed so far."""

    def __init__(self):
        self.w: torch.Tensor | None = None
        self.uses = self.seen = 0
        self.dw: torch.Tensor | None = None
        self.db: torch.Tensor | None = None


_shares: dict[tuple[int, ...], _SharedCast] | None = None  # inside `shared_casts()`: weight group -> share


@contextmanager
def shared_casts():
    """Within: the bf16 applications (`_Bf16Linear`) of one weight group that record gradients share its
    cast and sum their weight gradients in the matmul (module docstring). Not under torch.compile, which
    traces the Function (a Python-side share would not survive it): each application then stands alone."""
    global _shares
    outer = _shares
    _shares = None if torch.compiler.is_compiling() else {}
    try:
        yield
    finally:
        _shares = outer


def _share_of(bias: torch.Tensor | None, weights: list[torch.Tensor]) -> _SharedCast | None:
    if _shares is None or not torch.is_grad_enabled():
        return None
    return _shares.setdefault((id(bias), *map(id, weights)), _SharedCast())


def packed(x: torch.Tensor, linears: tuple[nn.Linear, ...]) -> torch.Tensor:
    """x @ cat(weights).T: every (bias-free) Linear's output side by side in one tensor, in the order given."""
    weights = [lin.weight for lin in linears]
    if bf16_matmul(x):
        return _Bf16Linear.apply(x, None, _share_of(None, weights), *weights)
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
        return _Bf16Linear.apply(x, lin.bias, _share_of(lin.bias, [lin.weight]), lin.weight)
    return F.linear(x, lin.weight, lin.bias)


def bf16_matmul(x: torch.Tensor) -> bool:
    """Whether `packed` runs `_Bf16Linear` for `x`: on CUDA under bf16 autocast."""
    return x.is_cuda and torch.is_autocast_enabled("cuda") and torch.get_autocast_dtype("cuda") == torch.bfloat16


def _mm_fp32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b of bf16 operands with an fp32 product (cuBLAS; torch has no CPU kernel for it)."""
    return torch.mm(a, b, out_dtype=torch.float32)


def _addmm_fp32(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """c + a @ b of an fp32 `c` and bf16 operands, in fp32, c added in the matmul (cuBLAS's beta)."""
    return torch.addmm(c, a, b, out_dtype=torch.float32)


def _weight_grad(acc: torch.Tensor | None, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b in fp32, plus the gradient `acc` summed so far (None: the first)."""
    return _mm_fp32(a, b) if acc is None else _addmm_fp32(acc, a, b)


def _check_shared(share: _SharedCast) -> None:
    """At the end of a backward pass: every application of `share`'s group ran its backward (else the
    sum of their weight gradients was never returned)."""
    seen, uses = share.seen, share.uses
    share.seen, share.dw, share.db = 0, None, None  # ready for another backward of the same graph
    if seen:
        raise RuntimeError(
            f"a weight group applied {uses} times in one forward (model/projections.py, shared_casts) had "
            f"{seen} backward(s) when its pass ended: its weights' gradient would be lost"
        )


class _Bf16Linear(torch.autograd.Function):
    """x @ cat(weights).T (+ bias) in bf16 (CUDA, under bf16 autocast), the weights' and the bias's
    gradients in fp32 from matmuls."""

    @staticmethod
    def forward(
        ctx, x: torch.Tensor, bias: torch.Tensor | None, share: _SharedCast | None, *weights: torch.Tensor
    ) -> torch.Tensor:
        rows = [w.shape[0] for w in weights]
        w = None if share is None else share.w
        if w is None:
            w = torch.empty(sum(rows), weights[0].shape[1], dtype=torch.bfloat16, device=x.device)
            torch.cat(weights, out=w)  # the cast inside the copy
        if share is not None:
            share.w, share.uses = w, share.uses + 1
        x = x.to(torch.bfloat16)
        ctx.save_for_backward(x, w)
        ctx.rows, ctx.has_bias, ctx.share = rows, bias is not None, share
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
        share = ctx.share or _SharedCast()
        dw = _weight_grad(share.dw, dy.t(), x.reshape(-1, x.shape[-1]))
        db = _weight_grad(share.db, dy.new_ones(1, dy.shape[0]), dy) if ctx.has_bias else None
        share.seen += 1
        if share.seen < share.uses:  # an earlier application's backward returns the sum
            if share.seen == 1:
                torch.autograd.Variable._execution_engine.queue_callback(lambda: _check_shared(share))
            share.dw, share.db = dw, db
            return dx, None, None, *(None for _ in ctx.rows)
        share.seen, share.dw, share.db = 0, None, None
        return dx, None if db is None else db.view(-1), None, *dw.split(ctx.rows)


def project(x: torch.Tensor, linears: tuple[nn.Linear, ...]) -> tuple[torch.Tensor, ...]:
    """(lin(x) for lin in linears): `packed` split by output width when autograd records."""
    if not torch.is_grad_enabled():
        return tuple(F.linear(x, lin.weight) for lin in linears)
    return packed(x, linears).split([lin.out_features for lin in linears], dim=-1)
