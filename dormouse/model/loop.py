"""The looped block's pieces: the stream it carries, how many iterations run, which positions take them.

- `Stream`: the residual stream of the positions (or, with AttnRes, the sources every layer input is
  mixed from); one implementation for forward, step and the early-exit decode.
- `LoopPlan`: how one call runs the loop: its depth, which iterations get gradients, MoR's rule and
  the decode's early-exit test.
- `sample_depth`: `--rand-depth`'s depth of a training step, uniform over [rand_depth_min, depth],
  a pure function of (seed, step) through the `depth` stream.
- `MoRRouter`: Mixture-of-Recursions' expert-choice router (arXiv 2507.10524).
- `top1_probability`: the CALM-lite exit's confidence.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dormouse import rng
from dormouse.errors import DormouseError
from dormouse.model.init import linear, normal_init_


class Stream:
    """What the loop carries at its positions: the residual stream `x`, or with AttnRes the list of
    sources (embedding first, then every engram and layer output) each layer input is mixed from.

    The plain stream holds a block layer's output as `x` = its x + a and `pending` = its f (or an engram
    memory's output: `join`), not yet added: the next block layer's pre-norm takes it as a fused input
    and adds it in its kernel (`layer_input`, RMSNorm.add_and_norm), and every other reader (an engram
    memory, MoR's router, the head) gets the sum (`input`), the same fp32 add. The re-injection adds the
    embedding to x and leaves f pending."""

    def __init__(self, e: torch.Tensor, attn_res: nn.ModuleList | None):
        self.e, self.attn_res = e, attn_res
        self.x, self.sources = e, [e]
        self.pending: torch.Tensor | None = None

    def reinject(self) -> None:
        """The start of an iteration after the first: the embedding again (AttnRes always has it as a
        source). The plain stream adds it to x; a branch output still pending stays so (the next block
        layer's pre-norm adds it in its kernel)."""
        if self.attn_res is None:
            self.x = self.x + self.e

    def input(self, j: int) -> torch.Tensor:
        """The input of block layer j; j = -1 is the hidden state the head reads."""
        return self.settle() if self.attn_res is None else self.attn_res[j](self.sources)

    def output(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The hidden state the head reads as (x, a branch output still to add to it, or None): the final
        norm adds it in its kernel (AttnRes: its mix of the sources, nothing pending)."""
        if self.attn_res is None:
            return self.x, self.pending
        return self.input(-1), None

    def settle(self) -> torch.Tensor:
        """`x` with the pending branch output added (the plain stream's value; AttnRes: `x` as it is)."""
        if self.pending is not None:
            self.x, self.pending = self.x + self.pending, None
        return self.x

    def layer_input(self, j: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Block layer j's input as (x, a branch output still to add to it, or None): Layer.forward adds it."""
        if self.attn_res is None:
            return self.x, self.pending
        return self.input(j), None

    def join(self, delta: torch.Tensor) -> None:
        """What an engram memory adds, in its own dtype (bf16 under autocast). The plain stream holds it as
        `pending`, as a layer's FFN output: the next block layer's pre-norm adds it in its kernel (no
        separate add, cast or gradient sum: docs/performance.md). AttnRes takes it as a source
        in the stream's dtype."""
        if self.attn_res is None:
            self.settle()
            self.pending = delta
        else:
            self.sources.append(delta.to(self.e.dtype))

    def add(self, delta: torch.Tensor) -> None:
        if self.attn_res is None:
            self.x = self.settle() + delta
        else:
            self.sources.append(delta)

    def add_layer(self, branches: "Branches", gate: torch.Tensor | None = None) -> None:
        """A block layer's outputs, scaled by MoR's `gate` where routed. The plain stream continues from
        x + a, which the FFN's pre-norm formed (in fp32), plus f (pending); AttnRes and MoR take the delta
        a + f."""
        if self.attn_res is None and gate is None:
            self.x, self.pending = branches.mixed, branches.f
            return
        delta = branches.a + branches.f
        self.add(delta if gate is None else gate * delta)


@dataclass(frozen=True)
class Branches:
    """What a block layer gives the stream from its input x: its mixer's output `a`, its FFN's `f`, and
    `mixed` = x + a in x's dtype (the FFN's pre-norm input, summed in the norm: RMSNorm.add_and_norm)."""

    mixed: torch.Tensor
    a: torch.Tensor
    f: torch.Tensor


@dataclass(frozen=True)
class LoopPlan:
    """How one call runs the looped block."""

    depth: int  # iterations to run (at most the config's depth)
    grad_iterations: int = 0  # only the last N iterations record gradients; 0 = all
    causal: bool = True  # MoR: the decode rule σ(score) > 0.5, not top-k over the sequence
    # Decode: called after each iteration but the last with the hidden state the head would read; True
    # skips the remaining iterations (their mixer states are still advanced: DormouseLM.step).
    exit_after: Callable[[torch.Tensor], bool] | None = None

    def records_grad(self, r: int) -> bool:
        return not self.grad_iterations or r >= self.depth - self.grad_iterations


def sample_depth(seed: int, step: int, low: int, high: int) -> int:
    """The loop depth of training step `step` under --rand-depth: uniform over [low, high]."""
    return low + int(torch.randint(high - low + 1, (1,), generator=rng.generator(seed, step, "depth")))


def check_exit(depth: int, max_iter: int, exit_threshold: float) -> None:
    """Refuses a decode cap outside [1, depth] or a threshold outside (0, 1]."""
    if not 1 <= max_iter <= depth:
        raise DormouseError(f"gen_max_iter {max_iter} is outside [1, {depth}] (the model's depth is {depth})")
    if not 0 < exit_threshold <= 1:
        raise DormouseError(f"exit_threshold {exit_threshold} is outside (0, 1]; 1.0 never exits")


def top1_probability(logits: torch.Tensor) -> torch.Tensor:
    """The exit confidence: the largest softmax probability of the next-byte distribution (fp32), [B]."""
    return torch.softmax(logits.float(), dim=-1).amax(-1)


class MoRRouter(nn.Module):
    """Expert-choice routing over the sequence at each loop iteration r ≥ 1 (MoR, arXiv 2507.10524).

    One linear score per (position, iteration): `s = scorer(x)[..., r - 1]` on the stream entering the
    iteration. Training (`causal=False`): the top ceil(capacity · S) positions of each sequence (S
    positions, memory slots included) take the iteration. The top-k sees future scores, so it cannot
    decode; the causal rule, used in eval and decode, takes a position when σ(s) > 0.5. The router
    learns to reproduce its top-k with that threshold through `mor_router`, a BCE of s toward the
    top-k choice (MoR's "aux_loss" sampling), reported in training mode (`Output.aux`) and weighted
    by `mor_aux_weight`. A taken
    position adds σ(s) times what each layer adds (MoR's weighted gate, which gives the LM loss a
    path to the router).
    """

    def __init__(self, d_model: int, iterations: int, capacity: float, *, generator: torch.Generator):
        super().__init__()
        self.capacity = capacity
        self.scorer = linear(d_model, iterations)
        self.scorer._dormouse_route = "adamw_no_decay"  # a gate, not a hidden matrix (routing.py)
        normal_init_(self.scorer.weight, generator)

    def forward(self, r: int, x: torch.Tensor, causal: bool):
        """x [B,S,d] (or [B,d] at decode) entering iteration r -> (taken [B,S] bool, gate [B,S,1], BCE
        toward the top-k choice, None under the causal rule)."""
        score = self.scorer(x)[..., r - 1].float()
        if causal:
            taken, bce = score > 0, None
        else:
            taken = self.top_k(score)
            bce = F.binary_cross_entropy_with_logits(score, taken.float())
        gate = (torch.sigmoid(score) * taken).unsqueeze(-1).to(x.dtype)
        return taken, gate, bce

    def top_k(self, score: torch.Tensor) -> torch.Tensor:
        """The ceil(capacity · S) best-scored positions of each sequence, as a mask [B,S]."""
        k = math.ceil(round(self.capacity * score.shape[-1], 9))  # 0.3 · 10 is 3.0000000000000004
        chosen = score.topk(k, dim=-1).indices
        return torch.zeros_like(score, dtype=torch.bool).scatter_(-1, chosen, True)
