"""The engram memory's gate (model/engram.py, `Engram.forward`): from the looked-up rows e and the hidden
state h,

    v = W_V e,  k = W_K e,  α = σ(<RMSNorm_k(k), RMSNorm_h(h)> / sqrt(d)),  gated = α · v

Two paths compute it. `plain`: torch, the memory's two RMSNorm modules, any device; under bf16 autocast
the normalised key is rounded to bf16 before the product and α before it scales v. `fused`: dormouse's
Triton kernels (model/engram_gate_kernels.py, CUDA only), one each way, everything after the projection
in fp32 and rounded once. The torch path ran ~10 passes over [B, T, d] forward and ~12 backward around
two norm kernels (the op inventory's `model/engram.py` sites, docs/performance.md); the fused forward
reads h, k and v once and writes the gated value.

The gate is the memory's two norms and their inner product, so it follows `--norm-backend`: fused where
both norms resolve to fused (auto: on CUDA), counted as their two calls in counters.NORM, and refused at
`norm.fused_unavailable` where the kernels cannot run. Under autograd, either way, v and k come from one
matmul of e (`projections.project`), so e is cast to bf16 once and its gradient is one matmul's; without
it (evals, decoding) the two Linears run alone, as the projections' docstring explains.
"""

import torch

from dormouse import counters
from dormouse.model import fused_or_plain, projections
from dormouse.model.norm import FUSED_UNAVAILABLE, RMSNorm, resolve_norm_backend


def fused_kernels() -> tuple[object | None, str]:
    """dormouse's Triton kernels of the gate (model/engram_gate_kernels.py), or None and why not."""
    return fused_or_plain.own_kernels("dormouse.model.engram_gate_kernels")


def gate(h: torch.Tensor, e: torch.Tensor, w_v, w_k, hidden_norm: RMSNorm, key_norm: RMSNorm) -> torch.Tensor:
    """α · v for hidden states h [..., d] and looked-up rows e [..., arms·dim] (the module docstring)."""
    if all(resolve_norm_backend(n.backend, h.device) == "fused" for n in (hidden_norm, key_norm)):
        return _fused(h, e, w_v, w_k, hidden_norm, key_norm)
    v, k = projections.project(e, (w_v, w_k))
    dt = torch.promote_types(v.dtype, torch.float32)
    s = (key_norm(k).to(dt) * hidden_norm(h).to(dt)).sum(-1, keepdim=True) / h.shape[-1] ** 0.5
    return torch.sigmoid(s).to(v.dtype) * v


def _fused(h, e, w_v, w_k, hidden_norm: RMSNorm, key_norm: RMSNorm) -> torch.Tensor:
    # the fused norms run where fla, hence Triton, is: the refusal is not reached in practice
    kernels = fused_or_plain.required(
        fused_kernels(), FUSED_UNAVAILABLE, "the engram gate's fused path", "; pass --norm-backend plain"
    )
    counters.NORM.record(fused=True)
    counters.NORM.record(fused=True)
    norms = (hidden_norm.weight, key_norm.weight, hidden_norm.eps, key_norm.eps)
    if torch.is_grad_enabled():
        return _gate_packed(h, projections.packed(e, (w_v, w_k)), *norms)
    v, k = projections.project(e, (w_v, w_k))  # evals and decoding: the two Linears alone
    rows = fused_or_plain.rows
    return _forward(kernels, rows(h), rows(v), rows(k), *norms)[0].view(v.shape)


def _forward(kernels, h, v, k, w_h, w_k, eps_h, eps_k):
    return kernels.forward(h, v, k, w_h, w_k, eps_h, eps_k, h.shape[-1] ** -0.5)


@torch.compiler.disable  # Triton launches, called eagerly under torch.compile (as fla_kernels._opaque)
def _gate_packed(h, vk, w_h, w_k, eps_h, eps_k) -> torch.Tensor:
    return _FusedGate.apply(h, vk, w_h, w_k, eps_h, eps_k)


class _FusedGate(torch.autograd.Function):
    """The gate of h [..., d] and vk = [v | k] [..., 2d] (one matmul's output): α · v, its gradient for
    vk written into one [..., 2d] tensor (no cat of two)."""

    @staticmethod
    def forward(ctx, h, vk, w_h, w_k, eps_h: float, eps_k: float):
        kernels, _ = fused_kernels()
        d = h.shape[-1]
        rows = fused_or_plain.rows(vk)
        h_rows = fused_or_plain.rows(h)
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
            h, vk[:, :d], vk[:, d:], w_h, w_k, rstd_h, rstd_k, alpha, fused_or_plain.rows(grad),
            dvk[:, :d], dvk[:, d:], d**-0.5,
        )  # fmt: skip
        return dh.view(ctx.h_shape), dvk.view(ctx.vk_shape), dw_h, dw_k, None, None
