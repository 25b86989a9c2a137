"""DormouseLM: bytes → embedding → (persistent memory) → looped block → final norm → LM head.

The looped block is `block_layers` pre-norm layers (mixer + FFN) applied `depth` times with weights
shared across iterations. Each iteration r > 0 starts from its predecessor's output plus the
embedding again (re-injection); with AttnRes instead, every layer input is a learned mix of the
embedding and all earlier layer outputs (the embedding is always a source). Recurrent state is per
(iteration, layer): iteration 2 of layer 0 has its own KDA state, conv tail or KV cache.

`forward` scores a whole sequence; `step` advances one byte carrying every layer's state and gives
the same logits as the full forward (a test says so).
"""

import hashlib
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from dormouse import rng
from dormouse.config import ModelConfig, engram_layers
from dormouse.errors import CheckpointError
from dormouse.model.attention import CausalSelfAttention
from dormouse.model.attnres import AttnRes
from dormouse.model.engram import Engram, EngramCache, EngramStats, EngramWindow
from dormouse.model.ffn import make_ffn
from dormouse.model.init import normal_init_
from dormouse.model.kda import KDALayer
from dormouse.model.memory import PersistentMemory
from dormouse.model.norm import RMSNorm, set_norm_backend

VOCAB = 256
ENGRAM_FILE = "engram"  # the checkpoint file (stem) of the engram tables and their optimizer state


@dataclass
class Output:
    logits: torch.Tensor  # [B, T, 256]
    loss: torch.Tensor | None = None  # the objective: ce + Σ weight · aux term
    ce: torch.Tensor | None = None  # mean cross-entropy of the next byte, nats
    aux: dict[str, torch.Tensor] = field(default_factory=dict)  # each auxiliary term by name (unweighted)
    engram: EngramStats | None = None  # rows/arms the memories looked up (None: the arm is off)
    cache: "ModelCache | None" = None


@dataclass
class ModelCache:
    """Decode state: one mixer cache per (iteration, layer), in unrolled order, the engram memories'
    byte window and conv tails (None when the arm is off) and the bytes seen."""

    mixers: list
    position: int
    engram: EngramCache | None = None


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
        # One engram memory per insertion layer (keyed by the layer's index), each with its own tables.
        self.engram = None
        if cfg.engram:
            self.engram = nn.ModuleDict(
                {
                    str(j): Engram(
                        orders=[int(n) for n in cfg.engram_orders.split(",")],
                        heads=cfg.engram_heads,
                        rows=cfg.engram_rows,
                        dim=cfg.engram_dim,
                        d_model=d,
                        seed=seed,
                        layer=j,
                        conv=cfg.engram_conv,
                        generator=gen,
                        eps=cfg.norm_eps,
                    )
                    for j in engram_layers(cfg)
                }
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
        set_norm_backend(self, cfg.norm_backend)

    # ---- the trunk: one implementation for forward and step --------------------------------------------------

    def _trunk(self, e, caches, *, keys=None, conv=None, slots=0, step=False, want_cache=False):
        """The looped block on embedded input e; `caches` holds one entry per unrolled layer, or None.

        `keys` {insertion layer: engram keys of the byte positions} (the last positions of e, after
        `slots` memory slots); in the first iteration each memory's output joins the input of its
        block layer. `conv` {insertion layer: conv tail} continues the memories' convs (None: from the
        sequence start). Returns (h, caches, aux terms, engram stats, conv tails).
        """
        new_caches, aux_terms, stats, tails = [], {}, None, {}
        x, sources = e, [e]  # residual stream, or AttnRes sources
        for r in range(self.cfg.depth):
            if r and self.attn_res is None:
                x = x + e  # re-inject the embedding each iteration (AttnRes always sees it as a source)
            for j, layer in enumerate(self.layers):
                if keys is not None and r == 0 and j in keys:
                    h = x if self.attn_res is None else self.attn_res[j](sources)
                    delta, read, tails[j] = self._memory(j, h, keys[j], (conv or {}).get(j), slots)
                    stats = read if stats is None else stats + read
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
        return h, new_caches, {name: value / n for name, value in aux_terms.items()}, stats, tails

    def _memory(self, j, h, keys, conv_tail, slots):
        """The engram memory of block layer j on its input h: (what it adds, stats, its conv tail)."""
        delta, stats, conv_tail = self.engram[str(j)](h[..., slots:, :] if slots else h, keys, conv_tail)
        if slots:  # memory slots have no bytes, so no n-grams: nothing is added there
            delta = torch.cat([delta.new_zeros(*delta.shape[:-2], slots, delta.shape[-1]), delta], -2)
        return delta, stats, conv_tail

    def _memories(self) -> list[tuple[int, Engram]]:
        """(insertion layer, its engram memory), ascending; none when the arm is off."""
        return [] if self.engram is None else [(int(j), m) for j, m in self.engram.items()]

    def _engram_keys(self, input_ids, cache, want_window):
        """Each memory's keys of input_ids ({insertion layer: [B, T, arms]}) and the byte window after
        them (None when neither wanted nor continued), or (None, None) when the arm is off. A sequence
        continued from `cache` hashes across the seam."""
        memories = self._memories()
        if not memories:
            return None, None
        if cache is None:  # THE key function, as in training and eval
            keys = {j: m.keys(input_ids) for j, m in memories}
            orders = memories[0][1].orders  # the memories share their n-gram orders, so one byte window
            return keys, (EngramWindow.from_prefix(input_ids, orders) if want_window else None)
        keys = {}
        for j, m in memories:
            keys[j], window = m.continue_keys(cache.engram.window, input_ids)
        return keys, window

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
        keys, window = self._engram_keys(input_ids, cache, return_cache)
        mixers = None if cache is None else cache.mixers
        conv = None if cache is None or cache.engram is None else cache.engram.conv
        h, caches, aux, stats, tails = self._trunk(
            e, mixers, keys=keys, conv=conv, slots=slots, want_cache=return_cache
        )
        logits = self._head(h[:, slots:])
        out = Output(logits=logits, aux=aux, engram=stats)
        if return_cache:
            seen = 0 if cache is None else cache.position
            engram = None if window is None else EngramCache(window, tails)
            out.cache = ModelCache(caches, seen + input_ids.shape[1], engram)
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
        memories = self._memories()
        window = memories[0][1].empty_window(batch_size, device) if memories else None
        tails = {}
        if self.memory is not None:
            e = self.memory.slots.to(device).expand(batch_size, -1, -1)
            # No bytes yet, but the slots must take the same path as in a full forward (with AttnRes the
            # engram outputs are sources, zero at the slots).
            keys = {j: torch.empty(batch_size, 0, m.arms, dtype=torch.int64, device=device) for j, m in memories}
            _, caches, _, _, tails = self._trunk(e, None, keys=keys or None, slots=e.shape[1], want_cache=True)
        return ModelCache(caches, 0, None if window is None else EngramCache(window, tails))

    @torch.no_grad()
    def step(self, byte: torch.Tensor, cache: ModelCache) -> tuple[torch.Tensor, ModelCache]:
        """One position: byte [B] int64 -> (logits [B, 256], cache)."""
        _check_bytes(byte, "byte")
        engram, keys, conv = cache.engram, None, None
        if engram is not None:
            keys, conv = {}, engram.conv
            for j, m in self._memories():
                keys[j], window = m.step_keys(engram.window, byte)
        h, caches, _, _, tails = self._trunk(self.embed(byte), cache.mixers, keys=keys, conv=conv, step=True)
        if engram is not None:
            engram = EngramCache(window, tails)
        return self._head(h), ModelCache(caches, cache.position + 1, engram)

    # ---- checkpoint parts: the engram tables travel in their own file, stamped with their keys ----

    def engram_fingerprint(self) -> str | None:
        """sha256 over every memory's key fingerprint with its layer: how all the tables are addressed."""
        if self.engram is None:
            return None
        text = " ".join(f"layer={j}:{m.fingerprint()}" for j, m in self._memories())
        return hashlib.sha256(f"engram-memories-v1 {text}".encode()).hexdigest()

    def checkpoint_parts(self) -> tuple[dict, dict, dict]:
        """(model tensors, {ENGRAM_FILE: every memory's table} or {}, JSON stamp) for checkpoint.save.

        The tables keep their parameter names (`engram.<layer>.table.weight`), so one file holds all.
        """
        state = self.state_dict()
        prefixes = tuple(f"engram.{j}.table." for j, _ in self._memories())
        tables = {k: v for k, v in state.items() if prefixes and k.startswith(prefixes)}
        dense = {k: v for k, v in state.items() if k not in tables}
        stamp = {"engram_keys": self.engram_fingerprint()}
        return dense, ({ENGRAM_FILE: tables} if tables else {}), stamp

    def load_checkpoint_parts(self, model_state: dict, tensors: dict, stamp: dict) -> None:
        """Refuses a checkpoint whose engram file is missing or whose tables were addressed by other keys."""
        if self.engram is not None:
            if ENGRAM_FILE not in tensors:
                raise CheckpointError(
                    f"the model has an engram memory but the checkpoint has no {ENGRAM_FILE}.safetensors"
                )
            if stamp.get("engram_keys") != self.engram_fingerprint():
                raise CheckpointError(
                    f"the checkpoint's engram tables were addressed by keys {stamp.get('engram_keys')}, this "
                    f"model hashes with {self.engram_fingerprint()}: orders, heads, rows, seed or "
                    "engram_layers differ"
                )
        self.load_state_dict({**model_state, **tensors.get(ENGRAM_FILE, {})})

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


def _check_bytes(x: torch.Tensor, name: str) -> None:
    if x.dtype != torch.int64:
        raise TypeError(f"{name} must be int64 byte values, got {x.dtype}")
