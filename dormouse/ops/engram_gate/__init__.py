"""The engram memory's gate (model/engram.py, `Engram.forward`): from the looked-up rows e and the hidden
state h,

    v = W_V e,  k = W_K e,  α = σ(<RMSNorm_k(k), RMSNorm_h(h)> / sqrt(d)),  gated = α · v

Two paths compute it. `plain` (reference.py): torch, the memory's two RMSNorm modules, any device; under bf16 autocast
the normalised key is rounded to bf16 before the product and α before it scales v. `fused`: dormouse's
Triton kernels (triton.py under fused.py, CUDA only), one each way, everything after the projection
in fp32 and rounded once. The torch path ran ~10 passes over [B, T, d] forward and ~12 backward around
two norm kernels (the op inventory's `model/engram.py` sites, docs/performance.md); the fused forward
reads h, k and v once and writes the gated value.

The gate is the memory's two norms and their inner product, so it follows `--norm-backend` (its op in
ops/registry.py, "engram_gate", takes the norms' flag, site and counter): fused where both norms resolve
to fused (auto: on CUDA), counted as their two calls in counters.NORM, and refused at
`norm.fused_unavailable` where the kernels cannot run. Under autograd, either way, v and k come from one
matmul of e (`ops/projections.py`'s `project`), so e is cast to bf16 once and its gradient is one matmul's; without
it (evals, decoding) the two Linears run alone, as the projections' docstring explains.
"""

import torch

from dormouse import counters
from dormouse.ops import registry
from dormouse.ops.engram_gate import fused, reference
from dormouse.ops.norm.fla import FUSED_UNAVAILABLE

# the memory's two norms fused with their product: the norms' flag, site and counter
# the kernels' accessor is a lambda, looked up per call: the tests stand in for what it calls
NEEDS = "Triton (for dormouse/ops/engram_gate/triton.py)"
OP = registry.register(
    registry.Op("engram_gate", "--norm-backend", FUSED_UNAVAILABLE, lambda: fused.fused_kernels(), NEEDS, counters.NORM)
)


def gate(h: torch.Tensor, e: torch.Tensor, w_v, w_k, hidden_norm, key_norm) -> torch.Tensor:
    """α · v for hidden states h [..., d] and looked-up rows e [..., arms·dim] (the module docstring);
    `hidden_norm` and `key_norm` are the memory's RMSNorm modules (weight, eps, backend)."""
    if all(registry.resolve("engram_gate", n.backend, h.device) == "fused" for n in (hidden_norm, key_norm)):
        return fused.gate(h, e, w_v, w_k, hidden_norm, key_norm)
    return reference.gate(h, e, w_v, w_k, hidden_norm, key_norm)
