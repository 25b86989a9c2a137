"""FLOPs of one training step, counted from the model (not measured): the numerator of MFU.

    6 · B · S · N_block  +  6 · B · T · N_byte  +  3 · B · S · depth · block_layers · M

B = batch_size, T = seq_len, S = T + memory_slots (positions through the looped block). N_block =
depth · Σ weights of the nn.Linear modules of the looped block (a MoE expert's weights count
top_k / n_experts of the time, all of it under `experts_dense`; the router always). N_byte =
256 · d_model (the LM head, tied or not) plus the weights of every nn.Linear outside the block (the
Engram memory's W_K, W_V: it runs once, on the byte positions only); those are named in the log.
6 = 2 FLOPs per multiply-add × (forward + backward at twice the forward). M is the mixer's own forward
FLOPs per position per layer application, ×3 for forward + backward:

    kda:        H · (6·K·V + 4·C·K + 2·C·V + C·(K + V))      K = V = head_dim, C = kda_chunk_size
    attention:  H · head_dim · 2 · (S + 1)                  causal: a query sees (S + 1) / 2 keys on average

The KDA count is the chunked (WY/UT) form's matmuls per position: the two intra-chunk score matrices
(2CK each), the triangular solve (C(K+V)), the three state products (2KV each) and the intra-chunk
output (2CV). fla runs the same algorithm; the recurrent backend is counted the same, so MFU compares
backends on one scale. Not counted: lookups (embedding, Engram tables), norms, activations, gates,
the short conv, AttnRes mixes, the loss and the optimizers.

A baseline's FLOPs are the same formula with its own weights: every layer has weights of its own and
there are no memory slots, so

    6 · B · T · (N_layers + 256 · d_model)  +  3 · B · T · L · M        L = block_layers · depth

N_layers = the weights of every nn.Linear but the head; M the attention formula at S = T (gpt) or the
KDA formula with C = 64, the chunk length fla's KDA layer runs (fla-kda).
"""

from dataclasses import dataclass, field

from torch import nn

from dormouse.config import Config, layer_mixers


@dataclass
class FlopCount:
    per_step: float  # dense + mixer
    dense: float  # the 6·(weights × positions) terms
    mixer: float  # the 3·B·S·depth·block_layers·M term
    block_weights: float  # N_block (depth included)
    byte_weights: float  # N_byte (head and every nn.Linear outside the block)
    mixer_fwd_per_position: float
    outside: list[str] = field(default_factory=list)

    def describe(self) -> str:
        lines = [
            f"flops_per_step = {self.per_step:.6g} = matmul weights {self.dense:.6g} + mixer {self.mixer:.6g}",
            f"  matmul weights touched: N_block {self.block_weights:,.0f} per position (every layer application), "
            f"N_byte {self.byte_weights:,.0f} per byte position",
            "  mixer forward FLOPs per position per layer application (a hybrid: the mean): "
            f"{self.mixer_fwd_per_position:,.0f}",
        ]
        if self.outside:
            lines.append("  nn.Linear outside the looped block, once per byte position: " + ", ".join(self.outside))
        return "\n".join(lines)


def mixer_fwd_flops(mixer: str, n_heads: int, head_dim: int, chunk: int, positions: int) -> float:
    """M: a mixer's own forward FLOPs per position per layer application (module docstring); `chunk` is the
    KDA chunk length, `positions` the sequence length attention sees."""
    H, K = n_heads, head_dim
    if mixer == "kda":
        C, V = chunk, head_dim
        return H * (6 * K * V + 4 * C * K + 2 * C * V + C * (K + V))
    return H * K * 2 * (positions + 1)


def count_flops(model: nn.Module, cfg: Config) -> FlopCount:
    """FLOPs of one training step (forward + backward) by the formula in the module docstring."""
    m, t = cfg.model, cfg.train
    block, outside, outside_names = 0.0, 0.0, []
    for name, mod in model.named_modules():
        if not isinstance(mod, nn.Linear) or name == "lm_head":
            continue
        if name.startswith("layers."):
            routed = ".experts." in f".{name}." and not m.experts_dense  # dense: every expert sees every byte
            share = m.experts_top_k / m.n_experts if routed else 1.0
            block += mod.weight.numel() * share
        else:
            outside += mod.weight.numel()
            outside_names.append(name)
    fwd, bwd, first = loop_passes(cfg)
    block_weights = fwd * block
    byte_weights = 256 * m.d_model + outside
    S, T, B = t.seq_len + m.memory_slots, t.seq_len, t.batch_size
    per_layer = [mixer_fwd_flops(kind, m.n_heads, m.head_dim, m.kda_chunk_size, S) for kind in layer_mixers(m)]
    mixer = sum(per_layer) / len(per_layer)  # a hybrid's layers differ: their mean
    # A forward is 2 FLOPs per weight and position, its backward 4 (the input's and the weight's gradients).
    # The engram's linears run in the first iteration only: backward only when it records gradients.
    dense = B * S * block * (2 * fwd + 4 * bwd) + B * T * (6 * 256 * m.d_model + outside * (2 + 4 * first))
    mixer_total = B * S * (fwd + 2 * bwd) * sum(per_layer)
    return FlopCount(dense + mixer_total, dense, mixer_total, block_weights, byte_weights, mixer, outside_names)


def loop_passes(cfg: Config) -> tuple[float, float, float]:
    """Per step, on average over the depths `--rand-depth` samples (uniform over [rand_depth_min, depth];
    the config's depth without it): loop iterations run forward, iterations run backward (the last
    rand_depth_bptt when it is set), and the share of steps whose first iteration runs backward."""
    m, t = cfg.model, cfg.train
    depths = range(t.rand_depth_min, m.depth + 1) if t.rand_depth else [m.depth]
    backward = [min(d, t.rand_depth_bptt) if t.rand_depth_bptt else d for d in depths]
    n = len(depths)
    return sum(depths) / n, sum(backward) / n, sum(b == d for b, d in zip(backward, depths, strict=True)) / n


FLA_KDA_CHUNK = 64  # the chunk length of fla's chunk_kda as fla.layers.kda calls it (its default)


def count_baseline_flops(model: nn.Module, cfg: Config, name: str) -> FlopCount:
    """FLOPs of one training step of baseline `name` (module docstring): every layer has weights of its own,
    so N_block is every nn.Linear but the head, the mixer term counts block_layers · depth layers at S = T."""
    from dormouse.tools.bench.baseline_models import n_layers

    m, t = cfg.model, cfg.train
    layers = sum(
        mod.weight.numel() for n, mod in model.named_modules() if isinstance(mod, nn.Linear) and n != "lm_head"
    )
    B, T = t.batch_size, t.seq_len
    mixer = mixer_fwd_flops("attention" if name == "gpt" else "kda", m.n_heads, m.head_dim, FLA_KDA_CHUNK, T)
    byte_weights = 256 * m.d_model
    dense = 6 * B * T * (layers + byte_weights)
    mixer_total = 3 * B * T * n_layers(m) * mixer
    return FlopCount(dense + mixer_total, dense, mixer_total, layers, byte_weights, mixer)
