"""DormouseLM: bytes → embedding → (persistent memory) → looped block → final norm → LM head.

The looped block is `block_layers` pre-norm layers (mixer + FFN) applied `depth` times with weights
shared across iterations. Each iteration r > 0 starts from its predecessor's output plus the
embedding again (re-injection); with AttnRes instead, every layer input is a learned mix of the
embedding and all earlier layer outputs (the embedding is always a source). Recurrent state is per
(iteration, layer): iteration 2 of layer 0 has its own KDA state, conv tail or KV cache.

`forward` scores a whole sequence; `step` advances one byte carrying every layer's state and gives
the same logits as the full forward (a test says so). Optional arms of the loop (model/loop.py): a
forward at a smaller depth (`--rand-depth`), gradients through the last iterations only, the
Mixture-of-Recursions router, and the decode's iteration cap and CALM-lite early exit. Auxiliary
heads on the trunk's output: the DSpark draft head (model/dspark.py) and the JEPA predictor
(model/jepa.py), each a term in `Output.aux`. Dropout (model/dropout.py), in training only, on the
embedded input and on each mixer and FFN output before it is added.
"""

import hashlib
from dataclasses import dataclass, field
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from dormouse import rng
from dormouse.config import ModelConfig, engram_layers, layer_mixers
from dormouse.errors import CheckpointError
from dormouse.model.attnres import AttnRes
from dormouse.model.dropout import branch_drop_of, dropout_of, keep_all
from dormouse.model.dspark import DraftHead, dspark_term
from dormouse.model.engram import Engram, EngramCache, EngramStats
from dormouse.model.engram_keys import EngramWindow, check_byte_dtype
from dormouse.model.ffn import set_swiglu_backend
from dormouse.model.init import normal_init_
from dormouse.model.jepa import Predictor, jepa_term
from dormouse.model.layer import Layer
from dormouse.model.loop import LoopPlan, MoRRouter, Stream, check_exit, top1_probability
from dormouse.model.memory import PersistentMemory
from dormouse.model.norm import RMSNorm, set_norm_backend
from dormouse.model.short_conv import set_conv_backend

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
    iterations: int = 0  # loop iterations the call that made this cache ran (0: no byte yet)
    hidden: torch.Tensor | None = None  # [B, d]: what the head read at the last position (DSpark drafts from it)


@dataclass
class Trunk:
    """What the looped block gives back."""

    h: torch.Tensor  # the hidden state the head reads, less `pending`
    caches: list  # one mixer cache per unrolled (iteration, layer)
    aux: dict  # each auxiliary term by name
    engram: EngramStats | None  # rows/arms the memories looked up
    tails: dict  # {insertion layer: its engram conv tail}
    iterations: int  # iterations run; at decode the rest only advanced their mixer states
    pending: torch.Tensor | None = None  # the last FFN output, still to add to h (in the final norm's kernel)


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
        self.layers = nn.ModuleList(Layer(cfg, gen, mixer) for mixer in layer_mixers(cfg))
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
        self.router = None  # drawn last, so the other weights do not depend on the arm
        if cfg.mor:
            self.router = MoRRouter(d, cfg.depth - 1, cfg.mor_capacity, generator=gen)
        # The auxiliary heads after everything else, for the same reason.
        self.draft = DraftHead(d, cfg.dspark_k, eps=cfg.norm_eps, generator=gen) if cfg.dspark_weight else None
        self.jepa = Predictor(d, eps=cfg.norm_eps, generator=gen) if cfg.jepa_weight else None
        set_norm_backend(self, cfg.norm_backend)
        set_conv_backend(self, cfg.conv_backend)
        set_swiglu_backend(self, cfg.swiglu_backend)

    # ---- the trunk: one implementation for forward, step and new_cache ---------------------------------------

    def trunk(
        self,
        e,
        caches,
        plan: LoopPlan,
        *,
        keys=None,
        conv=None,
        slots=0,
        step=False,
        want_cache=False,
        drop=keep_all,
        engram_drop=keep_all,
    ):
        """The looped block on embedded input e, run as `plan` says; `caches` holds one entry per unrolled
        layer, or None. `drop` is what every layer applies to its branches' outputs, `engram_drop` what
        each memory's output takes before it joins the stream (model/dropout.py).

        `keys` {insertion layer: engram keys of the byte positions} (the last positions of e, after
        `slots` memory slots); in the first iteration each memory's output joins the input of its
        block layer. `conv` {insertion layer: conv tail} continues the memories' convs (None: from the
        sequence start). Auxiliary terms: each layer term averaged over the layer applications run,
        MoR's `mor_router` over the routed iterations. Returns a Trunk.
        """
        stream = Stream(e, self.attn_res)
        out = Trunk(h=e, caches=[], aux={}, engram=None, tails={}, iterations=0)
        router_bce = []
        for r in range(plan.depth):
            with torch.set_grad_enabled(torch.is_grad_enabled() and plan.records_grad(r)):
                bce = self._iteration(
                    r, stream, caches, plan, out, keys, conv, slots, step, want_cache, drop, engram_drop
                )
            router_bce += [] if bce is None else [bce]
            out.iterations = r + 1
            if plan.exit_after is not None and r + 1 < plan.depth and plan.exit_after(stream.input(-1)):
                break
        # A decode step settles the stream (its skipped layers read the hidden state); a forward leaves the
        # last FFN output for the final norm's kernel to add.
        out.h, out.pending = (stream.input(-1), None) if step else stream.output()
        out.aux = {name: value / (out.iterations * len(self.layers)) for name, value in out.aux.items()}
        if router_bce:
            out.aux["mor_router"] = torch.stack(router_bce).mean()
        if step:
            out.caches += self._advance_skipped(out.h, caches[len(out.caches) :])
        return out

    def _iteration(self, r, stream, caches, plan, out, keys, conv, slots, step, want_cache, drop, engram_drop):
        """Loop iteration r over the block's layers: updates `stream` and `out` (caches, summed layer
        terms, engram stats and tails); returns MoR's BCE term of this iteration (None when not routed)."""
        gate, bce = None, None
        if r:
            entering = stream.settle() if self.router is not None else None
            stream.reinject()
            if self.router is not None:
                taken, gate, bce = self.router(r, entering, plan.causal)
        for j, layer in enumerate(self.layers):
            if keys is not None and r == 0 and j in keys:
                delta, read, out.tails[j] = self._memory(j, stream.input(j), keys[j], (conv or {}).get(j), slots)
                out.engram = read if out.engram is None else out.engram + read
                stream.join(engram_drop(delta))
            cache = None if caches is None else caches[r * len(self.layers) + j]
            x, pending = stream.layer_input(j)
            branches, aux, cache = layer(x, cache, pending=pending, step=step, want_cache=want_cache, drop=drop)
            stream.add_layer(branches, gate)
            out.caches.append(cache)
            for name, value in aux.items():
                out.aux[name] = out.aux.get(name, 0.0) + value
        if gate is not None:  # MoR: a position not taken leaves the iteration as it entered it
            stream.x = torch.where(taken.unsqueeze(-1), stream.x, entering)
        return bce

    def _advance_skipped(self, h, skipped: list) -> list:
        """Decode exit: every skipped (iteration, layer) entry still takes in this position, with the
        exited hidden state h (what the head read) as its mixer's input, as CALM copies the exited
        state to the skipped layers; the mixer's output is dropped and the FFN, stateless, not run.
        `skipped` starts at an iteration boundary, so entry i belongs to block layer i mod layers."""
        return [self.layers[i % len(self.layers)].advance_state(h, cache) for i, cache in enumerate(skipped)]

    def _memory(self, j, h, keys, conv_tail, slots):
        """The engram memory of block layer j on its input h: (what it adds, stats, its conv tail)."""
        delta, stats, conv_tail = self.engram[str(j)](h[..., slots:, :] if slots else h, keys, conv_tail)
        if slots:  # memory slots have no bytes, so no n-grams: nothing is added there
            delta = torch.cat([delta.new_zeros(*delta.shape[:-2], slots, delta.shape[-1]), delta], -2)
        return delta, stats, conv_tail

    def memories(self) -> list[tuple[int, Engram]]:
        """(insertion layer, its engram memory), ascending; none when the arm is off."""
        return [] if self.engram is None else [(int(j), m) for j, m in self.engram.items()]

    def _engram_keys(self, input_ids, cache, want_window):
        """Each memory's keys of input_ids ({insertion layer: [B, T, arms]}) and the byte window after
        them (None when neither wanted nor continued), or (None, None) when the arm is off. A sequence
        continued from `cache` hashes across the seam."""
        memories = self.memories()
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

    def _head(self, h, pending=None):
        """(logits, the hidden state) of h plus `pending`, a branch output not yet added: the final norm
        takes it as a fused input and adds it in its kernel (RMSNorm.add_and_norm)."""
        if pending is None:
            normed = self.final_norm(h)
        else:
            normed, h = self.final_norm.add_and_norm(pending, h)
        weight = self.embed.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(normed, weight.to(normed.dtype)), h

    def forward(
        self,
        input_ids: torch.Tensor,
        targets: torch.Tensor | None = None,
        *,
        cache: ModelCache | None = None,
        return_cache: bool = False,
        use_memory: bool = True,
        depth: int | None = None,
        grad_iterations: int = 0,
        jepa_starts: torch.Tensor | None = None,
        dropout_gen: torch.Generator | None = None,
    ) -> Output:
        """input_ids [B,T] int64; targets [B,T] (the next byte of each input) or None.

        `cache` continues a sequence (prefill then decode); the memory slots are prepended only when
        a sequence starts (cache None). `depth` runs fewer loop iterations than the config's (training
        with --rand-depth; no cache then); `grad_iterations` N > 0 records gradients through the last N
        iterations only. With MoR, a model in training mode routes by top-k over the sequence, one in
        eval mode by the causal rule (model/loop.py).

        Auxiliary objectives, in `aux` by name: `dspark` (draft head on) in every forward over a whole
        sequence (no cache); `jepa` (predictor on) when `jepa_starts` [B, spans] are given
        (model/jepa.py draws them), and a forward with targets but without them is refused.

        Dropout and stochastic depth (`dropout`, `drop_path`, `engram_dropout` > 0, training mode only)
        draw their masks from `dropout_gen` (model/dropout.py's `step_generator`), which such a forward
        must be given; eval mode never drops.
        """
        check_byte_dtype(input_ids, "input_ids")
        plan = LoopPlan(self._depth(depth, cache is not None or return_cache), grad_iterations, not self.training)
        drop = dropout_of(self.cfg.dropout, self.training, dropout_gen)
        branch = branch_drop_of(drop, self.cfg.drop_path, self.training, dropout_gen)
        e = self.embed(input_ids)
        slots = 0
        if cache is None and self.memory is not None:
            e = self.memory.prepend(e, use_memory)
            slots = e.shape[1] - input_ids.shape[1]
        e = drop(e)
        keys, window = self._engram_keys(input_ids, cache, return_cache)
        mixers = None if cache is None else cache.mixers
        conv = None if cache is None or cache.engram is None else cache.engram.conv
        engram_drop = dropout_of(self.cfg.engram_dropout, self.training, dropout_gen)
        trunk = self.trunk(
            e,
            mixers,
            plan,
            keys=keys,
            conv=conv,
            slots=slots,
            want_cache=return_cache,
            drop=branch,
            engram_drop=engram_drop,
        )
        logits, hidden = self._head(trunk.h[:, slots:], None if trunk.pending is None else trunk.pending[:, slots:])
        out = Output(logits=logits, aux=trunk.aux, engram=trunk.engram)
        if self.draft is not None and cache is None and not return_cache:
            m = self.cfg
            out.aux["dspark"] = dspark_term(
                self.draft, input_ids, hidden, logits, stride=m.dspark_stride, detach=m.dspark_detach
            )
        if self.jepa is not None and (jepa_starts is not None or targets is not None):
            out.aux["jepa"] = jepa_term(self.jepa, hidden, self.final_norm(hidden), jepa_starts, self.cfg.jepa_span)
        if return_cache:
            seen = 0 if cache is None else cache.position
            engram = None if window is None else EngramCache(window, trunk.tails)
            out.cache = ModelCache(trunk.caches, seen + input_ids.shape[1], engram, trunk.iterations, hidden[:, -1])
        if targets is not None:
            check_byte_dtype(targets, "targets")
            out.ce = F.cross_entropy(logits.float().reshape(-1, VOCAB), targets.reshape(-1))
            out.loss = out.ce + self.aux_weights_sum(out.aux)
        return out

    def _depth(self, depth: int | None, cached: bool) -> int:
        """The loop depth of a forward: the config's unless a smaller one is asked for, never with a cache
        (a decode state holds every iteration of the config's depth)."""
        if depth is None:
            return self.cfg.depth
        if not 1 <= depth <= self.cfg.depth:
            raise ValueError(f"depth {depth} is outside [1, {self.cfg.depth}] (the config's depth)")
        if cached and depth != self.cfg.depth:
            raise ValueError(f"a forward with a decode cache runs the config's depth {self.cfg.depth}, not {depth}")
        return depth

    def aux_weights(self) -> dict[str, float]:
        """Each auxiliary term's weight in the loss, by name (0: the term is off)."""
        m = self.cfg
        return {
            "moe_balance": m.moe_balance_weight,
            "mor_router": m.mor_aux_weight,
            "dspark": m.dspark_weight,
            "jepa": m.jepa_weight,
        }

    def aux_weights_sum(self, aux: dict[str, torch.Tensor]) -> torch.Tensor | float:
        weights = self.aux_weights()
        return sum((weights[name] * value for name, value in aux.items()), 0.0)

    @torch.no_grad()
    def new_cache(self, batch_size: int, device: torch.device | str = "cpu") -> ModelCache:
        """An empty decode state; the persistent memory slots (if any) have already been run through."""
        caches = [None] * (self.cfg.depth * len(self.layers))
        memories = self.memories()
        window = memories[0][1].empty_window(batch_size, device) if memories else None
        tails = {}
        if self.memory is not None:
            e = self.memory.slots.to(device).expand(batch_size, -1, -1)
            # No bytes yet, but the slots must take the same path as in a full forward (with AttnRes the
            # engram outputs are sources, zero at the slots).
            keys = {j: torch.empty(batch_size, 0, m.arms, dtype=torch.int64, device=device) for j, m in memories}
            trunk = self.trunk(e, None, LoopPlan(self.cfg.depth), keys=keys or None, slots=e.shape[1], want_cache=True)
            caches, tails = trunk.caches, trunk.tails
        return ModelCache(caches, 0, None if window is None else EngramCache(window, tails))

    @torch.no_grad()
    def step(
        self, byte: torch.Tensor, cache: ModelCache, *, max_iter: int | None = None, exit_threshold: float = 1.0
    ) -> tuple[torch.Tensor, ModelCache]:
        """One position: byte [B] int64 -> (logits [B, 256], cache).

        `max_iter` caps the loop iterations (default: the depth). CALM-lite: with `exit_threshold` P < 1
        the loop stops after the first iteration whose head is confident, top-1 probability ≥ P in every
        row; 1.0 never exits. The iterations not run still advance their mixer states
        (`_advance_skipped`); the returned cache's `iterations` says how many ran.
        """
        check_byte_dtype(byte, "byte")
        max_iter = self.cfg.depth if max_iter is None else max_iter
        check_exit(self.cfg.depth, max_iter, exit_threshold)
        exit_after = partial(self._confident, exit_threshold) if exit_threshold < 1 else None
        engram, keys, conv = cache.engram, None, None
        if engram is not None:
            keys, conv = {}, engram.conv
            for j, m in self.memories():
                keys[j], window = m.step_keys(engram.window, byte)
        plan = LoopPlan(max_iter, exit_after=exit_after)
        trunk = self.trunk(self.embed(byte), cache.mixers, plan, keys=keys, conv=conv, step=True)
        if engram is not None:
            engram = EngramCache(window, trunk.tails)
        position = cache.position + 1
        logits, hidden = self._head(trunk.h)
        return logits, ModelCache(trunk.caches, position, engram, trunk.iterations, hidden)

    def _confident(self, threshold: float, h: torch.Tensor) -> bool:
        """CALM-lite's exit test on the hidden state h [B,d]: every row's top-1 probability ≥ threshold
        (the batch exits together, as in t5x's CALM)."""
        return bool((top1_probability(self._head(h)[0]) >= threshold).all())

    # ---- checkpoint parts: the engram tables travel in their own file, stamped with their keys ----

    def engram_fingerprint(self) -> str | None:
        """sha256 over every memory's key fingerprint with its layer: how all the tables are addressed."""
        if self.engram is None:
            return None
        text = " ".join(f"layer={j}:{m.fingerprint()}" for j, m in self.memories())
        return hashlib.sha256(f"engram-memories-v1 {text}".encode()).hexdigest()

    def checkpoint_parts(self, state: dict | None = None) -> tuple[dict, dict, dict]:
        """(model tensors, {ENGRAM_FILE: every memory's table} or {}, JSON stamp) for checkpoint.save, of
        `state` (default: this model's state_dict; a sharded model passes its gathered whole state).

        The tables keep their parameter names (`engram.<layer>.table.weight`), so one file holds all.
        """
        state = self.state_dict() if state is None else state
        prefixes = tuple(f"engram.{j}.table." for j, _ in self.memories())
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
