"""The engram gate in plain torch, the definition: α · v with v = W_V e, k = W_K e and
α = σ(<RMSNorm_k(k), RMSNorm_h(h)> / sqrt(d)); under bf16 autocast the normalised key is rounded to
bf16 before the product and α before it scales v."""

import torch

from dormouse.ops import projections


def gate(h: torch.Tensor, e: torch.Tensor, w_v, w_k, hidden_norm, key_norm) -> torch.Tensor:
    """α · v for hidden states h [..., d] and looked-up rows e [..., arms·dim], the norms the memory's
    RMSNorm modules (each call counted in counters.NORM)."""
    v, k = projections.project(e, (w_v, w_k))
    dt = torch.promote_types(v.dtype, torch.float32)
    s = (key_norm(k).to(dt) * hidden_norm(h).to(dt)).sum(-1, keepdim=True) / h.shape[-1] ** 0.5
    return torch.sigmoid(s).to(v.dtype) * v
