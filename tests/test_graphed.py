"""--cuda-graph's CPU-checkable parts (dormouse/train/graphed.py): the engram rows looked up outside the
forward give the same loss and gradients as the table looked up inside it, bit for bit, and the table's
sparse gradient is the one nn.Embedding builds; counters replay what a captured step counted; every
path a graph cannot hold is refused. The capture itself: tests/gpu/test_graphed_step.py."""

import pytest
import torch

from dormouse import config, config_checks, counters, ledger, rng
from dormouse.errors import ConfigError
from dormouse.model.model import DormouseLM
from dormouse.resolve import resolve
from dormouse.train.graphed import CountSnapshot, GraphedStep, look_up_rows_, row_plans, set_table_grads_, table_rows
from dormouse.train.sparse import RowPlan


def small_model(**model):
    """Two engram memories (the rows a graph looks up outside its forward) and dropout off."""
    values = {"d_model": 32, "n_heads": 2, "ffn_hidden": 64, "kda_chunk_size": 16, "engram": True, "dropout": 0.0}
    values.update({"engram_rows": 257, "engram_dim": 8, "engram_layers": "0,1", **model})
    cfg = resolve(config.build("nano", {"model": values}), cuda_available=False)
    return DormouseLM(cfg.model, seed=3)


def batch(seed=0, b=3, t=40):
    x = torch.randint(0, 256, (b, t + 1), generator=rng.generator(seed, 0, "test"))
    return x[:, :-1], x[:, 1:]


def grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None and not p.grad.is_sparse}


@pytest.mark.parametrize(
    "model_args",
    [{}, {"jepa_weight": 0.5, "dspark_weight": 0.3}, {"persistent_memory": "size-match", "memory_slots": 4}],
)
def test_rows_looked_up_outside_equal_the_table_inside_bitwise(model_args):
    model = small_model(**model_args)
    x, y = batch()
    starts = torch.tensor([[2, 20]] * 3) if model_args.get("jepa_weight") else None
    inside = model(x, y, jepa_starts=starts)
    inside.loss.backward()
    dense = grads(model)
    tables = {j: m.table.weight.grad for j, m in model.memories()}
    model.zero_grad(set_to_none=True)

    rows = {j: torch.zeros(*x.shape, m.arms, m.dim, requires_grad=True) for j, m in model.memories()}
    looked_up = look_up_rows_(model, x, rows)
    for j, m in model.memories():
        m.captured_rows = rows[j]
    outside = model(x, y, jepa_starts=starts)
    outside.loss.backward()
    set_table_grads_(model, rows, row_plans(looked_up))

    assert len(tables) == 2
    assert torch.equal(outside.loss, inside.loss) and torch.equal(outside.ce, inside.ce)
    assert outside.aux.keys() == inside.aux.keys()
    for name in inside.aux:
        assert torch.equal(outside.aux[name], inside.aux[name]), name
    after = grads(model)
    assert after.keys() == dense.keys()
    for name in dense:
        assert torch.equal(after[name], dense[name]), name
    for j, m in model.memories():
        got, want = m.table.weight.grad, tables[j]  # nn.Embedding(sparse=True)'s: one row per lookup
        assert got.is_sparse and got.is_coalesced()
        assert torch.equal(got.indices(), want.coalesce().indices())
        # RowPlan's sums, in the lookups' order (torch's on CUDA; its CPU coalesce adds in another order)
        assert torch.equal(got.values(), RowPlan(want._indices()[0]).coalesce(want._values(), want.shape[0]).values())
        # torch's CPU order: the same sums to fp32's error, relative to the gradient's scale (an entry
        # where the lookups' gradients cancel differs by more than its own 1e-6)
        dense_want = want.coalesce().to_dense()
        scale = dense_want.abs().max().item()
        torch.testing.assert_close(got.to_dense(), dense_want, rtol=1e-6, atol=1e-6 * scale)


def test_captured_rows_of_the_wrong_shape_are_refused():
    model = small_model()
    x, y = batch()
    for _, m in model.memories():
        m.captured_rows = torch.zeros(*x.shape, m.arms, m.dim + 1)
    with pytest.raises(ValueError, match="captured rows"):
        model(x, y)


def test_counts_of_the_captured_step_are_added_at_each_replay():
    counters.KDA.reset(), counters.NORM.reset()
    ledger.COUNTS.clear()
    counters.KDA.record(True)
    before = CountSnapshot()
    for fused in (True, False, True):  # what one captured step counts
        counters.KDA.record(fused)
    counters.NORM.record(False)
    site = ledger.all_sites()[0].name
    ledger.COUNTS[site] += 2
    delta = before.since()
    before.restore()
    assert (counters.KDA.fused, counters.KDA.calls, counters.NORM.calls) == (1, 1, 0) and not ledger.COUNTS
    delta.replay()
    delta.replay()
    assert (counters.KDA.fused, counters.KDA.calls) == (1 + 2 * 2, 1 + 2 * 3)
    assert (counters.NORM.fused, counters.NORM.calls) == (0, 2)
    assert ledger.COUNTS == {site: 4}
    counters.KDA.reset(), counters.NORM.reset()
    ledger.COUNTS.clear()


@pytest.mark.parametrize("model,name", [({"mor": True}, "mor"), ({"n_experts": 4}, "n_experts")])
def test_paths_a_graph_cannot_hold_are_refused(model, name):
    cfg = config.build("nano", {"model": model, "train": {"cuda_graph": True}})
    with pytest.raises(ConfigError, match=f"cuda_graph with {name} is not built"):
        config_checks.validate(cfg)


def test_experts_with_dense_dispatch_are_held_by_a_graph():
    config_checks.validate(
        config.build("nano", {"model": {"n_experts": 4, "experts_dense": True}, "train": {"cuda_graph": True}})
    )


def test_random_depth_is_held_by_one_graph_per_depth():
    config_checks.validate(config.build("nano", {"train": {"cuda_graph": True, "rand_depth": True}}))  # not refused


def test_random_depth_that_leaves_the_engram_untrained_at_some_depths_is_refused():
    # depth 3, gradients through the last 2 iterations: the engram (first iteration only) trains at depths
    # 1 and 2, not at 3; the captured update cannot skip parameters per step as the eager one does (no
    # depth over 1 trains it with min 2 and bptt 1: one set of gradients, allowed)
    train = {"cuda_graph": True, "rand_depth": True, "rand_depth_bptt": 2}
    with pytest.raises(
        ConfigError, match="rand_depth_bptt is not built: the engram gets gradients at some sampled depths"
    ):
        config_checks.validate(config.build("nano", {"model": {"depth": 3, "engram": True}, "train": train}))
    config_checks.validate(config.build("nano", {"model": {"depth": 3, "engram": False}, "train": train}))
    one_set = {**train, "rand_depth_min": 2, "rand_depth_bptt": 1}
    config_checks.validate(config.build("nano", {"model": {"depth": 3, "engram": True}, "train": one_set}))


def test_cuda_graph_needs_one_process_on_cuda():
    cfg = config.build("nano", {"train": {"cuda_graph": True}})
    with pytest.raises(ConfigError, match="cuda_graph needs one process on CUDA; this run is device cpu"):
        resolve(cfg, cuda_available=False)
    with pytest.raises(ValueError, match="needs a CUDA device"):
        GraphedStep(small_model(), None, torch.device("cpu"))


def test_the_look_up_before_a_replay_does_not_sync_on_the_bytes(monkeypatch):
    # A range check of the batch's bytes (a host sync on CUDA) before each replay made the host wait for
    # the previous update: the look-up hashes the sampler's bytes unchecked, to the same keys.
    from dormouse.model import engram, engram_keys

    model = small_model()
    x, _ = batch()
    expected = {j: engram.global_rows(m.keys(x), m.rows) for j, m in model.memories()}

    def sync(x, name):
        raise AssertionError("the look-up checked the bytes' range")

    monkeypatch.setattr(engram_keys, "_check_bytes", sync)
    rows = {j: torch.zeros(*x.shape, m.arms, m.dim) for j, m in model.memories()}
    looked_up = look_up_rows_(model, x, rows)
    assert looked_up.keys() == expected.keys()
    assert all(torch.equal(looked_up[j], expected[j]) for j in expected)


def test_rows_hashed_ahead_give_the_same_look_up():
    # GraphedStep.prefetch hashes a later batch while the GPU runs the step before; its look-up gathers
    # the same rows into the static leaves as hashing then would.
    model = small_model()
    x, _ = batch()
    rows = {j: torch.zeros(*x.shape, m.arms, m.dim) for j, m in model.memories()}
    here = {j: r.clone() for j, r in rows.items()}
    looked_up = look_up_rows_(model, x, here)
    ahead = table_rows(model, x)
    assert look_up_rows_(model, x, rows, ahead) is ahead
    assert all(torch.equal(ahead[j], looked_up[j]) and torch.equal(rows[j], here[j]) for j in rows)
