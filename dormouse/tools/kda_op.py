"""The KDA op on its own: gate inputs, one forward+backward, and its `dormouse bench --op kda` timing.

Inputs are what KDALayer hands the op: q, k L2-normalised, g fp32 ≤ 0, beta in (0, 1), an fp32
initial state, plus cotangents for the output and the final state; every draw from the `test` stream.
The GPU gate (tests/gpu/kda_fla_gate.py) and the bench share them, so a timed call is the
checked call.
"""

import torch

from dormouse import rng
from dormouse.ops.kda import kda
from dormouse.ops.norm.reference import l2norm


def make_inputs(shape, dtype, device, seed=0, gate_floor=None):
    """Leaf tensors [q, k, v, g, beta, h0] (requires_grad) and the cotangents (do, dS) for shape (B, T, H, K).
    `gate_floor`: g clamped to [gate_floor, 0], as a layer's bounded gate is (what fla's safe_gate assumes)."""
    B, T, H, K = shape
    gen = rng.generator(seed, 0, "test")

    def randn(*s):
        return torch.randn(*s, generator=gen)

    q, k = l2norm(randn(B, T, H, K)).to(dtype), l2norm(randn(B, T, H, K)).to(dtype)
    v = randn(B, T, H, K).to(dtype)
    g = -torch.nn.functional.softplus(randn(B, T, H, K))
    if gate_floor is not None:
        g = g.clamp(min=gate_floor)
    beta = torch.rand(B, T, H, generator=gen).to(dtype)
    h0 = randn(B, H, K, K)
    do, dS = randn(B, T, H, K).to(dtype), randn(B, H, K, K)
    leaves = [x.to(device).requires_grad_() for x in (q, k, v, g, beta, h0)]
    return leaves, do.to(device), dS.to(device)


def forward_backward(fn, leaves, do, dS, **kw):
    """(o, final state, grads of the leaves) for loss = <o, do> + <S, dS>."""
    o, S = fn(*leaves[:5], initial_state=leaves[5], output_final_state=True, **kw)
    grads = torch.autograd.grad((o * do.to(o.dtype)).sum() + (S * dS.to(S.dtype)).sum(), leaves)
    return o.detach(), S.detach(), grads


def op_step(shape, dtype, device, backend, chunk_size):
    """A zero-argument callable: one forward+backward of `kda` with `backend` on fixed inputs."""
    leaves, do, dS = make_inputs(shape, dtype, device)
    return lambda: forward_backward(kda, leaves, do, dS, backend=backend, chunk_size=chunk_size)
