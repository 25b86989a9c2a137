"""`validate`: a config's impossible or meaningless values refused, naming the field and what it allows;
each field's range from its metadata, then the rules between fields (dormouse/config.py holds the fields).
"""

import dataclasses
import math
from dataclasses import fields

from dormouse.config import (
    SAFE_GATE_BOUNDS,
    SECTIONS,
    Config,
    ModelConfig,
    TrainConfig,
    comma_items,
    graph_blockers,
)
from dormouse.errors import ConfigError


def validate(cfg: Config) -> None:
    """Refuse impossible or meaningless values, naming the field and the allowed range."""
    for name, cls in SECTIONS.items():
        section = getattr(cfg, name)
        for f in fields(cls):
            _check_range(f, getattr(section, f.name))
    m, t = cfg.model, cfg.train
    if m.head_dim == 0 and m.d_model % m.n_heads:
        raise ConfigError(f"n_heads {m.n_heads} does not divide d_model {m.d_model} (or set head_dim)")
    _check_engram_layers(m)
    _check_attention_layers(m)
    if m.kda_safe_gate and not SAFE_GATE_BOUNDS[0] <= m.gate_lower_bound < SAFE_GATE_BOUNDS[1]:
        raise ConfigError(
            f"kda_safe_gate needs gate_lower_bound in [{SAFE_GATE_BOUNDS[0]}, {SAFE_GATE_BOUNDS[1]}) (the exponent "
            f"range of fla's safe_gate kernels); got {m.gate_lower_bound}: pass --no-kda-safe-gate, or a bound in range"
        )
    orders = m.engram_orders.split(",")
    if not all(o.strip().isdigit() and 1 <= int(o) <= 16 for o in orders) or len(set(orders)) != len(orders):
        raise ConfigError(f"engram_orders {m.engram_orders!r}: distinct integers in 1..16, comma-separated")
    if m.experts_top_k > m.n_experts:
        raise ConfigError(f"experts_top_k {m.experts_top_k} exceeds n_experts {m.n_experts}")
    if m.experts_dense and m.n_experts == 1:
        raise ConfigError("experts_dense needs n_experts > 1 (--n-experts): one expert is the plain SwiGLU")
    if m.engram_dropout and not m.engram:
        raise ConfigError(
            f"engram_dropout {m.engram_dropout} with engram off (--engram-dropout with --no-engram): "
            "there is no memory output to drop"
        )
    if (m.persistent_memory == "disabled") != (m.memory_slots == 0):
        raise ConfigError(
            f"persistent_memory {m.persistent_memory} with memory_slots {m.memory_slots}: "
            "slots must be 0 exactly when the memory is disabled"
        )
    _check_adaptive_depth(m, t)
    _check_aux_terms(m, t)
    _check_engram_shard(m, t)
    _check_cuda_graph(m, t)
    if t.eval_bytes and t.eval_bytes < t.seq_len:
        raise ConfigError(
            f"eval_bytes {t.eval_bytes} is shorter than one sequence (seq_len {t.seq_len}); use 0 or ≥ seq_len"
        )
    if t.byte_noise_source != "uniform" and not t.byte_noise:
        raise ConfigError(f"byte_noise_source {t.byte_noise_source} acts only with byte_noise > 0")
    if t.opt == "adamw" and t.sinkhorn_lr_scale != 1.0:
        raise ConfigError(
            f"sinkhorn_lr_scale {t.sinkhorn_lr_scale:g} acts only with --opt sinkhorn (AdamW has no Sinkhorn)"
        )


def _check_engram_layers(m: ModelConfig) -> None:
    items = comma_items(m.engram_layers)
    layers = [int(j) for j in items if j.isdigit()]
    if len(layers) != len(items) or len(set(layers)) != len(layers) or any(j >= m.block_layers for j in layers):
        raise ConfigError(
            f"engram_layers {m.engram_layers!r}: distinct block layers in 0..{m.block_layers - 1}, comma-separated"
        )
    if m.engram and not layers:
        raise ConfigError("engram_layers is empty while engram is on: name a block layer, or pass --no-engram")


def _check_adaptive_depth(m: ModelConfig, t: TrainConfig) -> None:
    """--rand-depth and --mor each change the loop; together, or where they cannot act, they are refused."""
    if t.rand_depth and m.mor:
        raise ConfigError(
            "rand_depth and mor cannot be combined (--rand-depth with --mor): MoR's routers are per iteration "
            "of a fixed depth"
        )
    if t.rand_depth and not t.rand_depth_min < m.depth:
        raise ConfigError(
            f"rand_depth_min {t.rand_depth_min} must be below depth {m.depth}: --rand-depth needs two depths"
        )
    if (t.rand_depth_min != 1 or t.rand_depth_bptt) and not t.rand_depth:
        raise ConfigError("rand_depth_min and rand_depth_bptt act only with --rand-depth")
    if t.rand_depth_bptt > m.depth:
        raise ConfigError(f"rand_depth_bptt {t.rand_depth_bptt} exceeds depth {m.depth}")
    if m.mor and m.depth < 2:
        raise ConfigError("mor routes the iterations after the first: it needs depth >= 2")
    if m.mor and m.attn_res:
        raise ConfigError(
            "mor with attn_res is not built: AttnRes mixes every layer output, so a position that skips an "
            "iteration could not leave it unchanged"
        )


def _check_attention_layers(m: ModelConfig) -> None:
    if not m.attention_layers:
        return
    where = f"attention_layers {m.attention_layers!r}"
    if m.mixer != "kda":
        raise ConfigError(f"{where} with mixer {m.mixer}: every layer is attention already")
    items = [i.strip() for i in m.attention_layers.split(",")]
    if not all(i.isdigit() and int(i) < m.block_layers for i in items) or len(set(items)) != len(items):
        raise ConfigError(f"{where}: distinct layer indices in 0..{m.block_layers - 1} (block_layers), comma-separated")
    if len(items) == m.block_layers:
        raise ConfigError(f"{where} names every block layer: use --mixer attention")


def _check_engram_shard(m: ModelConfig, t: TrainConfig) -> None:
    """--engram-shard partitions the tables over DDP's ranks; without tables, or under FSDP, it is refused."""
    if t.engram_shard and not m.engram:
        raise ConfigError(
            "engram_shard with engram off (--engram-shard with --no-engram): there are no tables to shard"
        )
    if t.engram_shard and t.parallel == "fsdp":
        raise ConfigError("engram_shard is built for parallel ddp, not fsdp (--engram-shard with --parallel fsdp)")
    # The average is kept per parameter as the model holds it: whole on one process or DDP's replicas.
    if t.ema_decay and (t.engram_shard or t.parallel == "fsdp"):
        raise ConfigError(
            "ema_decay averages whole parameters: not built with sharded ones (--engram-shard or --parallel fsdp)"
        )


def _check_cuda_graph(m: ModelConfig, t: TrainConfig) -> None:
    """An explicit --cuda-graph with an arm a graph cannot replay is refused (auto leaves the graph off)."""
    if not t.cuda_graph:
        return
    for name, why in graph_blockers(m, t).items():
        raise ConfigError(f"cuda_graph with {name} is not built: {why}; a captured graph replays fixed shapes")


def _check_aux_terms(m: ModelConfig, t: TrainConfig) -> None:
    """A training sequence too short for DSpark's first window or JEPA's spans would train a term of
    exactly zero: refused."""
    if m.dspark_weight and t.seq_len < m.dspark_k + 1 + m.dspark_stride:
        raise ConfigError(
            f"seq_len {t.seq_len} is below dspark_k + 1 + dspark_stride = {m.dspark_k + 1 + m.dspark_stride}: "
            "no DSpark window fits (docs/glossary.md)"
        )
    if m.jepa_weight and t.seq_len < m.jepa_span + m.jepa_spans:
        raise ConfigError(
            f"seq_len {t.seq_len} is below jepa_span + jepa_spans = {m.jepa_span + m.jepa_spans}: "
            "the JEPA spans do not fit"
        )


def _check_range(f: dataclasses.Field, value) -> None:
    meta = f.metadata
    if meta["choices"] is not None and value not in meta["choices"]:
        raise ConfigError(f"{f.name} {value!r} is not allowed; choose one of {list(meta['choices'])}")
    lo, hi = meta["lo"], meta["hi"]
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{f.name} {value} is not finite")
    below = lo is not None and (value < lo or (meta["lo_open"] and value == lo))
    above = hi is not None and (value > hi or (meta["hi_open"] and value == hi))
    if below or above:
        start, end = "(" if meta["lo_open"] else "[", ")" if meta["hi_open"] else "]"
        raise ConfigError(f"{f.name} {value} is out of range; allowed {start}{lo}, {'inf' if hi is None else hi}{end}")
