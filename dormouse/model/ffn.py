"""Feed-forward arms: SwiGLU, and a top-k mixture of SwiGLU experts.

Both return `(y, aux)`: `aux` maps a name to a scalar auxiliary term the model adds to its loss and
reports by that name (the dense SwiGLU returns `{}`). `make_ffn` picks one from the config.

Weights are created without drawing from torch's global RNG (`linear`, in model/init.py) and filled by
`reset_parameters(generator)`.
"""

import torch
from torch import nn

from dormouse.model.init import linear, normal_init_
from dormouse.ops import registry
from dormouse.ops import swiglu as swiglu_op
from dormouse.ops.projections import linear_of


class SwiGLU(nn.Module):
    """`w_down(silu(w_gate x) * w_up x)`, no biases. The activation's path is `backend` (ops/swiglu/)."""

    def __init__(self, d_model: int, hidden: int, *, generator: torch.Generator):
        super().__init__()
        self.backend = "auto"  # as asked for (registry.CHOICES); resolved per call on the input's device
        self.w_gate = linear(d_model, hidden)
        self.w_up = linear(d_model, hidden)
        self.w_down = linear(hidden, d_model)
        self.reset_parameters(generator)

    def reset_parameters(self, gen: torch.Generator) -> None:
        for lin in (self.w_gate, self.w_up, self.w_down):
            normal_init_(lin.weight, gen)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return linear_of(swiglu_op.swiglu(x, self.w_gate, self.w_up, self.backend), self.w_down), {}


class MoE(nn.Module):
    """Top-k mixture of SwiGLU experts with a linear router and a Switch-style balance term.

    Routing, per token: `p = softmax(router(x))` over all experts (in fp32 at least); the `top_k` largest are
    chosen and their weights renormalised to sum to 1, so the output is a convex mix of the chosen
    experts whatever `top_k` is (Mixtral / `norm_topk_prob`). Exception: with `top_k == 1` the
    renormalised weight would be the constant 1 and the LM loss would send the router no gradient at
    all, so top-1 keeps the raw probability `p_i` as its weight (the Switch Transformer convention).

    Balance term (returned as `aux["moe_balance"]`): `n_experts * Σ_i f_i · P_i`, where `f_i` is the
    fraction of the `N · top_k` token-slots routed to expert `i` (counts, no gradient) and `P_i` the
    mean router probability of expert `i` over the `N` tokens. It is 1.0 at perfect balance and up to
    `n_experts / top_k` when every token sends all its slots to the same experts.

    Dispatch: `dense=False` runs each expert on the tokens routed to it (gathered by index: shapes change
    with the routing, one host sync per expert); `dense=True` runs every expert on every token and weighs
    the outputs by the routing, zero for experts not chosen: the same function (the zero terms add
    nothing) at n_experts / top_k times the FFN's FLOPs, in fixed shapes a CUDA graph can replay.

    Load statistics: `self.load` (int64 `[n_experts]`, a non-persistent buffer) accumulates the
    token-slots each expert received since the last `pop_load()`, across every call (so across loop
    iterations too). A recomputing forward (activation checkpointing) counts twice.
    """

    def __init__(
        self, d_model: int, hidden: int, n_experts: int, top_k: int, *, generator: torch.Generator, dense: bool = False
    ):
        super().__init__()
        _check_experts(n_experts, top_k)
        self.n_experts, self.top_k, self.dense = n_experts, top_k, dense
        # Each expert initialises itself from `generator`; then the router. reset_parameters draws in
        # the same order, so a reset from a fresh stream reproduces the constructed weights.
        self.experts = nn.ModuleList(SwiGLU(d_model, hidden, generator=generator) for _ in range(n_experts))
        self.router = linear(d_model, n_experts)
        self.router._dormouse_route = "adamw_no_decay"  # a gate, not a hidden matrix (routing.py)
        normal_init_(self.router.weight, generator)
        self.register_buffer("load", torch.zeros(n_experts, dtype=torch.int64), persistent=False)

    def reset_parameters(self, gen: torch.Generator) -> None:
        for expert in self.experts:
            expert.reset_parameters(gen)
        normal_init_(self.router.weight, gen)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Router probabilities `[..., E]` (fp32 at least), chosen experts `[..., k]` and their weights `[..., k]`."""
        logits = self.router(x)
        probs = torch.softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
        top_p, top_i = probs.topk(self.top_k, dim=-1)
        weights = top_p if self.top_k == 1 else top_p / top_p.sum(dim=-1, keepdim=True)
        return probs, top_i, weights

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        shape = x.shape
        xf = x.reshape(-1, shape[-1])
        probs, top_i, weights = self.route(xf)
        out = torch.zeros_like(xf)
        if self.dense:
            gate = torch.zeros_like(probs).scatter(-1, top_i, weights)  # [N, E]: 0 where not chosen
            for e, expert in enumerate(self.experts):
                y, _ = expert(xf)
                out = out + (y * gate[:, e, None].to(y.dtype)).to(out.dtype)
        else:
            for e, expert in enumerate(self.experts):
                # A token picks an expert at most once, so `tok` has no repeats: index_add_ is deterministic.
                tok, slot = (top_i == e).nonzero(as_tuple=True)
                if tok.numel() == 0:
                    continue
                y, _ = expert(xf[tok])
                out.index_add_(0, tok, (y * weights[tok, slot, None].to(y.dtype)).to(out.dtype))
        # Token-slots per expert; a scatter, not bincount, whose output size would need a host sync.
        flat = top_i.reshape(-1)
        counts = torch.zeros(self.n_experts, dtype=torch.int64, device=x.device).scatter_add_(
            0, flat, torch.ones_like(flat)
        )
        with torch.no_grad():
            self.load += counts
        return out.reshape(shape), {"moe_balance": balance_term(probs, counts)}

    def pop_load(self) -> torch.Tensor:
        """Token-slots per expert since the last call, then reset to zero."""
        load = self.load.clone()
        self.load.zero_()
        return load


def balance_term(probs: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """`E * Σ_i f_i P_i` from router probabilities `[..., E]` and token-slot counts per expert `[E]`."""
    n_experts = probs.shape[-1]
    p = probs.reshape(-1, n_experts).mean(dim=0)
    f = counts.to(p.dtype) / counts.sum().clamp_min(1)
    return n_experts * (f * p).sum()


def make_ffn(
    d_model: int, hidden: int, n_experts: int, top_k: int, generator: torch.Generator, *, dense: bool = False
) -> SwiGLU | MoE:
    """The dense SwiGLU when `n_experts == 1` (no router at all), else the mixture of experts (`dense`: its
    dispatch)."""
    _check_experts(n_experts, top_k)
    if n_experts == 1:
        return SwiGLU(d_model, hidden, generator=generator)
    return MoE(d_model, hidden, n_experts, top_k, generator=generator, dense=dense)


def set_swiglu_backend(module: nn.Module, backend: str) -> None:
    """Set the requested backend (one of registry.CHOICES) on every SwiGLU inside `module`."""
    registry.check_choice("swiglu", backend)
    for m in module.modules():
        if isinstance(m, SwiGLU):
            m.backend = backend


def _check_experts(n_experts: int, top_k: int) -> None:
    if n_experts < 1:
        raise ValueError(f"n_experts must be >= 1, got n_experts={n_experts}")
    if not 1 <= top_k <= n_experts:
        raise ValueError(f"top_k must be in [1, n_experts], got top_k={top_k} with n_experts={n_experts}")
