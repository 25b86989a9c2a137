"""Causal softmax self-attention: the mixer arm that replaces KDA (`--no-kda`).

q/k/v/o projections without bias, optionally an RMSNorm on each head's queries and keys (QK-norm, as in
OLMo 2 and modded-nanogpt), rotary position embeddings on q and k, and `scaled_dot_product_attention`.
Decoding carries a KV cache of the rotated keys and the values; a position's rotary angle is its index in
the sequence, so the positions of new inputs start at the cache length.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dormouse.model.init import linear, normal_init_
from dormouse.model.norm import RMSNorm

ROPE_BASE = 10000.0


@dataclass(frozen=True)
class KVCache:
    """Rotated keys and values of every position seen so far, each `[B, H, S, head_dim]`."""

    k: torch.Tensor
    v: torch.Tensor

    @property
    def length(self) -> int:
        return self.k.shape[2]


def rotary(x: torch.Tensor, start: int) -> torch.Tensor:
    """RoPE on `[B, H, T, D]` for positions `start … start+T-1`, base 10000.

    Half-split pairing (GPT-NeoX / Llama): channel `i` rotates with channel `i + D/2` by the angle
    `pos · base^(-2i/D)`. Angles are computed in at least fp32.
    """
    t, d = x.shape[-2], x.shape[-1]
    dtype = torch.promote_types(x.dtype, torch.float32)
    inv_freq = ROPE_BASE ** (-torch.arange(0, d, 2, device=x.device, dtype=dtype) / d)
    pos = torch.arange(start, start + t, device=x.device, dtype=dtype)
    angle = pos[:, None] * inv_freq[None, :]  # [T, D/2]
    cos, sin = angle.cos(), angle.sin()
    x1, x2 = x.to(dtype).chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


class CausalSelfAttention(nn.Module):
    def __init__(
        self,
        d_model: int,
        n_heads: int,
        head_dim: int,
        *,
        generator: torch.Generator,
        qk_norm: bool = False,
        eps: float = 1e-6,
    ):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"rotary embeddings need an even head_dim, got head_dim={head_dim}")
        self.n_heads, self.head_dim = n_heads, head_dim
        inner = n_heads * head_dim
        self.q_proj = linear(d_model, inner)
        self.k_proj = linear(d_model, inner)
        self.v_proj = linear(d_model, inner)
        self.o_proj = linear(inner, d_model)
        # One gain per channel of a head, shared by the heads (the norm runs over the last dim of [B,T,H,D]).
        self.q_norm, self.k_norm = (RMSNorm(head_dim, eps), RMSNorm(head_dim, eps)) if qk_norm else (None, None)
        self.reset_parameters(generator)

    def reset_parameters(self, gen: torch.Generator) -> None:
        for lin in (self.q_proj, self.k_proj, self.v_proj, self.o_proj):
            normal_init_(lin.weight, gen)
        if self.q_norm is not None:
            self.q_norm.reset_parameters()
            self.k_norm.reset_parameters()

    def forward(
        self, x: torch.Tensor, cache: KVCache | None = None, return_cache: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, KVCache]:
        """`x [B, T, d]` continues the sequence held in `cache` (None: an empty one).

        Returns `y [B, T, d]`, or `(y, cache')` with `return_cache=True`.
        """
        b, t, _ = x.shape
        start = 0 if cache is None else cache.length
        q, k, v = (p(x).view(b, t, self.n_heads, self.head_dim) for p in (self.q_proj, self.k_proj, self.v_proj))
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))
        q, k = rotary(q, start), rotary(k, start)
        if cache is not None:
            k, v = torch.cat((cache.k, k), dim=2), torch.cat((cache.v, v), dim=2)
        if start == 0:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        elif t == 1:
            y = F.scaled_dot_product_attention(q, k, v)  # one new position sees the whole cache
        else:
            # is_causal aligns the mask to the top-left corner; with a cache new row i sees keys <= start+i.
            rows = torch.arange(t, device=x.device)[:, None] + start
            mask = torch.arange(start + t, device=x.device)[None, :] <= rows
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        y = self.o_proj(y.transpose(1, 2).reshape(b, t, self.n_heads * self.head_dim))
        return (y, KVCache(k, v)) if return_cache else y

    def step(self, x_t: torch.Tensor, cache: KVCache | None) -> tuple[torch.Tensor, KVCache]:
        """One position: `x_t [B, d]` → `(y_t [B, d], cache')`."""
        y, cache = self.forward(x_t[:, None], cache, return_cache=True)
        return y[:, 0], cache
