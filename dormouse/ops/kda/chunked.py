"""KDA in its chunked (WY / UT-transform) form, in plain PyTorch: the CPU path (reference sheet §1.3).
The same function as the recurrence of reference.py. The bounded form runs as bounded.py's Function,
its backward written out; `_bounded_chunks` here is its plain counterpart, under autograd, that the
Function is checked against (tests/test_kda_bounded.py).
"""

import math

import torch
import torch.nn.functional as F

from dormouse.ops.kda.bounded import bounded_chunks
from dormouse.ops.kda.reference import check_shapes, compute_dtype, start_state


def _decayed_scores(a, b, G, strict: bool, sub: int = 16):
    """M[i, j] = sum_d a[i,d] b[j,d] exp(G[i,d] - G[j,d]) for j < i (j <= i unless strict), else 0.

    G is a cumulative log-decay along the rows (non-increasing), so every kept exponent is <= 0;
    exp(G_i) and exp(-G_j) taken apart would overflow once a chunk's total decay is large. Rows are
    cut into blocks of `sub`, as fla's kernels do: a block pair J < I factors through r, the first
    row of block I (G_j >= G_r >= G_i), into one matmul; blocks on the diagonal take pairwise
    differences, masked before exp since the upper triangle would overflow. Shapes [..., C, K] ->
    [..., C, C].
    """
    C = G.shape[-2]
    s = math.gcd(C, sub)
    n = C // s
    a, b, G = (x.unflatten(-2, (n, s)) for x in (a, b, G))  # [..., n, s, K]
    dev = G.device

    keep = torch.ones(s, s, dtype=torch.bool, device=dev).tril(-1 if strict else 0)
    diff = G[..., :, None, :] - G[..., None, :, :]  # [..., n, s, s, K]
    decay = diff.masked_fill(~keep[..., None], -math.inf).exp()
    diagonal = (decay * a[..., :, None, :] * b[..., None, :, :]).sum(-1)  # [..., n, s, s]

    G_r = G[..., :1, :]
    a_r = a * (G - G_r).exp()  # [..., I, s, K]
    below = torch.ones(n, n, dtype=torch.bool, device=dev).tril(-1)
    to_r = G_r[..., :, None, :, :] - G[..., None, :, :, :]  # [..., I, J, s, K]
    b_r = b[..., None, :, :, :] * to_r.masked_fill(~below[:, :, None, None], -math.inf).exp()
    M = a_r[..., :, None, :, :] @ b_r.transpose(-1, -2)  # [..., I, J, s, s], zero unless J < I
    M = M + diagonal[..., :, None, :, :] * torch.eye(n, dtype=M.dtype, device=dev)[:, :, None, None]
    return M.transpose(-3, -2).flatten(-4, -3).flatten(-2, -1)  # [..., I, s, J, s] -> [..., C, C]


def _contiguous(grad: torch.Tensor | None) -> torch.Tensor | None:
    return None if grad is None else grad.contiguous()


# The widest exponent a bounded chunk forms: e^80 is finite in fp32 (max e^88.7), e^-40 a normal number.
_EXP_BUDGET = 80.0


def _bounded_chunk(chunk_size: int, lower_bound: float) -> int:
    """The chunk of the bounded form: `chunk_size` halved until a chunk's log-decay spans at most the
    budget (16 for the gate's -5)."""
    C = chunk_size
    while C > 1 and C * -lower_bound > _EXP_BUDGET:
        C //= 2
    return C


def kda_chunked(
    q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, chunk_size=64, lower_bound=None
):
    """The chunked (WY / UT-transform) form, reference sheet §1.3, in plain PyTorch.

    All intra-chunk work is batched over every chunk at once; only the state carry loops over
    chunks. Any T: the tail is padded with k=v=0, g=0, beta=0, which leave the state untouched.
    `lower_bound`, a bound every g keeps (g >= it: the layer's bounded gate), selects the bounded form
    (bounded.py's `bounded_chunks`, the Function of `_bounded_chunks`): each chunk's scores one matmul
    through its middle row (fla's safe_gate), in chunks short enough that no exponent leaves fp32
    (`_bounded_chunk`); without it `_exact_chunks` runs, for any decay. The function is the same.
    Returns (o in q's dtype, state or None); the state is fp32 (fp64 for fp64 inputs).
    """
    B, T, H, K, V = check_shapes(q, k, v, g, beta, initial_state)
    if lower_bound is not None and bool((g < lower_bound).any()):
        raise ValueError(f"kda_chunked: g goes below lower_bound {lower_bound} (min {g.min().item():.4g})")
    out_dtype, dtype = q.dtype, compute_dtype(q)
    scale = K**-0.5 if scale is None else scale
    C = chunk_size if lower_bound is None else _bounded_chunk(chunk_size, lower_bound)
    pad = -T % C
    N = (T + pad) // C

    def chunks(x, cumsum=False):  # [B, T, H, ...] -> [N, B, H, C, ...], zero-padded along T; chunks contiguous
        x = x.to(dtype)
        if pad:
            x = F.pad(x, (0, 0) * (x.dim() - 2) + (0, pad))
        x = x.unflatten(1, (N, C))
        if cumsum:  # before the copy into chunk order: one pass fewer
            x = x.cumsum(2)
        return x.permute(1, 0, 3, 2, *range(4, x.dim())).contiguous()

    # G: the inclusive in-chunk cumulative log-decay [N,B,H,C,K]
    q, k, v, G, beta = chunks(q), chunks(k), chunks(v), chunks(g, cumsum=True), chunks(beta)
    S = start_state(initial_state, (B, H, K, V), dtype, q.device)
    if lower_bound is None:
        o, S = _exact_chunks(q * scale, k, v, G, beta, S)  # o [N,B,H,C,V]
        if o.requires_grad:  # its gradient comes as a view of [B,T,H,V]'s; matmul's backward copies such per chunk
            o.register_hook(_contiguous)
    else:
        o, S = bounded_chunks(q, k, v, G, beta, S, scale)
    o = o.permute(1, 0, 3, 2, 4).flatten(1, 2)[:, :T]  # -> [B,N,C,H,V] -> [B,T,H,V]
    return o.to(out_dtype), (S if output_final_state else None)


def _exact_chunks(q, k, v, G, beta, S):
    """Chunks [N,B,H,C,*] and the state carried in -> (o [N,B,H,C,V], the final state), for any decay."""
    K = k.shape[-1]
    # UT transform: (I + L) [W | U] = diag(beta) [exp(G) * k | v], L strictly lower triangular.
    # solve_triangular with unitriangular=True takes the unit diagonal as given, so L goes in as is.
    L = beta[..., None] * _decayed_scores(k, k, G, strict=True)
    rhs = beta[..., None] * torch.cat([G.exp() * k, v], dim=-1)
    W, U = torch.linalg.solve_triangular(L, rhs, upper=False, unitriangular=True).split([K, v.shape[-1]], dim=-1)
    A_qk = _decayed_scores(q, k, G, strict=False)  # diagonal included: a token reads its own write

    G_last = G[..., -1:, :]
    k_out = k * (G_last - G).exp()  # each key decayed to the chunk's end
    return _carry(A_qk, U, q * G.exp(), W, k_out, G_last.exp(), S)


def _carry(A, U, q_e, W, k_out, chunk_decay, S):
    """The chunks' outputs and the final state, S_n the state carried into chunk n: a chunk's output reads
    it directly (q_e: q decayed from the chunk's start) and through its pseudo-values U - W S_n, so
    o = A U + (q_e - A W) S_n; S_(n+1) = chunk_decay_n S_n + k_out_n^T (U_n - W_n S_n), chunk_decay
    [N,B,H,1,K]. The matmuls run on [N·B·H, ...] and [B·H, ...] views, the adds inside them (baddbmm):
    each step of the loop is one mul and two fused multiply-adds."""
    N, B, H = U.shape[:3]
    flat_A = A.flatten(0, 2)
    q_in = torch.baddbmm(q_e.flatten(0, 2), flat_A, W.flatten(0, 2), alpha=-1)
    flat = (x.flatten(1, 2) for x in (U, W, k_out.transpose(-1, -2), chunk_decay.transpose(-1, -2)))
    S = S.flatten(0, 1)
    states = []
    # unbind, not indexing: indexing's backward writes each chunk's gradient into a full-size zero tensor
    for U_n, W_n, k_n, decay_n in zip(*(x.unbind(0) for x in flat), strict=True):
        states.append(S)
        # U - W S: what S does not yet predict
        S = torch.baddbmm(decay_n * S, k_n, torch.baddbmm(U_n, W_n, S, alpha=-1))
    o = torch.baddbmm(flat_A @ U.flatten(0, 2), q_in, torch.stack(states).flatten(0, 1))
    return o.unflatten(0, (N, B, H)), S.unflatten(0, (B, H))


def _bounded_chunks(q, k, v, G, beta, S):
    """`_exact_chunks` for a chunk whose log-decay spans at most the budget: every decay factors through
    the chunk's middle row m, |G_i - G_m| at most half the budget, so the work is matmuls and each
    full-size tensor takes one exp: W' = W exp(-G_m) = T_beta (k e^(G - G_m)), then as `_exact_chunks`.
    The plain form of bounded.py's Function (q scaled here, there not), differentiated by autograd."""
    C = G.shape[-2]
    G_m = G[..., C // 2 : C // 2 + 1, :]  # [N,B,H,1,K]
    G_last = G[..., -1:, :]
    to_m = (G - G_m).exp()
    k_to, k_from, q_to = k * to_m, k * (G_m - G).exp(), q * to_m
    L = (k_to @ k_from.transpose(-1, -2)).tril(-1)
    A = (q_to @ k_from.transpose(-1, -2)).tril()  # diagonal included: a token reads its own write
    # UT transform, as one inverse: (I + diag(beta) L)^-1 diag(beta) applied to k e^(G - G_m) and to v
    T_beta = torch.linalg.solve_triangular(beta[..., None] * L, torch.diag_embed(beta), upper=False, unitriangular=True)
    W_m, U = T_beta @ k_to, T_beta @ v
    # The state's row scalings folded in: W = W' e^(G_m) = T_beta (k e^G), q e^(G - G_m) e^(G_m) = q e^G,
    # k e^(G_m - G) e^(G_last - G_m) = k e^(G_last - G); every exponent here is within the budget.
    into = G_m.exp()
    W = W_m * into
    return _carry(A, U, q_to * into, W, k_from * (G_last - G_m).exp(), G_last.exp(), S)
