"""DormouseLM: bytes → embedding → (persistent memory) → looped block → final norm → LM head.

The looped block is `block_layers` pre-norm layers (mixer + FFN) applied `depth` times with weights
shared across iterations. Each iteration r > 0 starts from its predecessor's output plus the
embedding again (re-injection); with AttnRes instead, every layer input is a learned mix of the
embedding and all earlier layer outputs (the embedding is always a source). Recurrent state is per
(iteration, layer): iteration 2 of layer 0 has its own KDA state, conv tail or KV cache.

`forward` scores a whole sequence; `step` advances one byte carrying every layer's state and gives
the same logits as the full forward (a test says so).
"""

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from dormouse import rng
from dormouse.config import ModelConfig
from dormouse.errors import CheckpointError
from dormouse.model.attention import CausalSelfAttention
from dormouse.model.attnres import AttnRes
from dormouse.model.engram import Engram, EngramStats, EngramWindow
from dormouse.model.ffn import make_ffn
from dormouse.model.init import normal_init_
from dormouse.model.kda import KDALayer
from dormouse.model.memory import PersistentMemory
from dormouse.model.norm import RMSNorm

VOCAB = 256
ENGRAM_TABLE = "engram.table."


@dataclass
class Output:
    logits: torch.Tensor  # [B, T, 256]
    loss: torch.Tensor | None = None  # the objective: ce + Σ weight · aux term
    ce: torch.Tensor | None = None  # mean cross-entropy of the next byte, nats
    aux: dict[str, torch.Tensor] = field(default_factory=dict)  # each auxiliary term by name (unweighted)
    engram: EngramStats | None = None  # rows/arms the memory looked up (None: the arm is off)
    cache: "ModelCache | None" = None


@dataclass
class ModelCache:
    """Decode state: one mixer cache per (iteration, layer), in unrolled order, the engram n-gram
    window (None when the arm is off) and the bytes seen."""

    mixers: list
    position: int
    engram_window: EngramWindow | None = None


class Layer(nn.Module):
    """Pre-norm mixer then pre-norm FFN. Returns what the layer adds (mixer + FFN outputs)."""

    def __init__(self, cfg: ModelConfig, gen: torch.Generator):
        super().__init__()
        d = cfg.d_model
        self.mixer_norm = RMSNorm(d, cfg.norm_eps)
        if cfg.mixer == "kda":
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
            )
        else:
            self.mixer = CausalSelfAttention(d, cfg.n_heads, cfg.head_dim, generator=gen)
        self.ffn_norm = RMSNorm(d, cfg.norm_eps)
        self.ffn = make_ffn(d, cfg.ffn_hidden, cfg.n_experts, cfg.experts_top_k, gen)

    def forward(self, x, cache=None, *, step: bool = False, want_cache: bool = False):
        """x [B,T,d] (or [B,d] with step=True) -> (delta, aux, cache or None)."""
        h = self.mixer_norm(x)
        if step:
            a, cache = self.mixer.step(h, cache)
        elif want_cache:
            a, cache = self.mixer(h, cache, return_cache=True)
        else:
            a, cache = self.mixer(h, cache), None
        f, aux = self.ffn(self.ffn_norm(x + a))
        return a + f, aux, cache


class DormouseLM(nn.Module):
    def __init__(self, cfg: ModelConfig, *, seed: int = 0):
        super().__init__()
        if cfg.head_dim == 0 or cfg.ffn_hidden == 0:
            raise ValueError("DormouseLM needs a resolved ModelConfig (config.resolve fills head_dim, ffn_hidden)")
        self.cfg = cfg
        gen = rng.generator(seed, 0, "init")
        d = cfg.d_model
        self.embed = nn.Embedding(VOCAB, d, _weight=torch.empty(VOCAB, d))
        normal_init_(self.embed.weight, gen)
        self.memory = None
        if cfg.persistent_memory != "disabled":
            self.memory = PersistentMemory(cfg.memory_slots, d, cfg.persistent_memory, generator=gen)
        self.layers = nn.ModuleList(Layer(cfg, gen) for _ in range(cfg.block_layers))
        self.engram = None
        if cfg.engram:
            self.engram = Engram(
                orders=[int(n) for n in cfg.engram_orders.split(",")],
                heads=cfg.engram_heads,
                rows=cfg.engram_rows,
                dim=cfg.engram_dim,
                d_model=d,
                seed=seed,
                generator=gen,
                eps=cfg.norm_eps,
            )
        # One AttnRes per position in the block (shared across iterations) and one before the head.
        self.attn_res = None
        if cfg.attn_res:
            self.attn_res = nn.ModuleList(
                AttnRes(d, eps=cfg.norm_eps, generator=gen) for _ in range(cfg.block_layers + 1)
            )
        self.final_norm = RMSNorm(d, cfg.norm_eps)
        self.lm_head = None
        if not cfg.tie_embeddings:
            self.lm_head = nn.Linear(d, VOCAB, bias=False, device="meta").to_empty(device="cpu")
            normal_init_(self.lm_head.weight, gen)
            self.lm_head._dormouse_route = "adamw_decay"  # the head is not a hidden matrix

    # ---- the trunk: one implementation for forward and step --------------------------------------------------

    def _trunk(self, e, caches, *, keys=None, slots=0, step=False, want_cache=False):
        """The looped block on embedded input e; `caches` holds one entry per unrolled layer, or None.

        `keys` are the engram keys of the byte positions (the last positions of e, after `slots`
        memory slots); the memory's output joins the input of block layer `engram_layer` in the first
        iteration. Returns (h, caches, aux terms, engram stats).
        """
        new_caches, aux_terms, stats = [], {}, None
        x, sources = e, [e]  # residual stream, or AttnRes sources
        for r in range(self.cfg.depth):
            if r and self.attn_res is None:
                x = x + e  # re-inject the embedding each iteration (AttnRes always sees it as a source)
            for j, layer in enumerate(self.layers):
                if keys is not None and r == 0 and j == self.cfg.engram_layer:
                    h = x if self.attn_res is None else self.attn_res[j](sources)
                    delta, stats = self.engram(h[..., slots:, :] if slots else h, keys)
                    if slots:  # memory slots have no bytes, so no n-grams: nothing is added there
                        delta = torch.cat([delta.new_zeros(*delta.shape[:-2], slots, delta.shape[-1]), delta], -2)
                    if self.attn_res is None:
                        x = x + delta
                    else:
                        sources.append(delta)
                cache = None if caches is None else caches[r * len(self.layers) + j]
                inp = x if self.attn_res is None else self.attn_res[j](sources)
                delta, aux, cache = layer(inp, cache, step=step, want_cache=want_cache)
                if self.attn_res is None:
                    x = x + delta
                else:
                    sources.append(delta)
                new_caches.append(cache)
                for name, value in aux.items():
                    aux_terms[name] = aux_terms.get(name, 0.0) + value
        h = x if self.attn_res is None else self.attn_res[-1](sources)
        n = self.cfg.depth * len(self.layers)
        return h, new_caches, {name: value / n for name, value in aux_terms.items()}, stats

    def _head(self, h):
        h = self.final_norm(h)
        weight = self.embed.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(h, weight.to(h.dtype))

    def forward(
        self,
        input_ids: torch.Tensor,
        targets: torch.Tensor | None = None,
        *,
        cache: ModelCache | None = None,
        return_cache: bool = False,
        use_memory: bool = True,
    ) -> Output:
        """input_ids [B,T] int64; targets [B,T] (the next byte of each input) or None.

        `cache` continues a sequence (prefill then decode); the memory slots are prepended only when
        a sequence starts (cache None).
        """
        _check_bytes(input_ids, "input_ids")
        e = self.embed(input_ids)
        slots = 0
        if cache is None and self.memory is not None:
            e = self.memory.prepend(e, use_memory)
            slots = e.shape[1] - input_ids.shape[1]
        keys, window = None, None
        if self.engram is not None:
            # One key function on every path; a sequence continued from a cache hashes across the seam.
            if cache is None:
                keys = self.engram.keys(input_ids)
                window = EngramWindow.from_prefix(input_ids, self.engram.orders) if return_cache else None
            else:
                keys, window = self.engram.continue_keys(cache.engram_window, input_ids)
        mixers = None if cache is None else cache.mixers
        h, caches, aux, stats = self._trunk(e, mixers, keys=keys, slots=slots, want_cache=return_cache)
        logits = self._head(h[:, slots:])
        out = Output(logits=logits, aux=aux, engram=stats)
        if return_cache:
            seen = 0 if cache is None else cache.position
            out.cache = ModelCache(caches, seen + input_ids.shape[1], window)
        if targets is not None:
            _check_bytes(targets, "targets")
            out.ce = F.cross_entropy(logits.float().reshape(-1, VOCAB), targets.reshape(-1))
            out.loss = out.ce + self.aux_weights_sum(aux)
        return out

    def aux_weights_sum(self, aux: dict[str, torch.Tensor]) -> torch.Tensor | float:
        weights = {"moe_balance": self.cfg.moe_balance_weight}
        return sum((weights[name] * value for name, value in aux.items()), 0.0)

    @torch.no_grad()
    def new_cache(self, batch_size: int, device: torch.device | str = "cpu") -> ModelCache:
        """An empty decode state; the persistent memory slots (if any) have already been run through."""
        caches = [None] * (self.cfg.depth * len(self.layers))
        window = None if self.engram is None else self.engram.empty_window(batch_size, device)
        if self.memory is not None:
            e = self.memory.slots.to(device).expand(batch_size, -1, -1)
            # No bytes yet, but the slots must take the same path as in a full forward (with AttnRes the
            # engram output is a source, zero at the slots).
            keys = None if window is None else window.history.new_empty(batch_size, 0, self.engram.arms)
            _, caches, _, _ = self._trunk(e, None, keys=keys, slots=e.shape[1], want_cache=True)
        return ModelCache(caches, 0, window)

    @torch.no_grad()
    def step(self, byte: torch.Tensor, cache: ModelCache) -> tuple[torch.Tensor, ModelCache]:
        """One position: byte [B] int64 -> (logits [B, 256], cache)."""
        _check_bytes(byte, "byte")
        keys, window = None, None
        if self.engram is not None:
            keys, window = self.engram.step_keys(cache.engram_window, byte)
        h, caches, _, _ = self._trunk(self.embed(byte), cache.mixers, keys=keys, step=True)
        return self._head(h), ModelCache(caches, cache.position + 1, window)

    # ---- checkpoint parts: the engram table travels in its own file, stamped with its key function ----

    def checkpoint_parts(self) -> tuple[dict, dict, dict]:
        """(model tensors, {"engram": table tensors} or {}, JSON stamp) for checkpoint.save."""
        state = self.state_dict()
        tables = {k: v for k, v in state.items() if k.startswith(ENGRAM_TABLE)}
        dense = {k: v for k, v in state.items() if k not in tables}
        stamp = {"engram_keys": None if self.engram is None else self.engram.fingerprint()}
        return dense, ({"engram": tables} if tables else {}), stamp

    def load_checkpoint_parts(self, model_state: dict, tensors: dict, stamp: dict) -> None:
        """Refuses a checkpoint whose engram table is missing or was addressed by other keys."""
        if self.engram is not None:
            if "engram" not in tensors:
                raise CheckpointError("the model has an engram memory but the checkpoint has no engram file")
            if stamp.get("engram_keys") != self.engram.fingerprint():
                raise CheckpointError(
                    f"the checkpoint's engram table was addressed by keys {stamp.get('engram_keys')}, this "
                    f"model hashes with {self.engram.fingerprint()}: orders, heads, rows or seed differ"
                )
        self.load_state_dict({**model_state, **tensors.get("engram", {})})

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


def _check_bytes(x: torch.Tensor, name: str) -> None:
    if x.dtype != torch.int64:
        raise TypeError(f"{name} must be int64 byte values, got {x.dtype}")
