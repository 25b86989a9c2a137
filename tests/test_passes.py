"""The kernel pass over a built model (dormouse/ops/passes.py): the model as built schedules nothing; the
pass wraps its trunk in the casts' scope, bound to the model it was applied to."""

import copy

import torch
from test_model import ids, tiny

from dormouse.model.model import DormouseLM
from dormouse.ops import passes, projections


def test_the_trunk_runs_inside_shared_casts_once_scheduled_and_a_copy_runs_its_own(monkeypatch):
    scopes = []
    real = projections.shared_casts

    def counted():
        scopes.append(1)
        return real()

    monkeypatch.setattr(passes, "shared_casts", counted)
    model = DormouseLM(tiny(depth=2))
    x = ids(1, 8)
    model(x)
    assert scopes == []  # as built: no scope
    passes.schedule(passes.schedule(model))  # twice: one wrapper still
    model(x)
    model.step(x[:, 0], model.new_cache(1))
    assert len(scopes) == 2  # forward, step (new_cache runs the trunk only for memory slots)
    twin = copy.deepcopy(model)
    with torch.no_grad():
        twin.embed.weight.add_(1.0)
    assert not torch.equal(twin(x).logits, model(x).logits)  # the copy's trunk reads the copy's weights
