"""SparseRowAdam's row update in torch ops, the definition (ops/row_adam/)."""

import contextlib

import torch


@contextlib.contextmanager
def distinct_rows_write():
    """Deterministic mode off around `index_copy_` into distinct rows: each row is written once, so any
    order gives the same bits, but deterministic mode would still sort the indices first (torch's
    index_put_ path), ~0.4 ms of host time a call on an H200 while the GPU waits."""
    on, warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(False)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(on, warn_only=warn_only)


def row_adam_(idx, g, keep, step_size, bc2_sqrt, m_all, v_all, p, betas, eps) -> None:
    """The update of `row_adam_` in torch's elementwise ops, gathering and scattering each row set."""
    beta1, beta2 = betas
    k = keep.unsqueeze(1)
    m_old, v_old = m_all.index_select(0, idx), v_all.index_select(0, idx)
    m = torch.where(k, m_old.mul(beta1).add_(g, alpha=1 - beta1), m_old)
    v = torch.where(k, v_old.mul(beta2).addcmul_(g, g, value=1 - beta2), v_old)
    with distinct_rows_write():
        m_all.index_copy_(0, idx, m)
        v_all.index_copy_(0, idx, v)
    if step_size is None:
        return
    denom = v.sqrt().div_(bc2_sqrt.unsqueeze(1)).add_(eps)
    w = p.index_select(0, idx).to(m.dtype)
    with distinct_rows_write():
        update = w - step_size.unsqueeze(1) * (m / denom)
        p.index_copy_(0, idx, torch.where(k, update, w).to(p.dtype))
