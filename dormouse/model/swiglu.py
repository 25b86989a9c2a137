"""The SwiGLU activation `silu(gate) * up`, the FFN's elementwise middle.

Two paths compute the same function: `plain` (torch's silu and mul, any device) and `fused`
(dormouse's Triton kernels, model/swiglu_kernels.py: CUDA only). Under bf16 autocast the plain path
rounds the SiLU to bf16 before the product and runs three elementwise kernels forward and three
backward over [B, T, hidden]; on an H200 they are 5.1 ms of `small`'s 54 ms step at batch 64
(docs/performance.md). The fused kernels compute `silu(gate) * up` and both gradients in fp32 in one
pass each and round once (fla's SwiGLU kernels' arithmetic and bits, at ~1.45x their speed).

When autograd records, the fused path takes the gate and up projections as the two halves of one
matmul's output `h` [..., 2·hidden] and writes their gradients into one [..., 2·hidden] tensor, so
the projection's backward needs no `cat` of two gradients. Without autograd (evals, decoding) it runs
the forward kernel on the two separate projections.

`resolve_swiglu_backend` applies `fused_or_plain`'s policy (auto: fused on CUDA, plain elsewhere); the
model sets the configured name on every SwiGLU (`ffn.set_swiglu_backend`), and every call is counted in
counters.SWIGLU, so the eval line's `swiglu=<fused>/<calls>` says which path ran.
"""

import torch
import torch.nn.functional as F

from dormouse import counters, ledger
from dormouse.model import fused_or_plain

SWIGLU_BACKENDS = fused_or_plain.CHOICES
FUSED_UNAVAILABLE = ledger.register(
    "swiglu.fused_unavailable",
    ledger.Kind.LOUD,
    "fused SwiGLU asked for (or auto on CUDA), but dormouse's Triton SwiGLU kernels are not importable or the "
    "tensors are not on CUDA",
    __name__,
)


def fused_kernels() -> tuple[object | None, str]:
    """dormouse's Triton SwiGLU kernels (model/swiglu_kernels.py), or None and why not."""
    return fused_or_plain.own_kernels("dormouse.model.swiglu_kernels")


def resolve_swiglu_backend(requested: str, device: torch.device | str) -> str:
    """The path the SwiGLU activation runs for `requested` on `device`: "fused" or "plain"."""
    return fused_or_plain.resolve(
        requested,
        device,
        flag="--swiglu-backend",
        site=FUSED_UNAVAILABLE,
        kernel=fused_kernels,  # looked up per call: the tests stand in for it
        needs="Triton (for dormouse/model/swiglu_kernels.py)",
    )


def is_fused(backend: str, device: torch.device) -> bool:
    """Whether this call runs the fused path (resolved for `device`); counted in counters.SWIGLU."""
    fused = resolve_swiglu_backend(backend, device) == "fused"
    counters.SWIGLU.record(fused=fused)
    return fused


def plain(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


@torch.compiler.disable  # Triton launches, called eagerly under torch.compile (as fla_kernels._opaque)
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
    return kernels.forward(fused_or_plain.rows(gate), fused_or_plain.rows(up)).view(gate.shape)


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
        gate, up = (fused_or_plain.rows(half) for half in h.chunk(2, dim=-1))
        dh = torch.empty(h.shape, dtype=h.dtype, device=h.device)
        d_gate, d_up = (half.view(-1, half.shape[-1]) for half in dh.chunk(2, dim=-1))  # both halves of dh
        kernels.backward(gate, up, fused_or_plain.rows(grad), d_gate, d_up)
        return dh
