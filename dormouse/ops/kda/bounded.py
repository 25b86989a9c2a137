"""KDA's bounded chunked form (chunked.py's `_bounded_chunks` and `_carry`) as one autograd Function with
its backward written out: the CPU path of the layer's bounded gate.

Autograd through the plain form records dozens of small ops per chunk and keeps their outputs; here the
forward saves the per-chunk tensors the backward reads, and the backward runs the state's reverse loop
over chunks, everything intra-chunk as batched matmuls on [N·B·H, ...] views. The function is the plain
form's (tests/test_kda_bounded.py: gradcheck, the fp64 recurrence, autograd through `_bounded_chunks`);
the output is regrouped as fla's kernels group it (below), so values agree to rounding, not bit for bit.

Per chunk n (rows of C, m = C // 2 the middle row, G the inclusive cumulative log-decay, S_n the state
carried in):
    k_to = k e^(G - G_m),  k_from = k e^(G_m - G),  q_to = q e^(G - G_m)
    L = tril(k_to k_from^T, -1),  A = scale · tril(q_to k_from^T)
    T = (I + diag(beta) L)^-1 diag(beta),  W = (T k_to) e^(G_m),  U = T v
    E = U - W S_n  (the pseudo-values: what S_n does not yet predict)
    o = A E + q_e S_n,  q_e = scale · q_to e^(G_m)
    S_(n+1) = e^(G_last) S_n + k_out^T E,  k_out = k_from e^(G_last - G_m)
`_carry` reads o as A U + (q_e - A W) S_n, the same sum: A E spares the product A W forward and its
two gradients' products backward, and the backward needs E, not U.
"""

import torch
from torch.autograd.function import once_differentiable


def bounded_chunks(q, k, v, G, beta, S, scale: float):
    """Chunks [N,B,H,C,*] (q unscaled, G the in-chunk cumulative log-decay, every exponent of a chunk
    within fp32, chunked.py's `_bounded_chunk`) and the state carried in [B,H,K,V] -> (o [N,B,H,C,V],
    the final state [B,H,K,V]), in the inputs' dtype (fp32 or fp64), autocast or not."""
    return _BoundedChunks.apply(q, k, v, G, beta, S, scale)


def _by_chunk(N: int, *xs: torch.Tensor):
    """[N·B·H, ...] -> [N, B·H, ...] views: chunk n's slice for the state loop."""
    return (x.view(N, x.shape[0] // N, *x.shape[1:]) for x in xs)


def _states(U, W, k_out, decay, S, N: int):
    """The state loop: U becomes E in place; returns the states [N+1, B·H, K, V], states[n] carried into
    chunk n, states[N] the final one. Each step is a multiply-add, a row scaling and a multiply-add."""
    states = S.new_empty(N + 1, *S.shape)
    states[0] = S
    for E_n, W_n, k_n, decay_n, n in zip(*_by_chunk(N, U, W, k_out, decay), range(N), strict=True):
        E_n.baddbmm_(W_n, states[n], alpha=-1)
        torch.mul(states[n], decay_n.mT, out=states[n + 1])
        states[n + 1].baddbmm_(k_n.mT, E_n)
    return states


def _state_grads(d_E, read, W, k_out, decay, d_S, N: int):
    """The state loop backward: d_E (A^T do on entry) gains k_out dS_(n+1) in place; read = q_e^T do.
    Returns the states' gradients [N+1, B·H, K, V], d_states[n] that of the state carried into chunk n."""
    d_states = d_S.new_empty(N + 1, *d_S.shape)
    d_states[N] = d_S
    chunks = zip(*_by_chunk(N, d_E, read, W, k_out, decay), range(N), strict=True)
    for d_E_n, read_n, W_n, k_n, decay_n, n in reversed(list(chunks)):
        d_E_n.baddbmm_(k_n, d_states[n + 1])
        torch.addcmul(read_n, decay_n.mT, d_states[n + 1], out=d_states[n])
        d_states[n].baddbmm_(W_n.mT, d_E_n, alpha=-1)
    return d_states


class _BoundedChunks(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, G, beta, S, scale):
        N, B, H, C, K = k.shape
        V = v.shape[-1]
        with torch.autocast(q.device.type, enabled=False):  # the matmuls in the inputs' dtype
            q, k, v, G = (x.reshape(N * B * H, C, x.shape[-1]) for x in (q, k, v, G))
            beta = beta.reshape(N * B * H, C)
            m = C // 2
            G_m, G_last = G[:, m : m + 1], G[:, -1:]
            e_to = (G - G_m).exp_()
            e_from = e_to.reciprocal()  # e^(G_m - G) to an ulp, for a tenth of an exp's time
            k_to, k_from, q_to = k * e_to, k * e_from, q * e_to
            L = torch.bmm(k_to, k_from.mT).tril_(-1)
            A = torch.bmm(q_to, k_from.mT).tril_().mul_(scale)  # diagonal included: a token reads its own write
            # the UT transform: X^-1 = (I + diag(beta) L)^-1, then T = X^-1 diag(beta). Solved from the
            # right (Y X = I): LAPACK then reads X in the layout torch keeps, without a transposing copy.
            eye = torch.eye(C, dtype=L.dtype, device=L.device).expand_as(L)
            X_inv = torch.linalg.solve_triangular(beta[..., None] * L, eye, upper=False, left=False, unitriangular=True)
            T = X_inv * beta[:, None, :]
            W_m, E = torch.bmm(T, k_to), torch.bmm(T, v)  # E holds U until the state loop
            into, to_last, decay = G_m.exp(), (G_last - G_m).exp(), G_last.exp()  # [NBH, 1, K]
            W = W_m * into
            k_out = k_from * to_last
            q_e = q_to * (into * scale)
            states = _states(E, W, k_out, decay, S.reshape(B * H, K, V), N)
            S_in = states[:N].view(N * B * H, K, V)
            o = torch.bmm(A, E).baddbmm_(q_e, S_in)
        saved = (e_to, e_from, k_to, k_from, q_to, q_e, v, beta, L, A, X_inv, T, W_m, W, k_out, E, S_in)
        ctx.save_for_backward(*saved, into, to_last, decay)
        ctx.scale = scale
        return o.view(N, B, H, C, V), states[N].view(B, H, K, V).clone()

    @staticmethod
    @once_differentiable  # the backward is arithmetic on saved tensors, no graph of its own
    def backward(ctx, d_o, d_S):
        e_to, e_from, k_to, k_from, q_to, q_e, v, beta, L, A, X_inv, T, W_m, W, k_out, E, S_in, *rows = (
            ctx.saved_tensors
        )
        into, to_last, decay = rows
        scale = ctx.scale
        N, B, H, C, V = d_o.shape
        K = k_to.shape[-1]
        with torch.autocast(d_o.device.type, enabled=False):
            d_o = d_o.reshape(N * B * H, C, V)
            # the state loop, o = A E + q_e S_n and S_(n+1) = decay S_n + k_out^T E, E = U - W S_n
            d_E = torch.bmm(A.mT, d_o)
            read = torch.bmm(q_e.mT, d_o)
            d_states = _state_grads(d_E, read, W, k_out, decay, d_S.reshape(B * H, K, V), N)
            d_out = d_states[1:].view(N * B * H, K, V)  # the gradient of the state each chunk writes
            d_q_e = torch.bmm(d_o, S_in.mT)
            minus_d_W = torch.bmm(d_E, S_in.mT)
            d_k_out = torch.bmm(E, d_out.mT)
            d_decay = (S_in * d_out).sum(-1)[:, None]
            d_A = torch.bmm(d_o, E.mT).tril_().mul_(scale)

            # within the chunk: the row scalings, the UT transform, the scores. In place where a gradient
            # is read for the last time: each full-size tensor fewer is one allocation, one cold buffer fewer.
            d_into = (minus_d_W * W_m).addcmul_(d_q_e, q_to, value=-scale).sum(-2, keepdim=True).neg_()
            d_to_last = (d_k_out * k_from).sum(-2, keepdim=True)
            d_W_m = minus_d_W.mul_(-into)
            d_T = torch.bmm(d_W_m, k_to.mT).baddbmm_(d_E, v.mT)  # E = U - W S_n: dU = dE
            # T = X^-1 diag(beta), X = I + diag(beta) L: dX = -X^-T dT T^T
            d_X = torch.bmm(X_inv.mT, torch.bmm(d_T, T.mT)).neg_()
            d_beta = (d_T * X_inv).sum(-2) + (d_X * L).sum(-1)
            d_L = (d_X * beta[..., None]).tril_(-1)
            d_v = torch.bmm(T.mT, d_E)
            d_k_to = torch.bmm(T.mT, d_W_m).baddbmm_(d_L, k_from)
            d_k_from = d_k_out.mul_(to_last).baddbmm_(d_L.mT, k_to).baddbmm_(d_A.mT, q_to)
            d_q_to = d_q_e.mul_(into * scale).baddbmm_(d_A, k_from)

            # back through the exponentials: k_to, q_to by e^(G - G_m), k_from by e^(G_m - G)
            d_G = (d_k_to * k_to).addcmul_(d_q_to, q_to).addcmul_(d_k_from, k_from, value=-1)
            d_k = d_k_to.mul_(e_to).addcmul_(d_k_from, e_from)
            d_q = d_q_to.mul_(e_to)
            through_last = d_to_last * to_last
            d_G_m = d_into * into - through_last - d_G.sum(-2, keepdim=True)
            d_G[:, C // 2 : C // 2 + 1] += d_G_m
            d_G[:, -1:] += d_decay * decay + through_last

        chunked = (x.view(N, B, H, C, -1) for x in (d_q, d_k, d_v, d_G))
        return (*chunked, d_beta.view(N, B, H, C), d_states[0].view(B, H, K, V), None)
