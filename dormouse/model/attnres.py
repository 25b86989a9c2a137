"""Attention Residuals over depth (Kimi, arXiv 2603.15031): a layer's input is a learned mix of
earlier outputs instead of their running sum.

    h = Σ_i α_i v_i,    α = softmax_i( wᵀ RMSNorm(v_i) )      (softmax over sources, per token)

`w` is a pseudo-query of shape `[d]`, independent of the input and initialised to zero, so a fresh
model takes the plain mean of its sources. Keys are the sources through an RMSNorm with its own gain;
the values are the sources themselves. The logits, the softmax and the mix run in fp32 (fp64 for fp64
sources) and the result is cast back to the sources' dtype.

Contract with the model (`model.py` builds this; nothing here enforces it):

* One `AttnRes` per layer input. Its sources are, in order, `[embedding, output of each earlier
  layer]`, where "earlier" runs across loop iterations: in iteration `r` of a block of `n` layers,
  layer `j` sees the embedding and the `r·n + j` layer outputs produced before it.
* A layer's output here is what that layer adds (mixer + FFN contribution), not a residual-stream
  sum. The layer still applies its usual pre-norm to `h`.
* The module does not depend on the number of sources, so the same `AttnRes` (one per position in
  the block) serves every loop iteration; the sources simply grow with depth.
* The first layer of the first iteration has a single source, the embedding, which is returned
  unchanged (the paper's first layer bypasses AttnRes the same way).

The paper counts attention and MLP as separate sub-layers; here a layer is mixer + FFN. Full AttnRes
keeps every source alive for backward (memory grows with `block_layers · depth`); Block AttnRes is not
implemented.
"""

import torch
from torch import nn

from dormouse.model.norm import RMSNorm


class AttnRes(nn.Module):
    def __init__(self, d_model: int, *, eps: float, generator: torch.Generator):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(d_model))
        self.norm = RMSNorm(d_model, eps)
        self.reset_parameters(generator)

    def reset_parameters(self, gen: torch.Generator) -> None:
        # Nothing is random: the query starts at zero (uniform mix), the key norm's gain at one.
        # `gen` is taken so every module resets the same way.
        with torch.no_grad():
            self.w.zero_()
        self.norm.reset_parameters()

    def weights(self, sources: list[torch.Tensor]) -> torch.Tensor:
        """Mix weights `[L, ...]` (fp32 at least) of `L` sources `[..., d]`; they sum to 1 over `L`."""
        return self._weights(_stack(sources))

    def forward(self, sources: list[torch.Tensor]) -> torch.Tensor:
        """`sources`: `L` tensors `[..., d]` (`[B, T, d]` in training, `[B, d]` in a decode step)."""
        if len(sources) == 1:
            return sources[0]
        v = _stack(sources)
        return torch.einsum("l...,l...d->...d", self._weights(v), v).to(sources[0].dtype)

    def _weights(self, v: torch.Tensor) -> torch.Tensor:
        logits = self.norm(v) @ self.w.to(v.dtype)  # [L, ...]
        return torch.softmax(logits, dim=0)


def _stack(sources: list[torch.Tensor]) -> torch.Tensor:
    if not sources:
        raise ValueError("AttnRes needs at least one source")
    v = torch.stack(sources)
    return v.to(torch.promote_types(v.dtype, torch.float32))
