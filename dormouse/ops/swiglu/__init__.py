"""SwiGLU, the op: `silu(x W_gate) * (x W_up)`, the FFN's projections and elementwise middle.

Two paths compute the same function: `plain` (reference.py: torch's silu and mul, any device) and
`fused` (fused.py over dormouse's Triton kernels, triton.py: CUDA only). Under bf16 autocast the plain
path rounds the SiLU to bf16 before the product and runs three elementwise kernels forward and three
backward over [B, T, hidden]; on an H200 they are 5.1 ms of `small`'s 54 ms step at batch 64
(docs/performance.md). The fused kernels compute `silu(gate) * up` and both gradients in fp32 in one
pass each and round once (fla's SwiGLU kernels' arithmetic and bits, at ~1.45x their speed).

When autograd records, the fused path takes the gate and up projections as the two halves of one
matmul's output `h` [..., 2·hidden] and writes their gradients into one [..., 2·hidden] tensor, so
the projection's backward needs no `cat` of two gradients. Without autograd (evals, decoding) it runs
the forward kernel on the two separate projections.

`--swiglu-backend` (auto, fused, plain) chooses through ops/registry.py (auto: fused on CUDA, plain
elsewhere), and every call is counted in counters.SWIGLU, so the eval line's `swiglu=<fused>/<calls>`
says which path ran.
"""

import torch
from torch import nn

from dormouse import counters, ledger
from dormouse.ops import registry
from dormouse.ops.projections import packed, project
from dormouse.ops.swiglu import fused, reference

FUSED_UNAVAILABLE = ledger.register(
    "swiglu.fused_unavailable",
    ledger.Kind.LOUD,
    "fused SwiGLU asked for (or auto on CUDA), but dormouse's Triton SwiGLU kernels are not importable or the "
    "tensors are not on CUDA",
    __name__,
)
# the kernels' accessor is a lambda, looked up per call: the tests stand in for what it calls
NEEDS = "Triton (for dormouse/ops/swiglu/triton.py)"
OP = registry.register(
    registry.Op("swiglu", "--swiglu-backend", FUSED_UNAVAILABLE, lambda: fused.fused_kernels(), NEEDS, counters.SWIGLU)
)


def swiglu(x: torch.Tensor, w_gate: nn.Linear, w_up: nn.Linear, backend: str = "auto") -> torch.Tensor:
    """`silu(w_gate x) * w_up x` [..., hidden] of x [..., d], no biases."""
    if registry.choose("swiglu", backend, x.device) != "fused":
        return reference.swiglu(*project(x, (w_gate, w_up)))
    if torch.is_grad_enabled():  # one matmul's output, its gradient written whole (no split, no cat)
        return fused.fused_packed(packed(x, (w_gate, w_up)))
    return fused.fused_pair(*project(x, (w_gate, w_up)))
