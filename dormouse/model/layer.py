"""One block layer: a pre-norm mixer (KDA or softmax attention) then a pre-norm FFN (SwiGLU or experts).
The looped block (model/loop.py, model/model.py) applies `block_layers` of them `depth` times."""

import torch
from torch import nn

from dormouse.config import ModelConfig
from dormouse.model.attention import CausalSelfAttention
from dormouse.model.dropout import keep_all
from dormouse.model.ffn import make_ffn
from dormouse.model.kda_layer import KDALayer
from dormouse.model.loop import Branches
from dormouse.model.norm import RMSNorm


class Layer(nn.Module):
    """Pre-norm mixer then pre-norm FFN. Returns its branches' outputs (loop.Branches): the stream adds them."""

    def __init__(self, cfg: ModelConfig, gen: torch.Generator, mixer: str):
        super().__init__()
        d = cfg.d_model
        self.mixer_norm = RMSNorm(d, cfg.norm_eps)
        if mixer == "kda":
            self.mixer = KDALayer(
                d,
                cfg.n_heads,
                cfg.head_dim,
                generator=gen,
                short_conv=cfg.short_conv,
                conv_size=cfg.conv_size,
                gate_lower_bound=cfg.gate_lower_bound,
                backend=cfg.kda_backend,
                chunk_size=cfg.kda_chunk_size,
                norm_eps=cfg.norm_eps,
                fla_safe_gate=cfg.kda_safe_gate,
                fla_recompute=cfg.kda_recompute,
                fla_prep_in_kernel=cfg.kda_prep_in_kernel,
            )
        else:
            self.mixer = CausalSelfAttention(
                d, cfg.n_heads, cfg.head_dim, generator=gen, qk_norm=cfg.attn_qk_norm, eps=cfg.norm_eps
            )
        self.ffn_norm = RMSNorm(d, cfg.norm_eps)
        self.ffn = make_ffn(d, cfg.ffn_hidden, cfg.n_experts, cfg.experts_top_k, gen, dense=cfg.experts_dense)

    def forward(self, x, cache=None, *, pending=None, step: bool = False, want_cache: bool = False, drop=keep_all):
        """x [B,T,d] (or [B,d] with step=True) -> (Branches, aux, cache or None). `pending`: the previous
        layer's FFN output, still to add to x: the pre-norm takes it as a fused input (loop.Stream). `drop`
        is applied to the mixer's and the FFN's outputs (dropout, as nanoGPT's residual branches)."""
        if pending is None:
            h = self.mixer_norm(x)
        else:
            h, x = self.mixer_norm.add_and_norm(pending, x)
        if step:
            a, cache = self.mixer.step(h, cache)
        elif want_cache:
            a, cache = self.mixer(h, cache, return_cache=True)
        else:
            a, cache = self.mixer(h, cache), None
        a = drop(a)
        h, mixed = self.ffn_norm.add_and_norm(a, x)
        f, aux = self.ffn(h)
        return Branches(mixed, a, drop(f)), aux, cache

    def advance_state(self, x: torch.Tensor, cache):
        """The mixer's state after one more position x [B,d]; its output is dropped, the FFN not run."""
        _, cache = self.mixer.step(self.mixer_norm(x), cache)
        return cache
