"""The engram gate's fused path: dormouse's Triton kernels (triton.py), one each way, everything after the
projection in fp32 and rounded once; under autograd on the packed projection [v | k], its gradient
written into one tensor (no cat of two)."""

import torch

from dormouse.ops import projections, registry
from dormouse.ops.norm.fla import FUSED_UNAVAILABLE


def fused_kernels() -> tuple[object | None, str]:
    """dormouse's Triton kernels of the gate (ops/engram_gate/triton.py), or None and why not."""
    return registry.own_kernels("dormouse.ops.engram_gate.triton")


def gate(h, e, w_v, w_k, hidden_norm, key_norm) -> torch.Tensor:
    """The gate on dormouse's kernels; its two norms count as two fused calls in counters.NORM."""
    # the fused norms run where fla, hence Triton, is: the refusal is not reached in practice
    kernels = registry.required(
        fused_kernels(), FUSED_UNAVAILABLE, "the engram gate's fused path", "; pass --norm-backend plain"
    )
    registry.record("engram_gate", True)
    registry.record("engram_gate", True)
    norms = (hidden_norm.weight, key_norm.weight, hidden_norm.eps, key_norm.eps)
    if torch.is_grad_enabled():
        return _gate_packed(h, projections.packed(e, (w_v, w_k)), *norms)
    v, k = projections.project(e, (w_v, w_k))  # evals and decoding: the two Linears alone
    rows = registry.rows
    return _forward(kernels, rows(h), rows(v), rows(k), *norms)[0].view(v.shape)


def _forward(kernels, h, v, k, w_h, w_k, eps_h, eps_k):
    return kernels.forward(h, v, k, w_h, w_k, eps_h, eps_k, h.shape[-1] ** -0.5)


@torch.compiler.disable  # Triton launches, called eagerly under torch.compile (as ops/fla/kernels.py's `_opaque`)
def _gate_packed(h, vk, w_h, w_k, eps_h, eps_k) -> torch.Tensor:
    return _FusedGate.apply(h, vk, w_h, w_k, eps_h, eps_k)


class _FusedGate(torch.autograd.Function):
    """The gate of h [..., d] and vk = [v | k] [..., 2d] (one matmul's output): α · v, its gradient for
    vk written into one [..., 2d] tensor (no cat of two)."""

    @staticmethod
    def forward(ctx, h, vk, w_h, w_k, eps_h: float, eps_k: float):
        kernels, _ = fused_kernels()
        d = h.shape[-1]
        rows = registry.rows(vk)
        h_rows = registry.rows(h)
        out, rstd_h, rstd_k, alpha = _forward(kernels, h_rows, rows[:, :d], rows[:, d:], w_h, w_k, eps_h, eps_k)
        ctx.save_for_backward(h_rows, rows, w_h, w_k, rstd_h, rstd_k, alpha)
        ctx.h_shape, ctx.vk_shape = h.shape, vk.shape
        return out.view(h.shape)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        kernels, _ = fused_kernels()
        h, vk, w_h, w_k, rstd_h, rstd_k, alpha = ctx.saved_tensors
        d = h.shape[-1]
        dvk = torch.empty(vk.shape, dtype=vk.dtype, device=vk.device)
        dh, dw_h, dw_k = kernels.backward(
            h, vk[:, :d], vk[:, d:], w_h, w_k, rstd_h, rstd_k, alpha, registry.rows(grad),
            dvk[:, :d], dvk[:, d:], d**-0.5,
        )  # fmt: skip
        return dh.view(ctx.h_shape), dvk.view(ctx.vk_shape), dw_h, dw_k, None, None
