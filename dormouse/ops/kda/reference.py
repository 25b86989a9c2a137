"""KDA's definition: the recurrence, one step per position (fla's naive form).

Layout (fla's): q, k [B,T,H,K] (already L2-normalised), v [B,T,H,V], g [B,T,H,K] log-decay <= 0,
beta [B,T,H] in (0,1), state [B,H,K,V]. Per step and head:
    S <- S * exp(g_t)[:, None];  S <- S + beta_t k_t (v_t - k_t^T S)^T;  o_t = S^T (scale q_t)
"""

import torch
import torch.nn.functional as F


def check_shapes(q, k, v, g, beta, initial_state) -> tuple[int, int, int, int, int]:
    B, T, H, K = q.shape
    V = v.shape[-1]
    expected = {
        "k": (k, (B, T, H, K)),
        "v": (v, (B, T, H, V)),
        "g": (g, (B, T, H, K)),
        "beta": (beta, (B, T, H)),
    }
    if initial_state is not None:
        expected["initial_state"] = (initial_state, (B, H, K, V))
    for name, (x, shape) in expected.items():
        if tuple(x.shape) != shape:
            raise ValueError(f"kda: {name} has shape {tuple(x.shape)}, expected {shape} (q is {tuple(q.shape)})")
    return B, T, H, K, V


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    # The state and cumulative decays need fp32 at least; fp64 inputs stay fp64 for the tests.
    return torch.promote_types(x.dtype, torch.float32)


def decay(f: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, lower_bound: float | None) -> torch.Tensor:
    """The per-channel log-decay g [B,T,H,K] <= 0 from the gate's raw input f [B,T,H,K], in fp32 at least:
    lower_bound · sigmoid(exp(A_log) · (f + dt_bias)), or −exp(A_log) · softplus(f + dt_bias) without a
    bound (A_log [H], dt_bias [H·K])."""
    f = f.to(compute_dtype(f)) + dt_bias.view(f.shape[-2:])
    A = A_log.exp()[:, None]
    if lower_bound is None:
        return -A * F.softplus(f)
    return lower_bound * torch.sigmoid(A * f)


def start_state(initial_state, shape, dtype, device) -> torch.Tensor:
    if initial_state is None:
        return torch.zeros(shape, dtype=dtype, device=device)
    return initial_state.to(dtype)


def kda_recurrent(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False):
    """The reference: one step of the recurrence per position. Returns (o in q's dtype, state or None)."""
    B, _, H, K, V = check_shapes(q, k, v, g, beta, initial_state)
    out_dtype, dtype = q.dtype, compute_dtype(q)
    scale = K**-0.5 if scale is None else scale
    q, k, v, g, beta = (x.to(dtype) for x in (q, k, v, g, beta))
    q = q * scale
    S = start_state(initial_state, (B, H, K, V), dtype, q.device)
    outs = []
    # unbind, not indexing: indexing's backward writes each step's gradient into a full-size zero tensor
    for q_t, k_t, v_t, g_t, b_t in zip(*(x.unbind(1) for x in (q, k, v, g, beta)), strict=True):
        S = S * g_t[..., None].exp()
        err = v_t - torch.einsum("bhk,bhkv->bhv", k_t, S)
        S = S + torch.einsum("bhk,bhv->bhkv", b_t[..., None] * k_t, err)
        outs.append(torch.einsum("bhk,bhkv->bhv", q_t, S))
    o = torch.stack(outs, dim=1).to(out_dtype)
    return o, (S if output_final_state else None)
