"""torch.compile of the nano model works on the CPU, so the GPU path can use it.

The backend is aot_eager: Dynamo's graph capture and AOTAutograd's forward/backward split, which is
where a model stops being compilable. Inductor's C++ code generation on top of it was too slow for CI
on 2 cores (docs/known-issues.md). Dropout is on (its masks drawn from the same generator stream in
both models), and the engram memory too: its table lookup runs eagerly
(`Engram._lookup`, a graph break), since AOTAutograd cannot trace a sparse gradient.
"""

import torch

from dormouse import config, rng
from dormouse.model.dropout import step_generator
from dormouse.model.model import DormouseLM
from dormouse.resolve import resolve


def test_compiled_nano_matches_eager_forward_and_backward():
    cfg = config.build("nano", {"model": {"engram": True, "dropout": 0.3}, "train": {"seq_len": 64}})
    cfg = resolve(cfg, cuda_available=False)
    eager = DormouseLM(cfg.model, seed=0)
    compiled_model = DormouseLM(cfg.model, seed=0)
    compiled = torch.compile(compiled_model, backend="aot_eager")
    x = torch.randint(0, 256, (2, 64), generator=rng.generator(0, 0, "test"))
    y = torch.randint(0, 256, (2, 64), generator=rng.generator(0, 1, "test"))
    assert cfg.model.dropout > 0
    a, b = eager(x, y, dropout_gen=step_generator(0, 0)), compiled(x, y, dropout_gen=step_generator(0, 0))
    a.loss.backward()
    b.loss.backward()
    assert torch.allclose(a.logits, b.logits, atol=1e-4, rtol=1e-4)
    assert abs(a.loss.item() - b.loss.item()) < 1e-4
    for (name, p), q in zip(eager.named_parameters(), compiled_model.parameters(), strict=True):
        assert p.grad.is_sparse == q.grad.is_sparse, name  # the engram tables keep their sparse gradient
        dense = (g.to_dense() if g.is_sparse else g for g in (p.grad, q.grad))
        assert torch.allclose(*dense, atol=1e-4, rtol=1e-3), name
