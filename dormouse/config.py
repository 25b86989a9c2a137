"""Configuration as data: ModelConfig and TrainConfig, presets, TOML files.

Precedence: preset < config file < CLI flags (dormouse/config_flags.py). `validate()`
(dormouse/config_checks.py) refuses impossible values with the field and its allowed range;
`resolve_values()` (dormouse/resolve.py) fills every derived value and decides the `auto` choices, the
kernel backends too. The resolved config is what a run directory records.

Every field belongs to one group (data, model, arms, optimizer, schedule, run, performance, parallel): its
CLI flag sits under that heading of `--help`, and a TOML file sets it in the table of that name. Each field's
metadata holds its help text and allowed range, so flags, validation and docs cannot disagree. The defaults
are the best measured settings (configs/tinyshakespeare.toml names the evidence); presets set sizes only.
"""

import dataclasses
import json
import os
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path

from dormouse.errors import ConfigError

# fla's safe_gate kernels take exp of up to chunk/2 + 1 summed gates in fp32: fla bounds a gate to [-5, 0)
# for them (fla/ops/kda/chunk.py).
SAFE_GATE_BOUNDS = (-5.0, 0.0)

BYTE_NOISE_SOURCES = ("uniform", "unigram")  # what replaces a noised byte (data/sampler.py)
FUSED_CHOICES = ("auto", "fused", "plain")
OPTS = ("adamw", "sinkhorn")  # train/routing.py: sinkhorn puts the matrices on NesterovSinkhorn
STEPS_AUTO = 0  # `--steps auto`: a run fits the steps to its corpus and model (train/budget.py)
GROUPS = ("data", "model", "arms", "optimizer", "schedule", "run", "performance", "parallel")


def _f(default, help: str, group: str, *, lo=None, hi=None, choices=None, lo_open=False, hi_open=False, **kind):
    """A config field: default, help text, flag group and allowed range (inclusive unless lo_open / hi_open).
    kind: advanced=True lists the flag under `--help-all` only; tristate=True is a bool whose None means
    "decided by resolve_values"; auto=True is an int that may be spelled "auto", held as 0 until a run decides."""
    assert group in GROUPS, group
    meta = {"help": help, "group": group, "lo": lo, "hi": hi, "choices": choices, "lo_open": lo_open}
    meta |= {"hi_open": hi_open, "advanced": kind.get("advanced", False), "tristate": kind.get("tristate", False)}
    meta |= {"auto": kind.get("auto", False)}
    return field(default=default, metadata=meta)


@dataclass
class ModelConfig:
    d_model: int = _f(128, "model width", "model", lo=8)
    n_heads: int = _f(4, "mixer heads", "model", lo=1)
    head_dim: int = _f(0, "per-head key/value width; 0 = d_model / n_heads", "model", lo=0, hi=256)
    block_layers: int = _f(2, "layers (mixer + FFN) in the looped block", "model", lo=1)
    depth: int = _f(2, "times the looped block is applied", "model", lo=1)
    ffn_hidden: int = _f(0, "SwiGLU hidden width; 0 = 8/3 d_model rounded up to 64", "model", lo=0)
    mixer: str = _f("kda", "token mixer (--no-kda: attention)", "model", choices=("kda", "attention"))
    tie_embeddings: bool = _f(True, "the LM head shares the byte embedding", "model", advanced=True)
    short_conv: bool = _f(True, "short causal conv + SiLU on KDA's q, k, v", "model", advanced=True)
    conv_size: int = _f(4, "taps of the short conv", "model", lo=2, hi=8, advanced=True)
    kda_chunk_size: int = _f(
        64, "chunk length of KDA's chunked form", "model", choices=(16, 32, 64, 128), advanced=True
    )
    gate_lower_bound: float = _f(
        -5.0, "lower bound of KDA's per-step log-decay", "model", lo=-20.0, hi=0.0, advanced=True
    )
    kda_safe_gate: bool = _f(
        True, "fla's safe-gate kernels (gate_lower_bound in [-5, 0); fla only)", "model", advanced=True
    )
    attn_qk_norm: bool = _f(True, "RMSNorm on attention queries and keys before RoPE", "model", advanced=True)
    norm_eps: float = _f(1e-6, "RMSNorm epsilon", "model", lo=0.0, hi=1e-2, lo_open=True, advanced=True)
    dropout: float = _f(
        0.0, "dropout on the embedding and each mixer/FFN output (training only)", "model", lo=0.0, hi=1.0, hi_open=True
    )
    drop_path: float = _f(
        0.0, "stochastic depth: drop a layer's output for a whole sequence", "model", lo=0.0, hi=1.0, hi_open=True
    )
    engram: bool = _f(False, "Engram hashed n-gram memory", "arms")
    engram_orders: str = _f("2,3,4", "n-gram orders of the engram, comma-separated (1..16)", "arms", advanced=True)
    engram_heads: int = _f(2, "hash functions per order", "arms", lo=1, hi=16, advanced=True)
    engram_rows: int = _f(16384, "table rows per order and head", "arms", lo=1, hi=2**31, advanced=True)
    engram_dim: int = _f(32, "width of a table row", "arms", lo=1, hi=1024, advanced=True)
    engram_layers: str = _f("0", "block layers that get a memory, comma-separated", "arms", advanced=True)
    engram_conv: bool = _f(True, "short causal conv after the engram gate", "arms", advanced=True)
    engram_dropout: float = _f(
        0.0, "dropout on the engram's output", "arms", lo=0.0, hi=1.0, hi_open=True, advanced=True
    )
    attention_layers: str = _f("", "block layers whose mixer is softmax attention (a hybrid)", "arms")
    n_experts: int = _f(1, "FFN experts; >1 = top-k mixture of experts", "arms", lo=1, hi=64)
    experts_top_k: int = _f(1, "experts each byte is routed to", "arms", lo=1, advanced=True)
    experts_dense: bool = _f(
        False, "run every expert on every byte (fixed shapes, for CUDA graphs)", "arms", advanced=True
    )
    moe_balance_weight: float = _f(0.01, "weight of the experts' balance term", "arms", lo=0.0, advanced=True)
    attn_res: bool = _f(False, "layer inputs are a learned mix of earlier layer outputs (AttnRes)", "arms")
    persistent_memory: str = _f(
        "disabled",
        "learned slots every sequence sees first",
        "arms",
        choices=("disabled", "enabled", "size-match", "enforced"),
    )
    memory_slots: int = _f(0, "persistent memory slots", "arms", lo=0, hi=4096, advanced=True)
    mor: bool = _f(False, "Mixture-of-Recursions: a router picks positions for each further iteration", "arms")
    mor_capacity: float = _f(
        0.5, "MoR: fraction of positions that take an iteration", "arms", lo=0.0, hi=1.0, lo_open=True, advanced=True
    )
    mor_aux_weight: float = _f(0.1, "MoR: weight of the router's BCE term", "arms", lo=0.0, advanced=True)
    dspark_weight: float = _f(0.0, "weight of the DSpark draft-head term; 0 = off", "arms", lo=0.0)
    dspark_k: int = _f(4, "DSpark: bytes predicted ahead of each anchor", "arms", lo=1, hi=64, advanced=True)
    dspark_stride: int = _f(16, "DSpark: anchor spacing in bytes", "arms", lo=1, advanced=True)
    dspark_detach: bool = _f(True, "DSpark: the draft term does not train the trunk", "arms", advanced=True)
    jepa_weight: float = _f(0.0, "weight of the JEPA latent-prediction term; 0 = off", "arms", lo=0.0)
    jepa_span: int = _f(8, "JEPA: bytes per masked span", "arms", lo=1, hi=1024, advanced=True)
    jepa_spans: int = _f(4, "JEPA: masked spans per sequence", "arms", lo=1, hi=256, advanced=True)
    kda_backend: str = _f(
        "auto",
        "KDA path; auto = fla on CUDA, chunked on CPU",
        "performance",
        choices=("auto", "fla", "chunked", "recurrent"),
    )
    kda_recompute: bool = _f(
        False, "fla's KDA backward recomputes the forward (less memory, slower)", "performance", advanced=True
    )
    kda_prep_in_kernel: bool = _f(
        True, "fla's KDA applies the q/k norm, gate and beta itself", "performance", advanced=True
    )
    norm_backend: str = _f(
        "auto", "RMSNorm path; auto = fused on CUDA, torch on CPU", "performance", choices=FUSED_CHOICES, advanced=True
    )
    conv_backend: str = _f(
        "auto",
        "short conv path; auto = fused on CUDA, torch on CPU",
        "performance",
        choices=FUSED_CHOICES,
        advanced=True,
    )
    swiglu_backend: str = _f(
        "auto", "SwiGLU path; auto = fused on CUDA, torch on CPU", "performance", choices=FUSED_CHOICES, advanced=True
    )


@dataclass
class TrainConfig:
    seq_len: int = _f(256, "bytes per training sequence", "data", lo=1)
    batch_size: int = _f(8, "sequences per step", "data", lo=1)
    byte_noise: float = _f(
        0.0, "fraction of input bytes replaced by random bytes (targets kept)", "data", lo=0.0, hi=1.0, hi_open=True
    )
    byte_noise_source: str = _f(
        "uniform", "what replaces a noised byte", "data", choices=BYTE_NOISE_SOURCES, advanced=True
    )
    opt: str = _f("adamw", "adamw, or sinkhorn: Nesterov+Sinkhorn on the matrices", "optimizer", choices=OPTS)
    lr: float = _f(3e-3, "peak learning rate", "optimizer", lo=0.0)
    weight_decay: float = _f(0.1, "decoupled weight decay on matrices", "optimizer", lo=0.0)
    sinkhorn_lr_scale: float = _f(1.0, "--opt sinkhorn: lr multiplier of the matrices", "optimizer", lo=0.0)
    grad_clip: float = _f(1.0, "global gradient-norm clip; 0 = off", "optimizer", lo=0.0)
    ema_decay: float = _f(
        0.998,
        "evals score an average of the weights with this decay; 0 = off",
        "optimizer",
        lo=0.0,
        hi=1.0,
        hi_open=True,
    )
    steps: int = _f(
        1000, "training steps; auto (or 0) = fitted to the corpus and the model's size", "schedule", lo=0, auto=True
    )
    minutes: float = _f(0.0, "train for this wall time instead of --steps; 0 = off", "schedule", lo=0.0)
    warmup_steps: int = _f(100, "linear warm-up steps", "schedule", lo=0)
    lr_decay: str = _f("cosine", "decay after warm-up", "schedule", choices=("cosine", "linear", "constant"))
    lr_floor: float = _f(0.5, "final lr as a fraction of the peak", "schedule", lo=0.0, hi=1.0)
    patience: int = _f(
        3, "stop once this many evals in a row have not beaten the best held-out bpb; 0 = off", "schedule", lo=0
    )
    rand_depth: bool = _f(False, "draw each step's loop depth from [rand_depth_min, depth]", "arms")
    rand_depth_min: int = _f(1, "--rand-depth: smallest depth", "arms", lo=1, advanced=True)
    rand_depth_bptt: int = _f(
        0, "--rand-depth: gradients through the last N iterations; 0 = all", "arms", lo=0, advanced=True
    )
    seed: int = _f(0, "seed of every random stream", "run", lo=0)
    eval_every: int = _f(200, "steps between held-out evals", "run", lo=1)
    eval_bytes: int = _f(0, "held-out bytes per eval; 0 = the whole split", "run", lo=0)
    ckpt_every: int = _f(500, "steps between checkpoints", "run", lo=1)
    keep_last: int = _f(3, "checkpoints kept besides best", "run", lo=1)
    dtype: str = _f(
        "auto",
        "compute dtype; auto = bf16 on CUDA, fp32 on CPU",
        "performance",
        choices=("auto", "fp32", "tf32", "bf16"),
    )
    device: str = _f("auto", "auto = cuda when available, else cpu", "performance", choices=("auto", "cpu", "cuda"))
    cuda_graph: bool | None = _f(
        None, "replay the step from CUDA graphs; default: on where the run allows", "performance", tristate=True
    )
    graph_update: bool = _f(
        True, "with --cuda-graph, the clip and update are a graph of their own", "performance", advanced=True
    )
    precompile: bool = _f(
        True,
        "compile the Triton kernels side by side before the first step (CUDA, one process)",
        "performance",
        advanced=True,
    )
    parallel: str = _f(
        "auto",
        "auto = ddp under torchrun, else none; fsdp = FSDP2",
        "parallel",
        choices=("auto", "none", "ddp", "fsdp"),
    )
    dist_timeout: float = _f(
        600.0, "seconds a collective waits before the run stops", "parallel", lo=0.0, lo_open=True, advanced=True
    )
    engram_shard: bool = _f(False, "split the engram tables' rows over the ranks (ddp)", "parallel")


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


SECTIONS = {"model": ModelConfig, "train": TrainConfig}  # the dataclasses, as config.json records them


def field_group(f: dataclasses.Field) -> str:
    return f.metadata["group"]


def group_fields() -> dict[str, dict[str, str]]:
    """{group: {field: its section ("model" or "train")}}, groups in GROUPS order."""
    out: dict[str, dict[str, str]] = {g: {} for g in GROUPS}
    for section, cls in SECTIONS.items():
        for f in fields(cls):
            out[field_group(f)][f.name] = section
    return out


def _sections(d: dict, origin: str) -> dict[str, dict]:
    """The [model] and [train] tables of a config.json dict, checked."""
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


def toml_overrides(d: dict, origin: str) -> dict[str, dict]:
    """A TOML file's group tables ([data], [model], [arms], ...) as {"model": {...}, "train": {...}}."""
    unknown = set(d) - set(GROUPS) - {"preset"}
    if unknown:
        raise ConfigError(f"{origin}: unknown table(s) {sorted(unknown)}; allowed: preset, {', '.join(GROUPS)}")
    members = group_fields()
    home = {name: group for group, names in members.items() for name in names}
    out: dict[str, dict] = {"model": {}, "train": {}}
    for group in GROUPS:
        table = d.get(group, {})
        if not isinstance(table, dict):
            raise ConfigError(f"{origin}: [{group}] must be a table")
        for key, value in table.items():
            if key not in members[group]:
                where = f"it belongs in [{home[key]}]" if key in home else f"known: {sorted(members[group])}"
                raise ConfigError(f"{origin}: [{group}] has no field {key!r}; {where}")
            out[members[group][key]][key] = value
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


def value_type(f: dataclasses.Field) -> type:
    """The Python type of a field's values (a tristate field holds a bool, or None for auto)."""
    return bool if f.metadata["tristate"] else f.type


def _coerce(cls, key: str, value):
    f = {f.name: f for f in fields(cls)}[key]
    if f.metadata["auto"] and value == "auto":
        return STEPS_AUTO
    ftype = value_type(f)
    ok = {
        bool: lambda v: isinstance(v, bool) or (v is None and f.metadata["tristate"]),
        int: lambda v: isinstance(v, int) and not isinstance(v, bool),
        float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        str: lambda v: isinstance(v, str),
    }[ftype]
    if not ok(value):
        raise ConfigError(f"{key}: expected {ftype.__name__}, got {value!r}")
    return float(value) if ftype is float else value


def engram_layers(m: ModelConfig) -> tuple[int, ...]:
    """The block layers that get an engram memory, ascending (of a validated config)."""
    return tuple(sorted(int(j) for j in comma_items(m.engram_layers)))


def comma_items(text: str) -> list[str]:
    """The comma-separated items of `text`, stripped; none for a blank text."""
    return [j.strip() for j in text.split(",")] if text.strip() else []


def layer_mixers(m: ModelConfig) -> list[str]:
    """The mixer of each block layer: `mixer`, except the `attention_layers` of a KDA model."""
    chosen = {int(i) for i in m.attention_layers.split(",")} if m.attention_layers else set()
    return ["attention" if m.mixer == "attention" or i in chosen else "kda" for i in range(m.block_layers)]


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


def graph_blockers(m: ModelConfig, t: TrainConfig) -> dict[str, str]:
    """{field: why} of what a captured step cannot replay: a CUDA graph replays the same kernels on the
    same shapes."""
    blockers = data_shaped_arms(m)
    if t.engram_shard:
        blockers["engram_shard"] = "sharded lookups exchange data-dependent sizes"
    if m.engram and t.rand_depth and t.rand_depth_min <= t.rand_depth_bptt < m.depth:
        # The memories join the first iteration only: a step deeper than rand_depth_bptt trains none of
        # their weights, a shallower one does, and the captured update reads one fixed set of gradients.
        blockers["rand_depth_bptt"] = "the engram gets gradients at some sampled depths and none at others"
    return blockers


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
