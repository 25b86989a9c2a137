"""The models `dormouse bench --model gpt|fla-kda` (and `--baselines`) time beside dormouse, at its size.

Both take their sizes from the resolved config: d_model, n_heads × head_dim, ffn_hidden, and
block_layers · depth real layers (dormouse applies block_layers shared layers depth times, so a
baseline has as many mixer applications, each with weights of its own).

- `gpt` (row model `gpt-sdpa`): a plain pre-norm GPT. Byte embedding, then per layer torch RMSNorm →
  dormouse's causal self-attention (RoPE, scaled_dot_product_attention with is_causal) → RMSNorm →
  dormouse's SwiGLU, a final RMSNorm and the LM head tied to the embedding.
- `fla-kda`: flash-linear-attention's KDAForCausalLM (Triton kernels: CUDA only), built from a
  KDAConfig (fla/models/kda/configuration_kda.py) with the same sizes, its LM head tied too.

A step is forward, cross-entropy of the next byte, backward, grad clip (`grad_clip`, as the trainer
clips), AdamW (fused on CUDA, foreach on the CPU; decay on matrices only, lr constant) and
zero_grad(set_to_none). `--dtype bf16` is autocast with fp32 master weights, as in the trainer. The
batches are random bytes from the `bench` stream of (seed, step): a step's time does not depend on
the bytes, so a baseline needs no corpus.
"""

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from dormouse import rng
from dormouse.config import Config, ModelConfig
from dormouse.errors import ConfigError
from dormouse.model import precision
from dormouse.model.attention import CausalSelfAttention
from dormouse.model.ffn import SwiGLU
from dormouse.model.init import normal_init_
from dormouse.ops.fla import kernels as fla_kernels

VOCAB = 256
ROW_NAMES = {"gpt": "gpt-sdpa", "fla-kda": "fla-kda"}  # --model / --baselines name -> the row's model column


def n_layers(m: ModelConfig) -> int:
    """A baseline's real layers: one per mixer application of dormouse's looped block."""
    return m.block_layers * m.depth


# ---- the plain GPT ---------------------------------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self, m: ModelConfig, gen: torch.Generator):
        super().__init__()
        self.attn_norm = nn.RMSNorm(m.d_model, eps=m.norm_eps)
        self.attn = CausalSelfAttention(m.d_model, m.n_heads, m.head_dim, generator=gen)
        self.ffn_norm = nn.RMSNorm(m.d_model, eps=m.norm_eps)
        self.ffn = SwiGLU(m.d_model, m.ffn_hidden, generator=gen)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        f, _ = self.ffn(self.ffn_norm(x))
        return x + f


class GPT(nn.Module):
    """bytes [B, T] -> logits [B, T, 256]; every weight drawn from the `init` stream of `seed`."""

    def __init__(self, m: ModelConfig, *, seed: int = 0):
        super().__init__()
        if m.head_dim == 0 or m.ffn_hidden == 0:
            raise ValueError("GPT needs a resolved ModelConfig (config.resolve fills head_dim, ffn_hidden)")
        gen = rng.generator(seed, 0, "init")
        self.embed = nn.Embedding(VOCAB, m.d_model, _weight=torch.empty(VOCAB, m.d_model))
        normal_init_(self.embed.weight, gen)
        self.blocks = nn.ModuleList(Block(m, gen) for _ in range(n_layers(m)))
        self.norm = nn.RMSNorm(m.d_model, eps=m.norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        return F.linear(self.norm(h), self.embed.weight)  # the head is the embedding, transposed


# ---- fla's KDA model -------------------------------------------------------------------------------------------


def unavailable(name: str, device: torch.device | str) -> str:
    """Why baseline `name` cannot run on `device` ("" when it can)."""
    if name not in ROW_NAMES:
        raise ValueError(f"unknown baseline {name!r}; choose one of {sorted(ROW_NAMES)}")
    if name != "fla-kda":
        return ""
    device = torch.device(device)
    if device.type != "cuda":
        return f"fla-kda runs fla's Triton kernels: it needs CUDA and fla, and the device is {device.type}"
    cls, why = fla_kernels.kda_causal_lm()
    if cls is None:
        return (
            f"fla-kda needs fla.models.KDAForCausalLM (flash-linear-attention and transformers), which is not "
            f"importable ({why}); install the extra `gpu`"
        )
    return ""


def fla_kda(cfg: Config) -> nn.Module:
    """fla's KDAForCausalLM at the config's sizes, on the CPU (the caller moves it). Field names: fla's
    fla/models/kda/configuration_kda.py. fla initialises through torch's global RNG (Hugging Face's
    post_init); it draws inside a fork seeded from the `init` stream, so the global state is unchanged."""
    m, t = cfg.model, cfg.train
    cls, why = fla_kernels.kda_causal_lm()
    if cls is None:
        raise ConfigError(unavailable("fla-kda", "cuda") or why)
    config = cls.config_class(
        attn_mode="chunk",
        hidden_size=m.d_model,
        num_heads=m.n_heads,
        head_dim=m.head_dim,
        expand_v=1.0,  # V = K = head_dim, as in dormouse's KDA
        num_hidden_layers=n_layers(m),
        intermediate_size=m.ffn_hidden,
        vocab_size=VOCAB,
        use_short_conv=m.short_conv,
        conv_size=m.conv_size,
        norm_eps=m.norm_eps,
        tie_word_embeddings=True,
        use_cache=False,
        fuse_cross_entropy=False,  # the step computes the loss from the logits, as for the GPT
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(rng.seed_of(t.seed, 0, "init"))
        return cls(config)


# ---- one training step -----------------------------------------------------------------------------------------


def random_batch(seed: int, step: int, batch_size: int, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, next-byte targets), int64 [B, T], from the `bench` stream of (seed, step)."""
    z = torch.randint(0, VOCAB, (batch_size, seq_len + 1), generator=rng.generator(seed, step, "bench"))
    return z[:, :-1], z[:, 1:]


def build(name: str, cfg: Config) -> nn.Module:
    """Baseline `name` at the sizes of resolved `cfg`, on the CPU."""
    return GPT(cfg.model, seed=cfg.train.seed) if name == "gpt" else fla_kda(cfg)


def baseline_step(
    name: str, cfg: Config, device: torch.device | str, *, compiled: bool = False
) -> tuple[nn.Module, Callable[[int], float]]:
    """(model, step): `step(s)` runs training step s of baseline `name` (see the module docstring) and
    returns its cross-entropy (nats). `cfg` is resolved (config.resolve); `compiled` wraps the forward in
    torch.compile."""
    t = cfg.train
    device = torch.device(device)
    why = unavailable(name, device)
    if why:
        raise ConfigError(why)
    model = build(name, cfg).to(device).train()
    params = list(model.parameters())  # a tied weight once
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": t.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    fast = {"fused": True} if device.type == "cuda" else {"foreach": True}
    opt = torch.optim.AdamW(groups, lr=t.lr, betas=(0.9, 0.95), eps=1e-8, **fast)
    forward = torch.compile(model) if compiled else model
    logits_of = forward if name == "gpt" else lambda x: forward(input_ids=x).logits

    def step(s: int) -> float:
        x, y = (z.to(device) for z in random_batch(t.seed, s, t.batch_size, t.seq_len))
        with precision.autocast(t.dtype, device.type):
            loss = F.cross_entropy(logits_of(x).reshape(-1, VOCAB), y.reshape(-1))
        loss.backward()
        if t.grad_clip:
            torch.nn.utils.clip_grad_norm_(params, t.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    return model, step
