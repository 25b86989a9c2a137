"""The KDA mixer layer: fla's KimiDeltaAttention around the op of ops/kda/, with its projections,
short convolutions on q, k, v (model/short_conv.py), gates and gated output norm. The op takes the
gate's and beta's raw inputs and q and k as the convs give them (ops/kda/ `gated`); which kernels
prepare and run them is the op's choice, from the backend the layer is asked for.
"""

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import skip_init

from dormouse.model.init import linear, normal_init_
from dormouse.model.norm import GatedRMSNorm
from dormouse.model.short_conv import ShortConv
from dormouse.ops import kda as kda_op  # the op through its package: a stand-in set there reaches the layer
from dormouse.ops import registry
from dormouse.ops.kda.fla import fla_options
from dormouse.ops.projections import affine_of, linear_of, packed, project
from dormouse.ops.short_conv import convolve_packed
from dormouse.ops.short_conv.reference import conv_tail

# Every parameter group of KDALayer, in init order; the conv groups exist only with short_conv.
KDA_PARAM_GROUPS = (
    "q_proj",
    "k_proj",
    "v_proj",
    "q_conv",
    "k_conv",
    "v_conv",
    "f_a",
    "f_b",
    "A_log",
    "dt_bias",
    "b_proj",
    "g_a",
    "g_b",
    "o_norm",
    "o_proj",
)
_CONV_GROUPS = ("q_conv", "k_conv", "v_conv")


class _Projected(NamedTuple):
    """`KDALayer._project`'s result: q, k, v (through their convs), the gates' low-rank halves and beta's
    logits, the convs' new tails (None without convs), whether q and k are L2-normalised already, and q's
    and k's fp32 gradient sinks (None unless asked for and fused)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    f_low: torch.Tensor
    b: torch.Tensor
    g_low: torch.Tensor
    conv_state: tuple[torch.Tensor, ...] | None = None
    qk_normed: bool = False
    sinks: tuple[torch.Tensor, ...] | None = None


@dataclass
class KDACache:
    """What one layer carries between calls: pre-conv q/k/v tails (None without short conv), state."""

    conv: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None
    state: torch.Tensor  # [B,H,K,V], fp32


class KDALayer(nn.Module):
    """fla's KimiDeltaAttention (reference sheet §1.4) with K = V = head_dim and no GVA.

    All random init comes from `generator` (see `reset_parameters`); construction never touches the
    global RNG. `forward` takes [B,T,d]; `step` takes one position as [B,d].
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        head_dim: int,
        *,
        generator: torch.Generator,
        short_conv: bool = True,
        conv_size: int = 4,
        gate_lower_bound: float | None = -5.0,
        backend: str = "auto",
        chunk_size: int = 64,
        norm_eps: float = 1e-6,
        fla_safe_gate: bool = False,
        fla_recompute: bool = True,
        fla_prep_in_kernel: bool = False,
    ):
        super().__init__()
        registry.check_choice("kda", backend)
        H, K = n_heads, head_dim
        self.n_heads, self.head_dim = H, K
        self.short_conv = short_conv
        self.gate_lower_bound = gate_lower_bound
        self.backend = backend
        self.chunk_size = chunk_size
        self.fla_options = fla_options(safe_gate=fla_safe_gate, lower_bound=gate_lower_bound, recompute=fla_recompute)
        self.fla_prep_in_kernel = fla_prep_in_kernel
        self.groups = tuple(n for n in KDA_PARAM_GROUPS if short_conv or n not in _CONV_GROUPS)
        self.q_proj = linear(d_model, H * K)
        self.k_proj = linear(d_model, H * K)
        self.v_proj = linear(d_model, H * K)
        if short_conv:
            self.q_conv = ShortConv(H * K, conv_size)
            self.k_conv = ShortConv(H * K, conv_size)
            self.v_conv = ShortConv(H * K, conv_size)
        self.f_a = linear(d_model, K)  # decay gate, low rank
        self.f_b = linear(K, H * K)
        self.A_log = nn.Parameter(torch.empty(H))
        self.dt_bias = nn.Parameter(torch.empty(H * K))
        self.b_proj = linear(d_model, H)
        self.g_a = linear(d_model, K)  # output gate, low rank; fla has a bias on the second half
        self.g_b = skip_init(nn.Linear, K, H * K, bias=True)
        self.o_norm = GatedRMSNorm(K, norm_eps)
        self.o_proj = linear(H * K, d_model)
        self.reset_parameters(generator)

    @torch.no_grad()
    def reset_parameters(self, gen: torch.Generator) -> None:
        """fla 0.6.0's init, every draw from `gen` (on the CPU, so it does not depend on the device)."""
        for name in self.groups:
            part = getattr(self, name)
            if name == "A_log":
                part.copy_(torch.empty(part.shape).uniform_(1, 16, generator=gen).log())
            elif name == "dt_bias":
                # Mamba's dt init: log-uniform in [1e-3, 0.1], stored as its inverse softplus.
                u = torch.rand(part.shape, generator=gen)
                dt = torch.exp(u * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3)).clamp(min=1e-4)
                part.copy_(dt + torch.log(-torch.expm1(-dt)))
            elif name == "o_norm":
                part.reset_parameters()
            else:
                normal_init_(part.weight, gen)
                if getattr(part, "bias", None) is not None:
                    part.bias.zero_()

    def param_groups(self) -> dict[str, list[nn.Parameter]]:
        """Group name (from KDA_PARAM_GROUPS) -> its parameters."""
        groups = {}
        for name in self.groups:
            part = getattr(self, name)
            groups[name] = [part] if isinstance(part, nn.Parameter) else list(part.parameters())
        return groups

    def forward(self, x: torch.Tensor, cache: KDACache | None = None, return_cache: bool = False):
        """x [B,T,d] -> y [B,T,d], or (y, cache) with return_cache; `cache` continues an earlier call."""
        y, cache = self._mix(x, cache, self.backend, return_cache)
        return (y, cache) if return_cache else y

    def step(self, x_t: torch.Tensor, cache: KDACache | None) -> tuple[torch.Tensor, KDACache]:
        """One position x_t [B,d] -> (y_t [B,d], cache); cache=None starts from empty.

        A single position runs the recurrence itself: exact, and cheaper than a padded chunk.
        """
        y, cache = self._mix(x_t[:, None], cache, "recurrent", True)
        return y[:, 0], cache

    def _gate_input(self, f_low: torch.Tensor) -> torch.Tensor:
        """The decay gate's raw input [B,T,H,K] (before dt_bias) from its low-rank half f_a(x), in the
        projection's dtype (bf16 under autocast: fla's in-kernel gate reads it as is, ops/kda/ `gated`)."""
        B, T, _ = f_low.shape
        return linear_of(f_low, self.f_b).view(B, T, self.n_heads, self.head_dim)

    def _project(self, x, cache, sinks: bool = False) -> _Projected:
        """x's six projections, q, k and v through their short convs (continuing the cache's tails). The
        gradient sinks (ops/short_conv/fused.py `fused_convs`) come with the fused convs where `sinks` asks for them."""
        linears = (self.q_proj, self.k_proj, self.v_proj, self.f_a, self.b_proj, self.g_a)
        if not self.short_conv:  # the convs end in SiLU; without them the projections get it here
            q, k, v, f_low, b, g_low = project(x, linears)
            return _Projected(F.silu(q), F.silu(k), F.silu(v), f_low, b, g_low)
        convs = (self.q_conv, self.k_conv, self.v_conv)
        if cache is None and torch.is_grad_enabled():  # one projection, its q, k, v slices convolved
            h = packed(x, linears)
            rest = tuple(lin.out_features for lin in linears[3:])
            weights, backend = tuple(conv.weight for conv in convs), self.q_conv.backend
            # q and k L2-normalised as fused inputs of the conv op where its kernels can (one launch each way)
            c = convolve_packed(h, weights, backend, rest, norm=2, head=self.head_dim, sinks=sinks)
            HK, keep = self.n_heads * self.head_dim, self.q_conv.weight.shape[-1] - 1
            tails = tuple(conv_tail(h[..., i * HK : (i + 1) * HK], keep) for i in range(3))
            return _Projected(*c.outs, conv_state=tails, qk_normed=c.normed, sinks=c.sinks)
        q, k, v, f_low, b, g_low = project(x, linears)
        states = (None, None, None) if cache is None else cache.conv
        (q, cq), (k, ck), (v, cv) = (conv(t, s) for conv, t, s in zip(convs, (q, k, v), states, strict=True))
        return _Projected(q, k, v, f_low, b, g_low, conv_state=(cq, ck, cv))

    def _mix(self, x, cache, backend, return_cache):
        B, T, _ = x.shape
        H, K = self.n_heads, self.head_dim
        # Training on fla with the fused convs: q's and k's gradients handed to the convs in fp32 (ops/kda/fla.py)
        sinks = not return_cache and kda_op.fla_prepares(backend, x.device, self.fla_prep_in_kernel)
        p = self._project(x, cache, sinks=sinks)
        q, k, v = (t.view(B, T, H, K) for t in (p.q, p.k, p.v))
        o, state = kda_op.gated(
            q,
            k,
            v,
            self._gate_input(p.f_low),
            p.b,
            self.A_log,
            self.dt_bias,
            lower_bound=self.gate_lower_bound,
            qk_normed=p.qk_normed,
            sinks=p.sinks,
            initial_state=None if cache is None else cache.state,
            output_final_state=return_cache,
            backend=backend,
            chunk_size=self.chunk_size,
            fla_options=self.fla_options,
            prep_in_kernel=self.fla_prep_in_kernel,
        )
        o = self.o_norm(o, affine_of(p.g_low, self.g_b).view(B, T, H, K))
        y = linear_of(o.flatten(2), self.o_proj)
        return y, (KDACache(p.conv_state, state) if return_cache else None)
