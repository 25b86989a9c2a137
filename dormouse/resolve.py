"""A config made concrete: `resolve_values` (derived sizes, the device's `auto` choices), then the kernel
backend of each op for the device.

The backend policies live beside their ops in dormouse/model/; this module applies them to a config so that
config.py stays data (it imports nothing from the model).
"""

import dataclasses
import math

from dormouse.config import Config, graph_blockers, resolve_parallel
from dormouse.config_checks import validate
from dormouse.errors import ConfigError
from dormouse.ops import kda, norm, registry, short_conv, swiglu


def resolve(cfg: Config, *, cuda_available: bool | None = None) -> Config:
    """One concrete config: derived sizes filled in, `auto` choices decided, contradictions refused. A backend
    that cannot run is refused through its ledger site."""
    out = resolve_values(cfg, cuda_available=cuda_available)
    m, device = out.model, out.train.device
    if m.mixer == "kda":
        m.kda_backend = registry.resolve(kda.OP.name, m.kda_backend, device)
        if m.short_conv:
            m.conv_backend = "fused" if short_conv.is_fused(m.conv_backend, device, m.conv_size) else "plain"
    m.norm_backend = registry.resolve(norm.OP.name, m.norm_backend, device)
    m.swiglu_backend = registry.resolve(swiglu.OP.name, m.swiglu_backend, device)
    return out


def resolve_values(cfg: Config, *, cuda_available: bool | None = None) -> Config:
    """One concrete config but for the kernel backends (dormouse/resolve.py): derived sizes filled in,
    device-dependent `auto` choices decided, contradictions refused."""
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
    if t.dtype == "auto":
        t.dtype = "bf16" if t.device == "cuda" else "fp32"
    one_cuda_process = t.device == "cuda" and t.parallel == "none"
    if t.cuda_graph is None:
        t.cuda_graph = one_cuda_process and not graph_blockers(m, t)
    if t.cuda_graph and not one_cuda_process:
        raise ConfigError(f"cuda_graph needs one process on CUDA; this run is device {t.device}, parallel {t.parallel}")
    if t.dtype in ("bf16", "tf32") and t.device == "cpu":
        raise ConfigError(f"dtype {t.dtype} is for CUDA; on cpu use --dtype fp32")
    if m.persistent_memory == "size-match":
        # Round the slots up so that slots + seq_len fill whole KDA chunks.
        m.memory_slots += -(m.memory_slots + t.seq_len) % m.kda_chunk_size
    return out
