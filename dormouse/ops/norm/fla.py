"""RMSNorm on fla's Triton kernels (CUDA): fla's `rms_norm`, its `rms_norm_gated`, and `rms_norm_to`,
fla's layer-norm kernels with the output written in a dtype of the caller's and, with a residual, the
add formed in the kernel (its backward on dormouse's kernel, ops/norm/triton.py)."""

import torch

from dormouse import ledger
from dormouse.ops import registry
from dormouse.ops.fla import kernels as fla_kernels

FUSED_UNAVAILABLE = ledger.register(
    "norm.fused_unavailable",
    ledger.Kind.LOUD,
    "fused RMSNorm asked for (or auto on CUDA), but fla's rms_norm (rms_norm_gated for the gated norm; for "
    "add_and_norm's backward and the engram gate dormouse's Triton kernels) is not importable or the tensors "
    "are not on CUDA",
    __name__,
)


def add_norm_kernels() -> tuple[object | None, str]:
    """dormouse's Triton kernel for the add-and-norm's backward (ops/norm/triton.py), or None and why not."""
    return registry.own_kernels("dormouse.ops.norm.triton")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """fla's RMSNorm: normalises in fp32 and returns x's dtype, as the reference does."""
    fn, _ = fla_kernels.rms_norm()
    return fn(x, weight, None, eps=eps)


def rms_norm_gated(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """fla's `RMSNorm(x) * sigmoid(gate)`: norm, sigmoid and product in one kernel each way, in fp32,
    rounded once to x's dtype."""
    fn, _ = fla_kernels.rms_norm_gated()
    return fn(x, gate, weight, None, activation="sigmoid", eps=eps)


def rms_norm_to(x, residual, weight, eps: float, out_dtype: torch.dtype):
    """RMSNorm of x (of residual + x, returned with the sum, with a `residual`), written in `out_dtype`."""
    return _RMSNormTo.apply(x, residual, weight, eps, out_dtype)


class _RMSNormTo(torch.autograd.Function):
    """fla's RMSNorm kernels (fp32 inside) with the output written in `out_dtype` and the gradient read in
    whatever dtype it arrives; with a `residual`, the norm of residual + x, the sum formed in the kernel and
    returned too (in residual's dtype), its gradient added to the norm's in the backward kernel (dormouse's,
    ops/norm/triton.py). fla's own LayerNormFunction, less its groups, plus out_dtype."""

    @staticmethod
    def forward(ctx, x, residual, weight, eps: float, out_dtype: torch.dtype):
        ops = fla_kernels.layer_norm_ops()[0]
        rows = x.reshape(-1, x.shape[-1]).contiguous()
        res = None if residual is None else residual.reshape(rows.shape).contiguous()
        # `normed` is the sum with a residual, the rows themselves without one.
        y, _, rstd, normed = ops.layer_norm_fwd(
            rows, weight, None, eps, residual=res, out_dtype=out_dtype, is_rms_norm=True
        )
        ctx.save_for_backward(normed, weight, rstd)
        ctx.x_shape, ctx.x_dtype, ctx.has_residual = x.shape, x.dtype, residual is not None
        ctx.set_materialize_grads(False)  # a sum nobody reads (the head's hidden state) has no gradient
        y = y.view(x.shape)
        return y if residual is None else (y, normed.view(x.shape))

    @staticmethod
    def backward(ctx, dy: torch.Tensor, dsum: torch.Tensor | None = None):
        ops = fla_kernels.layer_norm_ops()[0]
        normed, weight, rstd = ctx.saved_tensors
        dy = torch.zeros_like(normed) if dy is None else dy.reshape(normed.shape).contiguous()
        if not ctx.has_residual:
            dx, dw, _, _ = ops.layer_norm_bwd(
                dy, normed, weight, None, rstd=rstd, is_rms_norm=True, x_dtype=ctx.x_dtype
            )
            return dx.view(ctx.x_shape), None, dw, None, None
        # dormouse's kernel, not fla's with `dres` (1.8 TB/s on the H200): the same arithmetic (ops/norm/triton.py).
        # the fused path runs where fla, hence Triton, is: the refusal is not reached in practice
        kernels = registry.required(
            add_norm_kernels(), FUSED_UNAVAILABLE, "the fused add_and_norm's backward", "; pass --norm-backend plain"
        )
        dsum = None if dsum is None else dsum.reshape(normed.shape)
        dx, dresidual, dw = kernels.backward(dy, normed, weight, rstd, dsum, ctx.x_dtype)
        return dx.view(ctx.x_shape), dresidual.view(ctx.x_shape), dw, None, None
