"""The update of a --cuda-graph step (dormouse/train/graphed_update.py), its arithmetic on the CPU: the
clip's dense part and NesterovSinkhorn's step, as the graph runs them (lr from device tensors, the
tables' norms taken apart), give the eager path's weights and gradient norms bit for bit, step after
step with a changing lr and an active clip. The capture itself: tests/gpu/test_graphed_step.py."""

from types import SimpleNamespace

import pytest
import torch

from dormouse import config, rng
from dormouse.model.model import DormouseLM
from dormouse.resolve import resolve
from dormouse.train.graphed_update import GraphedUpdate
from dormouse.train.optim import NesterovSinkhorn
from dormouse.train.routing import build_optimizers, route
from dormouse.train.sparse import clip_grad_norm_

HYPER = SimpleNamespace(lr=0.01, weight_decay=0.1, sinkhorn_lr_scale=1.0)


def model(**fields):
    """A small model with the engram on (its tables' sparse update is part of the graph) and dropout off."""
    values = {"d_model": 32, "n_heads": 2, "ffn_hidden": 64, "kda_chunk_size": 16, "engram_rows": 257}
    values |= {"engram": True, "dropout": 0.0, **fields}
    cfg = resolve(config.build("nano", {"model": values}), cuda_available=False)
    return DormouseLM(cfg.model, seed=5)


def backward(m, step):
    x = torch.randint(0, 256, (3, 41), generator=rng.generator(0, step, "test"))
    m(x[:, :-1], x[:, 1:]).loss.backward()


@pytest.mark.parametrize("engram", [True, False])
@pytest.mark.parametrize("max_norm", [0.05, float("inf")], ids=["clipping", "norm-only"])
def test_graphed_update_equals_clip_and_step_bitwise(engram, max_norm):
    eager, graphed = model(engram=engram), model(engram=engram)
    eager_opt = build_optimizers(route(eager), HYPER, fused=True)
    graphed_opt = build_optimizers(route(graphed), HYPER, capturable=True, fused=True)
    update = GraphedUpdate(graphed, graphed_opt, capture=False)
    for step, multiplier in enumerate((0.25, 1.0, 0.6, 0.1)):
        for m, opt in ((eager, eager_opt), (graphed, graphed_opt)):
            opt.set_lr(multiplier)
            backward(m, step)
        want = clip_grad_norm_(eager.parameters(), max_norm)
        eager_opt.step()
        got = update(max_norm)
        assert torch.equal(got, want), step
        if max_norm < float("inf"):
            assert want > max_norm  # the clip acted
        for (name, a), b in zip(eager.named_parameters(), graphed.parameters(), strict=True):
            assert torch.equal(a, b), (step, name)
        eager_opt.zero_grad(set_to_none=True)
        graphed_opt.zero_grad(set_to_none=True)
    assert update.calls == 4 and update.graph is None
    assert (update.sparse_norms is not None) == engram


def optimizer_state(opt) -> list[torch.Tensor]:
    return [v.clone() for o in opt.optimizers.values() for st in o.state.values() for v in st.values()]


def test_a_skipped_update_leaves_every_weight_and_optimizer_state_bit_identical():
    """The trainer queues a graphed update before its check and skips it on the device when a loss term
    is not finite: with NaN gradients everywhere, nothing moves (the tables' rows, AdamW's step counts, the
    momentum), and the next update is the one an eager run that never saw the bad step takes."""
    eager, graphed = model(), model()
    eager_opt = build_optimizers(route(eager), HYPER, fused=True)
    graphed_opt = build_optimizers(route(graphed), HYPER, capturable=True, fused=True)
    update = GraphedUpdate(graphed, graphed_opt, capture=False)
    for step in range(2):  # both take two updates: every optimizer state exists
        for m, opt in ((eager, eager_opt), (graphed, graphed_opt)):
            opt.set_lr(0.5)
            backward(m, step)
        clip_grad_norm_(eager.parameters(), 0.05)
        eager_opt.step()
        update(0.05, skip=torch.tensor(False))
        eager_opt.zero_grad(set_to_none=True)
        graphed_opt.zero_grad(set_to_none=True)
    weights, state = [p.clone() for p in graphed.parameters()], optimizer_state(graphed_opt)
    backward(graphed, 2)
    for p in graphed.parameters():
        grad = p.grad.coalesce() if p.grad.is_sparse else p.grad
        (grad.values() if grad.is_sparse else grad).fill_(float("nan"))
        p.grad = grad
    assert torch.isnan(update(0.05, skip=torch.tensor(True)))
    assert all(torch.equal(a, b) for a, b in zip(weights, graphed.parameters(), strict=True))
    assert all(torch.equal(a, b) for a, b in zip(state, optimizer_state(graphed_opt), strict=True))
    graphed_opt.zero_grad(set_to_none=True)
    for m in (eager, graphed):
        backward(m, 3)
    clip_grad_norm_(eager.parameters(), 0.05)
    eager_opt.step()
    update(0.05, skip=torch.tensor(False))
    for (name, a), b in zip(eager.named_parameters(), graphed.parameters(), strict=True):
        assert torch.equal(a, b), name


def test_capturable_sinkhorn_needs_its_lr_tensors_loaded_and_a_graphed_update_needs_it():
    w = torch.nn.Parameter(torch.ones(3, 2))
    w.grad = torch.full((3, 2), 0.5)
    with pytest.raises(RuntimeError, match="load_lr_"):
        NesterovSinkhorn([w], lr=0.1, capturable=True).step()
    with pytest.raises(RuntimeError, match="capturable=True"):
        NesterovSinkhorn([w], lr=0.1).load_lr_()
    m = model()
    with pytest.raises(ValueError, match="capturable NesterovSinkhorn"):
        GraphedUpdate(m, build_optimizers(route(m), HYPER))
    with pytest.raises(ValueError, match="fused AdamW"):
        GraphedUpdate(m, build_optimizers(route(m), HYPER, capturable=True, fused=False))


def test_capturable_sinkhorn_takes_each_steps_lr():
    """The lr tensors are refilled by load_lr_: a second step at another lr moves by that lr."""
    w = torch.nn.Parameter(torch.zeros(2, 2))
    opt = NesterovSinkhorn([w], lr=0.5, momentum=0.0, capturable=True)
    for lr, want in ((0.5, -0.5), (0.25, -0.75)):
        w.grad = torch.ones(2, 2)  # its SR-Sinkhorn is all ones, to rounding (rows and columns of norm √2)
        opt.param_groups[0]["lr"] = lr
        opt.load_lr_()
        opt.step()
        torch.testing.assert_close(w.detach(), torch.full((2, 2), want), rtol=0, atol=1e-6)
