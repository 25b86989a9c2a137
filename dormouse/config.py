"""Configuration as data: ModelConfig and TrainConfig, presets, TOML files, CLI flags.

Precedence: preset < config file < CLI flags. `validate()` refuses impossible values with the field
and its allowed range; `resolve()` turns intent into one concrete config (every derived value filled,
contradictory arms refused). The resolved config is what a run directory records.

Every field is a CLI flag with dashes (`n_experts` → `--n-experts`; booleans `--attn-res/--no-attn-res`).
Each field's metadata holds its help text and its allowed range, so flags, validation and docs
cannot disagree.
"""

import argparse
import dataclasses
import json
import math
import os
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path

from dormouse.errors import ConfigError

# fla's safe_gate kernels take exp of up to chunk/2 + 1 summed gates in fp32: fla bounds a gate to [-5, 0)
# for them (fla/ops/kda/chunk.py).
SAFE_GATE_BOUNDS = (-5.0, 0.0)

BYTE_NOISE_SOURCES = ("uniform", "unigram")  # what replaces a noised byte (data/sampler.py)


def _f(default, help: str, *, lo=None, hi=None, choices=None, lo_open=False, hi_open=False):
    """A config field: default, help text and allowed range (inclusive unless lo_open / hi_open)."""
    meta = {"help": help, "lo": lo, "hi": hi, "choices": choices, "lo_open": lo_open, "hi_open": hi_open}
    return field(default=default, metadata=meta)


@dataclass
class ModelConfig:
    d_model: int = _f(128, "model width", lo=8)
    n_heads: int = _f(4, "mixer heads", lo=1)
    head_dim: int = _f(0, "per-head key/value width; 0 = d_model / n_heads", lo=0, hi=256)
    block_layers: int = _f(2, "layers (mixer + FFN) in the looped block", lo=1)
    depth: int = _f(2, "times the looped block is applied", lo=1)
    ffn_hidden: int = _f(0, "SwiGLU hidden width; 0 = 8/3 d_model rounded up to 64", lo=0)
    mixer: str = _f("kda", "token mixer (--no-kda selects attention)", choices=("kda", "attention"))
    attention_layers: str = _f(
        "",
        "block layers (0-based, comma-separated) whose mixer is softmax attention while the others run KDA "
        "(a hybrid, as Kimi Linear's 3:1); '' = none",
    )
    attn_qk_norm: bool = _f(
        True,
        "RMSNorm on each attention head's queries and keys before RoPE (as KDA L2-normalises its own): without "
        "it the Sinkhorn optimizer's fixed-size updates grow the attention logits and the arm learns slowly",
    )
    kda_backend: str = _f(
        "auto",
        "KDA implementation; auto = fla on CUDA, chunked on CPU",
        choices=("auto", "fla", "chunked", "recurrent"),
    )
    kda_chunk_size: int = _f(64, "chunk length of the chunked KDA form", choices=(16, 32, 64, 128))
    kda_safe_gate: bool = _f(
        True,
        "fla's chunk_kda with safe_gate: tensor-core intra-chunk kernels for gates bounded by gate_lower_bound, "
        "which must lie in [-5, 0) (another rounding; fla backend only, the chunked and recurrent forms are "
        "exact either way)",
    )
    kda_recompute: bool = _f(
        False,
        "fla's chunk_kda backward recomputes the forward's intermediates (--kda-recompute: less memory) or "
        "keeps them from the forward (the default: fla's disable_recompute; `small` B 64 on the H200 ~2 ms a "
        "step faster for 1.8 GiB more, docs/performance.md; fla backend only)",
    )
    kda_prep_in_kernel: bool = _f(
        True,
        "fla's chunk_kda applies q/k's L2 norm, the decay gate and beta's sigmoid itself (fewer kernels around "
        "each call, another rounding; fla backend only)",
    )
    short_conv: bool = _f(True, "short causal depthwise conv + SiLU on KDA q/k/v")
    conv_size: int = _f(4, "kernel of the short conv", lo=2, hi=8)
    gate_lower_bound: float = _f(-5.0, "lower bound of the KDA per-step log-decay", lo=-20.0, hi=0.0, lo_open=False)
    norm_eps: float = _f(1e-6, "RMSNorm epsilon", lo=0.0, hi=1e-2, lo_open=True)
    norm_backend: str = _f(
        "auto",
        "RMSNorm path (and the engram gate's, its two norms and their product); auto = fused kernels on CUDA "
        "(fla's; dormouse's for the gate), plain torch on CPU",
        choices=("auto", "fused", "plain"),
    )
    conv_backend: str = _f(
        "auto",
        "KDA's short conv (+ SiLU) path; auto = dormouse's fused Triton kernels on CUDA (conv_size <= 4), "
        "torch's conv1d on CPU; a decode step, which carries the conv's state, runs torch's",
        choices=("auto", "fused", "plain"),
    )
    swiglu_backend: str = _f(
        "auto",
        "the FFN's SwiGLU activation path; auto = fla's fused kernels on CUDA (fp32 inside, one rounding), "
        "torch's silu and mul on CPU",
        choices=("auto", "fused", "plain"),
    )
    n_experts: int = _f(1, "FFN experts; 1 = the dense SwiGLU, >1 = top-k mixture of experts", lo=1, hi=64)
    experts_top_k: int = _f(1, "experts each byte is routed to (≤ n_experts)", lo=1)
    experts_dense: bool = _f(
        False,
        "run every expert on every byte and weigh the outputs by the routing (0 where not chosen): the same "
        "function at n_experts/top_k times the FFN FLOPs, in fixed shapes (what --cuda-graph needs)",
    )
    moe_balance_weight: float = _f(0.01, "weight of the experts' load-balancing term in the loss", lo=0.0)
    attn_res: bool = _f(False, "layer inputs are a learned softmax mix of earlier layer outputs (AttnRes)")
    persistent_memory: str = _f(
        "disabled",
        "learned slots every sequence sees first (docs/glossary.md)",
        choices=("disabled", "enabled", "size-match", "enforced"),
    )
    memory_slots: int = _f(0, "persistent memory slots (size-match: the minimum, rounded up)", lo=0, hi=4096)
    tie_embeddings: bool = _f(True, "LM head shares the byte embedding matrix")
    engram: bool = _f(True, "Engram hashed byte n-gram memory (--no-engram turns it off)")
    engram_orders: str = _f("2,3,4", "n-gram orders of the engram arms, comma-separated (each in 1..16)")
    engram_heads: int = _f(2, "independent hash functions per order (arms = orders × heads)", lo=1, hi=16)
    engram_rows: int = _f(16384, "table rows per arm", lo=1, hi=2**31)
    engram_dim: int = _f(32, "width of one arm's table row", lo=1, hi=1024)
    engram_layers: str = _f(
        "0", "block layers whose input (first loop iteration) gets a memory of its own, comma-separated"
    )
    engram_conv: bool = _f(True, "short causal conv after the engram gate (kernel 4, dilation max order)")
    mor: bool = _f(
        False, "Mixture-of-Recursions: a router picks the positions that take each iteration after the first"
    )
    mor_capacity: float = _f(
        0.5,
        "MoR: fraction of each sequence's positions that take an iteration (training top-k)",
        lo=0.0,
        hi=1.0,
        lo_open=True,
    )
    mor_aux_weight: float = _f(0.1, "weight of MoR's router BCE term (mor_router) in the loss", lo=0.0)
    dspark_weight: float = _f(0.0, "weight of the DSpark draft-head term (dspark) in the loss; 0 = off", lo=0.0)
    dspark_k: int = _f(4, "DSpark: bytes the draft head predicts ahead of each anchor", lo=1, hi=64)
    dspark_stride: int = _f(16, "DSpark: anchor spacing in byte positions (anchors 0, stride, 2·stride, …)", lo=1)
    dspark_detach: bool = _f(True, "DSpark: the draft term does not train the trunk (when off, it does)")
    jepa_weight: float = _f(0.0, "weight of the JEPA latent-prediction term (jepa) in the loss; 0 = off", lo=0.0)
    jepa_span: int = _f(8, "JEPA: bytes per masked span", lo=1, hi=1024)
    jepa_spans: int = _f(4, "JEPA: masked spans per sequence", lo=1, hi=256)
    dropout: float = _f(
        0.0,
        "dropout probability on the embedding and each mixer/FFN output, training only, masks from the "
        "(seed, step) dropout stream; 0 = off",
        lo=0.0,
        hi=1.0,
        hi_open=True,
    )
    drop_path: float = _f(
        0.0,
        "stochastic depth: probability that a mixer or FFN output is dropped for a whole sequence, per layer "
        "application, training only, masks from the (seed, step) dropout stream; 0 = off",
        lo=0.0,
        hi=1.0,
        hi_open=True,
    )
    engram_dropout: float = _f(
        0.0,
        "dropout probability on each engram memory's output before it joins the residual stream (dropout "
        "does not reach it), training only, masks from the (seed, step) dropout stream; 0 = off",
        lo=0.0,
        hi=1.0,
        hi_open=True,
    )


@dataclass
class TrainConfig:
    seq_len: int = _f(256, "bytes per training sequence", lo=1)
    batch_size: int = _f(8, "sequences per step", lo=1)
    steps: int = _f(1000, "training steps (ignored when --minutes is set)", lo=1)
    minutes: float = _f(0.0, "train for this wall time instead of --steps; 0 = off", lo=0.0)
    lr: float = _f(3e-3, "peak learning rate (scales every optimizer group)", lo=0.0)
    opt: str = _f("default", "default = routing policy; adamw = everything on AdamW", choices=("default", "adamw"))
    # A Sinkhorn update has entry RMS exactly 1; AdamW's is 1 for a gradient consistent from step to step and
    # ~0.23 for noise (tests/test_optim.py pins both): 1.0 matches the first regime, and in a noisy one the
    # matrices step up to ~4x what AdamW would at the same lr. SinkGD's paper runs 0.05 x Adam's lr.
    sinkhorn_lr_scale: float = _f(
        1.0, "lr multiplier of the matrices under the default routing's NesterovSinkhorn (lr x this)", lo=0.0
    )
    warmup_steps: int = _f(100, "linear warm-up steps", lo=0)
    lr_decay: str = _f("cosine", "decay after warm-up", choices=("cosine", "linear", "constant"))
    lr_floor: float = _f(0.1, "final lr as a fraction of the peak", lo=0.0, hi=1.0)
    weight_decay: float = _f(0.1, "AdamW weight decay on matrices (never on gains and biases)", lo=0.0)
    grad_clip: float = _f(1.0, "global gradient-norm clip; 0 = off", lo=0.0)
    byte_noise: float = _f(
        0.0,
        "probability that a training input byte is replaced by a random byte (byte_noise_source; the targets "
        "stay the text's; draws from the (seed, step) byte_noise stream); a regulariser, 0 = off",
        lo=0.0,
        hi=1.0,
        hi_open=True,
    )
    byte_noise_source: str = _f(
        "uniform",
        "what replaces a byte_noise byte: uniform over the 256 values, or unigram = the training split's own "
        "byte frequencies (a replacement that looks like text)",
        choices=BYTE_NOISE_SOURCES,
    )
    ema_decay: float = _f(
        0.0,
        "evals score an exponential moving average of the weights, decay min(ema_decay, (1 + s) / (10 + s)) "
        "after update s, saved in each checkpoint and loaded by eval and generate (train/ema.py); 0 = off",
        lo=0.0,
        hi=1.0,
        hi_open=True,
    )
    seed: int = _f(0, "seed of every random stream (rng.py)", lo=0)
    dtype: str = _f(
        "fp32",
        "compute dtype: fp32, tf32 (fp32 on TF32 tensor cores), bf16 (autocast); docs/glossary.md",
        choices=("fp32", "tf32", "bf16"),
    )
    device: str = _f("auto", "auto = cuda when available, else cpu", choices=("auto", "cpu", "cuda"))
    eval_every: int = _f(200, "steps between held-out evals", lo=1)
    eval_bytes: int = _f(0, "held-out bytes scored per eval; 0 = the whole held-out split", lo=0)
    ckpt_every: int = _f(500, "steps between checkpoints", lo=1)
    keep_last: int = _f(3, "checkpoints kept besides best", lo=1)
    rand_depth: bool = _f(False, "sample each training step's loop depth, uniform over [rand_depth_min, depth]")
    rand_depth_min: int = _f(1, "smallest depth --rand-depth samples", lo=1)
    rand_depth_bptt: int = _f(0, "--rand-depth: only the last N iterations get gradients; 0 = all", lo=0)
    parallel: str = _f(
        "auto",
        "data parallelism: auto = ddp under torchrun with WORLD_SIZE > 1, else none; fsdp = FSDP2 (sharded)",
        choices=("auto", "none", "ddp", "fsdp"),
    )
    dist_timeout: float = _f(
        600.0,
        "seconds a collective waits for the other ranks before the run stops with an error (ddp, fsdp)",
        lo=0.0,
        lo_open=True,
    )
    cuda_graph: bool = _f(
        False,
        "capture the step's forward and backward, then its clip and matrix update, as CUDA graphs and replay "
        "them (CUDA, one process, one graph per loop depth, no MoR or experts; dormouse/train/graphed.py)",
    )
    graph_update: bool = _f(
        True,
        "with --cuda-graph, the clip and NesterovSinkhorn's update are a second graph (train/graphed_update.py); "
        "--no-graph-update runs the update as the eager step does (the same bits), to measure what the graph gains",
    )
    engram_shard: bool = _f(
        False,
        "engram table rows partitioned over the ranks (row i on rank i mod W), looked up by all-to-all "
        "(--parallel ddp; a no-op with one process; docs/distributed.md)",
    )


PRESETS: dict[str, dict[str, dict]] = {
    "nano": {
        "model": {"d_model": 128, "n_heads": 4, "block_layers": 2, "depth": 2},
        "train": {"seq_len": 256, "batch_size": 8},
    },
    "small": {
        "model": {
            "d_model": 512,
            "n_heads": 8,
            "head_dim": 64,
            "block_layers": 4,
            "depth": 2,
            "ffn_hidden": 1536,
            "engram_rows": 65536,
            "engram_dim": 64,
        },
        "train": {"seq_len": 512, "batch_size": 10},
    },
    "base": {
        "model": {
            "d_model": 768,
            "n_heads": 12,
            "block_layers": 6,
            "depth": 2,
            "engram_rows": 262144,
            "engram_dim": 64,
        },
        "train": {"seq_len": 1024, "batch_size": 16},
    },
}
DEFAULT_PRESET = "nano"


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    preset: str = DEFAULT_PRESET

    def to_dict(self) -> dict:
        return {"preset": self.preset, "model": dataclasses.asdict(self.model), "train": dataclasses.asdict(self.train)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict) -> "Config":
        return build(preset=d.get("preset", DEFAULT_PRESET), overrides=_sections(d, "config dict"))


SECTIONS = {"model": ModelConfig, "train": TrainConfig}


def _sections(d: dict, origin: str) -> dict[str, dict]:
    unknown = set(d) - set(SECTIONS) - {"preset"}
    if unknown:
        raise ConfigError(f"{origin}: unknown top-level key(s) {sorted(unknown)}; allowed: preset, model, train")
    out = {}
    for name, cls in SECTIONS.items():
        section = d.get(name, {})
        if not isinstance(section, dict):
            raise ConfigError(f"{origin}: [{name}] must be a table")
        known = {f.name for f in fields(cls)}
        bad = set(section) - known
        if bad:
            raise ConfigError(f"{origin}: unknown {name} field(s) {sorted(bad)}; known: {sorted(known)}")
        out[name] = dict(section)
    return out


def load_toml(path: str | Path) -> dict:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read config file {p}: {e.strerror}") from e
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {p} is not valid TOML: {e}") from e


def build(preset: str = DEFAULT_PRESET, overrides: dict[str, dict] | None = None) -> Config:
    """Preset, then `overrides` ({"model": {...}, "train": {...}}) on top; type-checked, not yet validated."""
    if preset not in PRESETS:
        raise ConfigError(f"unknown preset {preset!r}; choose one of {sorted(PRESETS)}")
    cfg = Config(preset=preset)
    for layer in (PRESETS[preset], overrides or {}):
        for name, values in layer.items():
            section = getattr(cfg, name)
            for key, value in values.items():
                setattr(section, key, _coerce(SECTIONS[name], key, value))
    return cfg


def _coerce(cls, key: str, value):
    ftype = {f.name: f.type for f in fields(cls)}[key]
    ok = {
        bool: lambda v: isinstance(v, bool),
        int: lambda v: isinstance(v, int) and not isinstance(v, bool),
        float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        str: lambda v: isinstance(v, str),
    }[ftype]
    if not ok(value):
        raise ConfigError(f"{key}: expected {ftype.__name__}, got {value!r}")
    return float(value) if ftype is float else value


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
            f"sinkhorn_lr_scale {t.sinkhorn_lr_scale:g} acts only with opt default (--opt adamw has no Sinkhorn)"
        )


def engram_layers(m: ModelConfig) -> tuple[int, ...]:
    """The block layers that get an engram memory, ascending (of a validated config)."""
    return tuple(sorted(int(j) for j in _items(m.engram_layers)))


def _items(text: str) -> list[str]:
    """The comma-separated items of `text`, stripped; none for a blank text."""
    return [j.strip() for j in text.split(",")] if text.strip() else []


def _check_engram_layers(m: ModelConfig) -> None:
    items = _items(m.engram_layers)
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


def layer_mixers(m: ModelConfig) -> list[str]:
    """The mixer of each block layer: `mixer`, except the `attention_layers` of a KDA model."""
    chosen = {int(i) for i in m.attention_layers.split(",")} if m.attention_layers else set()
    return ["attention" if m.mixer == "attention" or i in chosen else "kda" for i in range(m.block_layers)]


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


def data_shaped_arms(m: ModelConfig) -> dict[str, str]:
    """{field: why} of the model's arms whose tensor shapes follow the data: a CUDA graph replays fixed
    shapes, so neither a captured training step (--cuda-graph) nor a captured decode step can hold them."""
    arms = {
        "mor": (m.mor, "MoR's routed positions change the shapes per step"),
        "n_experts": (
            m.n_experts > 1 and not m.experts_dense,
            "the sparse experts' routing sizes their batches per step (--experts-dense runs every expert on "
            "every byte)",
        ),
    }
    return {name: why for name, (on, why) in arms.items() if on}


def _check_cuda_graph(m: ModelConfig, t: TrainConfig) -> None:
    """A captured step replays the same kernels on the same shapes: what changes them per step is refused."""
    if not t.cuda_graph:
        return
    changing = data_shaped_arms(m)
    if t.engram_shard:
        changing["engram_shard"] = "sharded lookups exchange data-dependent sizes"
    for name, why in changing.items():
        raise ConfigError(f"cuda_graph with {name} is not built: {why}, a captured graph replays fixed ones")
    if m.engram and t.rand_depth and t.rand_depth_min <= t.rand_depth_bptt < m.depth:
        # The memories join the first iteration only: a step deeper than rand_depth_bptt trains none of
        # their weights, a shallower one does, and the captured update reads one fixed set of gradients.
        raise ConfigError(
            f"cuda_graph with engram and rand_depth_bptt {t.rand_depth_bptt} < depth {m.depth} is not built: "
            "the engram gets gradients at some sampled depths and none at others"
        )


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


def resolve(cfg: Config, *, cuda_available: bool | None = None) -> Config:
    """One concrete config: derived sizes filled in, `auto` choices decided, contradictions refused."""
    validate(cfg)
    out = Config(model=dataclasses.replace(cfg.model), train=dataclasses.replace(cfg.train), preset=cfg.preset)
    m, t = out.model, out.train
    if m.head_dim == 0:
        m.head_dim = m.d_model // m.n_heads
    if m.ffn_hidden == 0:
        m.ffn_hidden = 64 * math.ceil(8 * m.d_model / 3 / 64)
    if cuda_available is None:
        import torch

        cuda_available = torch.cuda.is_available()
    t.parallel = resolve_parallel(t.parallel)
    if t.engram_shard and t.parallel == "none":  # a fresh run; a resumed one may go on alone, whole
        raise ConfigError(
            "engram_shard needs parallel ddp under torchrun (--engram-shard with --parallel none): one process "
            "holds every row; launch with `torchrun --nproc-per-node N`"
        )
    if t.device == "auto":
        t.device = "cuda" if cuda_available else "cpu"
    elif t.device == "cuda" and not cuda_available:
        raise ConfigError("device cuda was asked for but torch sees no CUDA device; use --device cpu")
    if t.cuda_graph and (t.device != "cuda" or t.parallel != "none"):
        raise ConfigError(f"cuda_graph needs one process on CUDA; this run is device {t.device}, parallel {t.parallel}")
    if t.dtype in ("bf16", "tf32") and t.device == "cpu":
        raise ConfigError(f"dtype {t.dtype} is for CUDA; on cpu use --dtype fp32")
    if m.persistent_memory == "size-match":
        # Round the slots up so that slots + seq_len fill whole KDA chunks.
        m.memory_slots += -(m.memory_slots + t.seq_len) % m.kda_chunk_size
    if m.mixer == "kda":
        from dormouse.model.kda import resolve_kda_backend  # the one policy; it raises through the ledger

        m.kda_backend = resolve_kda_backend(m.kda_backend, t.device)
        if m.short_conv:
            from dormouse.model.short_conv import check_fused_width, resolve_conv_backend  # raise through the ledger

            m.conv_backend = resolve_conv_backend(m.conv_backend, t.device)
            check_fused_width(m.conv_backend, m.conv_size)
    from dormouse.model.norm import resolve_norm_backend  # raises through the ledger
    from dormouse.model.swiglu import resolve_swiglu_backend  # raises through the ledger

    m.norm_backend = resolve_norm_backend(m.norm_backend, t.device)
    m.swiglu_backend = resolve_swiglu_backend(m.swiglu_backend, t.device)
    return out


def resolve_parallel(parallel: str) -> str:
    """`auto` → ddp when torchrun launched several processes (WORLD_SIZE > 1), else none; refuses the
    combinations that cannot run (docs/distributed.md)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if parallel == "auto":
        return "ddp" if world_size > 1 else "none"
    if parallel == "none" and world_size > 1:
        raise ConfigError(
            f"parallel none under torchrun with WORLD_SIZE {world_size}: every rank would train the whole batch "
            "and write the same run directory; use --parallel ddp or fsdp"
        )
    return parallel


# ---- CLI flags ----

SHORT_ARMS = {"no_kda": ("model", "mixer", "attention", "short for --mixer attention")}


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """--preset, --config and one flag per config field (default None: only given flags override)."""
    parser.add_argument(
        "--preset", choices=sorted(PRESETS), default=None, help=f"size preset (default {DEFAULT_PRESET})"
    )
    parser.add_argument("--config", metavar="FILE", default=None, help="TOML file with [model] and [train] tables")
    for section, cls in SECTIONS.items():
        group = parser.add_argument_group(f"{section} config")
        for f in fields(cls):
            flag = "--" + f.name.replace("_", "-")
            meta = f.metadata
            text = f"{meta['help']} (default {f.default})"
            if f.type is bool:
                group.add_argument(
                    flag, dest=f"{section}.{f.name}", action=argparse.BooleanOptionalAction, default=None, help=text
                )
            else:
                group.add_argument(
                    flag,
                    dest=f"{section}.{f.name}",
                    type=f.type,
                    default=None,
                    choices=meta["choices"],
                    metavar=None if meta["choices"] else f.name.upper(),
                    help=text,
                )
    for name, (*_, text) in SHORT_ARMS.items():
        parser.add_argument("--" + name.replace("_", "-"), dest=f"short.{name}", action="store_true", help=text)


def config_from_args(args: argparse.Namespace) -> Config:
    """Preset < --config file < flags, then resolved."""
    file_values = load_toml(args.config) if args.config else {}
    origin = args.config or ""
    overrides = _sections(file_values, origin) if file_values else {"model": {}, "train": {}}
    preset = args.preset or file_values.get("preset", DEFAULT_PRESET)
    for dest, value in vars(args).items():
        if value is None or "." not in dest:
            continue
        section, key = dest.split(".", 1)
        if section == "short":
            if value:
                s, k, v, _ = SHORT_ARMS[key]
                given = getattr(args, f"{s}.{k}")
                if given is not None and given != v:
                    raise ConfigError(f"--{key.replace('_', '-')} contradicts --{k.replace('_', '-')} {given}")
                overrides.setdefault(s, {})[k] = v
        else:
            overrides.setdefault(section, {})[key] = value
    return resolve(build(preset, overrides))


RESUMABLE = {"train.steps", "train.minutes", "train.parallel", "train.dist_timeout", "train.engram_shard"}


def resume_config(saved: Config, args: argparse.Namespace) -> Config:
    """A resumed run keeps its config; only the training length (--steps, --minutes) and how it runs
    (--parallel, --dist-timeout, --engram-shard: the world size may change) may."""
    if args.preset or args.config:
        raise ConfigError("a resumed run keeps its own config: --preset and --config are refused with --resume")
    out = Config(model=dataclasses.replace(saved.model), train=dataclasses.replace(saved.train), preset=saved.preset)
    for dest, value in vars(args).items():
        if "." not in dest or value is None or (value is False and dest not in RESUMABLE):
            continue
        if dest not in RESUMABLE:
            flag = "--" + dest.split(".", 1)[1].replace("_", "-")
            raise ConfigError(
                f"{flag} cannot change on --resume: only --steps, --minutes, --parallel, --dist-timeout and "
                "--engram-shard may"
            )
        section, key = dest.split(".", 1)
        setattr(getattr(out, section), key, value)
    if vars(args).get("train.parallel") is None:
        out.train.parallel = "auto"  # decided by this launch, not the saved one's
    out.train.parallel = resolve_parallel(out.train.parallel)
    validate(out)
    return out
