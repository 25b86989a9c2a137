"""SwiGLU's fused path: dormouse's Triton kernels (triton.py), `silu(gate) * up` and both gradients in fp32
in one pass each, rounded once; under autograd on the packed projection [..., 2·hidden], its gradient
written into one tensor (no cat of two)."""

import torch

from dormouse.ops import registry


def fused_kernels() -> tuple[object | None, str]:
    """dormouse's Triton SwiGLU kernels (ops/swiglu/triton.py), or None and why not."""
    return registry.own_kernels("dormouse.ops.swiglu.triton")


@torch.compiler.disable  # Triton launches, called eagerly under torch.compile (as ops/fla/kernels.py's `_opaque`)
def fused_packed(h: torch.Tensor) -> torch.Tensor:
    """`silu(h[..., :H]) * h[..., H:]` for `h` [..., 2H], with its gradient into one [..., 2H] tensor."""
    return _PackedSwiGLU.apply(h)


@torch.compiler.disable
def fused_pair(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """`silu(gate) * up` by the forward kernel, no gradient (evals and decoding)."""
    if torch.is_grad_enabled() and (gate.requires_grad or up.requires_grad):
        raise RuntimeError("fused_pair has no backward: under autograd use fused_packed on the packed projection")
    return _forward(gate, up)


def _forward(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    kernels, _ = fused_kernels()
    return kernels.forward(registry.rows(gate), registry.rows(up)).view(gate.shape)


class _PackedSwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(h)
        gate, up = h.chunk(2, dim=-1)
        return _forward(gate, up)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        (h,) = ctx.saved_tensors
        kernels, _ = fused_kernels()
        gate, up = (registry.rows(half) for half in h.chunk(2, dim=-1))
        dh = torch.empty(h.shape, dtype=h.dtype, device=h.device)
        d_gate, d_up = (half.view(-1, half.shape[-1]) for half in dh.chunk(2, dim=-1))  # both halves of dh
        kernels.backward(gate, up, registry.rows(grad), d_gate, d_up)
        return dh
