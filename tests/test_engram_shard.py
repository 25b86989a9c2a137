"""Row-sharded engram tables without torchrun: the partition, and one lookup and its gradient routed
through the stages of `dormouse.parallel.engram_shard` for W ranks simulated in one process (the
all-to-alls done by hand), against the replicated path (nn.Embedding + `average_sparse_grads_`'s sum).
The collectives themselves run in tests/test_distributed.py::test_sharded_engram_tables_*."""

import pytest
import torch
from torch import nn

from dormouse import config, config_flags
from dormouse.cli import build_parser
from dormouse.errors import ConfigError
from dormouse.parallel import engram_shard as es
from dormouse.parallel.world import World


def test_row_i_lives_on_rank_i_mod_w_and_the_shards_make_up_the_table():
    rows = torch.arange(10)
    assert es.owner(rows, 3).tolist() == [0, 1, 2, 0, 1, 2, 0, 1, 2, 0]
    assert es.local_index(rows, 3).tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3]
    assert [es.shard_size(10, r, 3) for r in range(3)] == [4, 3, 3]
    assert [es.shard_size(2, r, 4) for r in range(4)] == [1, 1, 0, 0]
    table = nn.Embedding(10, 4)
    shards = [es.ShardedTable(table, r, 3) for r in range(3)]
    assert [s.weight.shape[0] for s in shards] == [4, 3, 3]
    for s in shards:  # rows r, r + W, ...: the whole table's rows
        assert torch.equal(s.weight, table.weight[s.rank :: 3])
        assert s._dormouse_route == "sparse"


def _all_to_all(sends: list[torch.Tensor], counts: list[torch.Tensor]) -> list[torch.Tensor]:
    """What `all_to_all_single` does for W ranks: rank r's chunk s (sizes counts[r]) goes to rank s."""
    chunks = [list(torch.split(buf, c.tolist())) for buf, c in zip(sends, counts, strict=True)]
    return [torch.cat([chunks[r][s] for r in range(len(sends))]) for s in range(len(sends))]


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_a_routed_lookup_and_its_gradient_equal_the_replicated_table(world_size):
    gen = torch.Generator().manual_seed(world_size)
    n, dim, arms = 50, 4, 3
    table = nn.Embedding(n, dim, sparse=True)
    idx = [torch.randint(0, n, (2, 7, arms), generator=gen) for _ in range(world_size)]  # duplicates, gaps
    idx[-1] = idx[-1][:0] if world_size > 1 else idx[-1]  # a rank that asks nothing (the eval's idle rank)
    shards = [es.ShardedTable(table, r, world_size).weight.detach() for r in range(world_size)]
    reqs = [es.Request(i, world_size) for i in idx]
    recv_counts = _all_to_all([q.counts for q in reqs], [torch.ones(world_size, dtype=torch.int64)] * world_size)
    ids = _all_to_all([q.ids for q in reqs], [q.counts for q in reqs])
    served = [es.serve(shards[r], ids[r], world_size) for r in range(world_size)]
    back = _all_to_all(served, recv_counts)
    for r in range(world_size):  # forward: copies of the rows, bitwise
        assert torch.equal(reqs[r].assemble(back[r]), table(idx[r]))
    # Backward: the replicated path's gradient, then the routed one, shard by shard.
    grads = [torch.randn(*i.shape, dim, generator=gen) for i in idx]
    rows, values = [], []
    for i, g in zip(idx, grads, strict=True):
        table.weight.grad = None
        table(i).backward(g)
        if i.numel():
            mine = table.weight.grad.coalesce()
            rows.append(mine.indices()[0])
            values.append(mine.values())
    total = torch.sparse_coo_tensor(torch.cat(rows).unsqueeze(0), torch.cat(values), (n, dim)).coalesce()
    averaged = total.values() / world_size  # as `average_sparse_grads_` divides the gathered sum
    sent = [q.gradients(g, n) for q, g in zip(reqs, grads, strict=True)]
    got = _all_to_all(sent, [q.counts for q in reqs])
    for r in range(world_size):
        grad = es.owner_gradient(ids[r], got[r], shards[r].shape[0], world_size)
        local = grad.indices()[0]
        global_rows = local * world_size + r
        at = torch.searchsorted(total.indices()[0], global_rows)
        assert torch.equal(total.indices()[0][at], global_rows)  # the rows this owner was sent, no others
        assert torch.equal(grad.values(), averaged.index_select(0, at)), f"rank {r}: not bitwise"
    touched = sum(es.owner_gradient(ids[r], got[r], shards[r].shape[0], world_size)._nnz() for r in range(world_size))
    assert touched == total._nnz()


def test_a_whole_table_and_its_optimizer_state_load_as_this_ranks_rows():
    table = nn.Embedding(10, 2)
    whole = torch.arange(20.0).reshape(10, 2)
    model = nn.Module()
    model.table = es.ShardedTable(table, 1, 3)
    model.load_state_dict({"table.weight": whole})
    assert torch.equal(model.table.weight, whole[1::3])
    model.load_state_dict({"table.weight": whole[1::3].clone()})  # a shard-sized state loads as is
    state = {"table.weight.exp_avg": whole, "table.weight.step": torch.arange(10), "other.exp_avg": whole}
    local = es.local_table_state(model, state)
    assert torch.equal(local["table.weight.exp_avg"], whole[1::3])
    assert local["table.weight.step"].tolist() == [1, 4, 7]
    assert local["other.exp_avg"] is whole


def test_alone_sharding_is_a_no_op():
    model = nn.Module()
    model.table = nn.Embedding(4, 2)
    assert es.shard_tables_(model, World()) == 0 and isinstance(model.table, nn.Embedding)
    assert es.sharded_tables(model) == [] and es.gather_shards(model, None, World()) is None
    es.idle_lookups(model, 3)  # no sharded table: nothing to join


def _config(*flags):
    return config_flags.config_from_args(build_parser().parse_args(["train", "--data", "D", *flags]))


# Sharded tables: the engram on, and no weight average (ema_decay of sharded parameters is refused).
SHARD = ("--engram", "--engram-shard", "--ema-decay", "0")


def test_engram_shard_flag_is_refused_where_it_cannot_apply(monkeypatch):
    assert not _config().train.engram_shard
    with pytest.raises(ConfigError, match=r"engram_shard with engram off \(--engram-shard with --no-engram\)"):
        _config("--engram-shard", "--no-engram")
    with pytest.raises(ConfigError, match=r"engram_shard needs parallel ddp .*--parallel none"):
        _config(*SHARD)
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert _config(*SHARD).train.engram_shard
    with pytest.raises(ConfigError, match="engram_shard is built for parallel ddp, not fsdp"):
        _config(*SHARD, "--parallel", "fsdp")


def test_engram_shard_may_change_on_resume_either_way(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    saved = _config(*SHARD)

    def resume(*flags) -> config.Config:
        return config_flags.resume_config(saved, build_parser().parse_args(["train", "--resume", "RUN", *flags]))

    assert resume().train.engram_shard
    assert not resume("--no-engram-shard").train.engram_shard
    monkeypatch.delenv("WORLD_SIZE")  # alone: the sharded run goes on with whole tables (a no-op)
    alone = resume()
    assert (alone.train.parallel, alone.train.engram_shard) == ("none", True)
