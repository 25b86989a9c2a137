"""Every site registered in the fallback ledger is reachable: one trigger per site, through the code that owns
it, and the ledger must record that site firing (ledger.FIRED). A site registered without a trigger here
fails `test_every_registered_site_has_a_trigger`, naming it. A trigger takes the test's tmp_path and
monkeypatch."""

import json
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from dormouse import checkpoint, ledger, rng
from dormouse.data.prepare import prepare
from dormouse.data.shards import load_corpus


def _save(run: Path, step: int) -> Path:
    state = {"run_id": "reach", "best_bpb": None, "best_step": None, "sampler": {}, "stress": {}, "extra": {}}
    return checkpoint.save(run, step, model_state={"w": torch.zeros(4)}, optimizer_state={}, state=state)


def _damaged_shard(tmp: Path, damage) -> None:
    src = tmp / "d.bin"
    src.write_bytes(bytes(range(256)) * 2)
    prepare([src], tmp / "c", heldout_tail=0.2, shard_bytes=100)
    damage(tmp / "c" / "train-00001.bin")
    load_corpus(tmp / "c")


def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))


def checkpoint_file_missing(tmp: Path, monkeypatch) -> None:
    checkpoint.load(tmp, "step-5")  # no such checkpoint directory


def checkpoint_hash_mismatch(tmp: Path, monkeypatch) -> None:
    _flip_byte(_save(tmp, 1) / checkpoint.MODEL)
    checkpoint.load(tmp)


def checkpoint_step_mismatch(tmp: Path, monkeypatch) -> None:
    path = _save(tmp, 10)
    renamed = path.rename(path.with_name(checkpoint.step_dir_name(11)))  # its state.json says step 10
    checkpoint.load(tmp, renamed)


def checkpoint_orphan_removed(tmp: Path, monkeypatch) -> None:
    path = _save(tmp, 10)
    shutil.copytree(path, path.with_name(checkpoint.step_dir_name(20)))  # renamed, never committed
    _save(tmp, 11)


def data_shard_unstatable(tmp: Path, monkeypatch) -> None:
    _damaged_shard(tmp, Path.unlink)


def data_shard_empty(tmp: Path, monkeypatch) -> None:
    _damaged_shard(tmp, lambda p: p.write_bytes(b""))


def data_shard_size_mismatch(tmp: Path, monkeypatch) -> None:
    _damaged_shard(tmp, lambda p: p.write_bytes(p.read_bytes() + b"\0"))


def data_shard_hash_mismatch(tmp: Path, monkeypatch) -> None:
    _damaged_shard(tmp, _flip_byte)


def kda_fla_unavailable(tmp: Path, monkeypatch) -> None:
    from dormouse.ops import kda, registry

    registry.resolve(kda.OP.name, "fla", torch.device("cpu"))


def norm_fused_unavailable(tmp: Path, monkeypatch) -> None:
    from dormouse.ops import norm, registry

    registry.resolve(norm.OP.name, "fused", torch.device("cpu"))


def conv_fused_unavailable(tmp: Path, monkeypatch) -> None:
    from dormouse.ops import registry, short_conv

    registry.resolve(short_conv.OP.name, "fused", torch.device("cpu"))


def swiglu_fused_unavailable(tmp: Path, monkeypatch) -> None:
    from dormouse.ops import registry, swiglu

    registry.resolve(swiglu.OP.name, "fused", torch.device("cpu"))


def optim_sinkhorn_kernels_unavailable(tmp: Path, monkeypatch) -> None:
    from dormouse.ops import registry, sinkhorn

    monkeypatch.setattr(registry, "own_kernels", lambda module: (None, "ImportError: no Triton (test)"))
    sinkhorn.kernels(torch.device("cuda"))


def sparse_row_sum_kernels_unavailable(tmp: Path, monkeypatch) -> None:
    from dormouse.ops import registry, row_sum

    monkeypatch.setattr(registry, "own_kernels", lambda module: (None, "ImportError: no Triton (test)"))
    row_sum.kernels(torch.device("cuda"))


def precision_triton_switch(tmp: Path, monkeypatch) -> None:
    import sys
    import types

    from dormouse.model import precision

    precision.apply("bf16")
    monkeypatch.setitem(sys.modules, "triton", types.ModuleType("triton"))  # as if its kernels had compiled
    precision.apply("fp32")


def _memory(mode: str):
    from dormouse.model.memory import PersistentMemory

    return PersistentMemory(2, 8, mode, generator=rng.generator(0, 0, "test"))


def memory_skipped(tmp: Path, monkeypatch) -> None:
    _memory("enabled").prepend(torch.zeros(1, 3, 8), use_memory=False)


def memory_enforced(tmp: Path, monkeypatch) -> None:
    _memory("enforced").prepend(torch.zeros(1, 3, 8), use_memory=False)


def fla_unpinned(tmp: Path, monkeypatch) -> None:
    # fla and Triton exist only on the GPU machine: a stand-in autotuner holds one kernel choice, and a
    # stand-in of fla's config lookup finds no pinned entry for it (what fla returns for an unpinned key).
    from dormouse.ops.fla import pin as fla_pin

    lookup = SimpleNamespace(AutotuneKey=lambda key: key, load_cached_config=lambda kernel, key: None)
    monkeypatch.setitem(sys.modules, "fla.ops.utils.cache", lookup)
    monkeypatch.setattr(fla_pin, "_autotuners", lambda: iter([("kernel", SimpleNamespace(cache={("key",): 0}))]))
    monkeypatch.setattr(fla_pin, "_counted", {})
    fla_pin.count_unpinned()


def fla_borrowed_pin(tmp: Path, monkeypatch) -> None:
    # A made-up card of the H200's compute capability, with no pin of its own, borrows the H200's.
    from dormouse.ops.fla import pin as fla_pin

    source = fla_pin.kernel_source("Fake GPU X9", (9, 0), {"HOME": str(tmp)})
    fla_pin._apply(source, {}, lambda *hook: None)


def fla_borrowed_entry(tmp: Path, monkeypatch) -> None:
    # The H100's pin lacks fla's causal_conv1d kernels: the H200's fill them; a stand-in autotuner ran the
    # H200's config for one of their keys, which a stand-in of fla's lookup finds.
    from dormouse.ops.fla import pin as fla_pin

    source = fla_pin.kernel_source("NVIDIA H100 80GB HBM3", (9, 0), {"HOME": str(tmp)})
    monkeypatch.setattr(fla_pin, "_borrowed", {})
    fla_pin._apply(source, {}, lambda *hook: None)
    kernel = "causal_conv1d_fwd_kernel"
    entry = next(iter(json.loads((source.store / f"{kernel}.json").read_text())["autotune_entries"].values()))
    key, found = tuple(entry["autotune_key"]), entry["config"]
    lookup = SimpleNamespace(AutotuneKey=lambda key: key, load_cached_config=lambda kernel, key: found)
    monkeypatch.setitem(sys.modules, "fla.ops.utils.cache", lookup)
    ran = SimpleNamespace(kwargs=found["kwargs"], num_warps=found["num_warps"], num_stages=found["num_stages"])
    monkeypatch.setattr(fla_pin, "_autotuners", lambda: iter([(kernel, SimpleNamespace(cache={key: ran}))]))
    monkeypatch.setattr(fla_pin, "_counted_borrowed", set())
    fla_pin.count_borrowed()


def precompile_skipped(tmp: Path, monkeypatch) -> None:
    # Triton exists only on the GPU machine: a stand-in before 3.5, without the hook the dry pass needs.
    from dormouse.ops import precompile

    monkeypatch.setitem(sys.modules, "triton", SimpleNamespace(knobs=SimpleNamespace(runtime=SimpleNamespace())))
    monkeypatch.setitem(sys.modules, "triton.runtime", SimpleNamespace())
    monkeypatch.setitem(sys.modules, "triton.runtime.autotuner", SimpleNamespace(Autotuner=object))
    precompile.compile_ahead(lambda: None)


TRIGGERS = {
    "checkpoint.file_missing": checkpoint_file_missing,
    "checkpoint.hash_mismatch": checkpoint_hash_mismatch,
    "checkpoint.step_mismatch": checkpoint_step_mismatch,
    "checkpoint.orphan_removed": checkpoint_orphan_removed,
    "data.shard_unstatable": data_shard_unstatable,
    "data.shard_empty": data_shard_empty,
    "data.shard_size_mismatch": data_shard_size_mismatch,
    "data.shard_hash_mismatch": data_shard_hash_mismatch,
    "kda.fla_unavailable": kda_fla_unavailable,
    "norm.fused_unavailable": norm_fused_unavailable,
    "conv.fused_unavailable": conv_fused_unavailable,
    "swiglu.fused_unavailable": swiglu_fused_unavailable,
    "optim.sinkhorn_kernels_unavailable": optim_sinkhorn_kernels_unavailable,
    "precision.triton_switch": precision_triton_switch,
    "sparse.row_sum_kernels_unavailable": sparse_row_sum_kernels_unavailable,
    "memory.skipped": memory_skipped,
    "memory.enforced": memory_enforced,
    "fla.unpinned": fla_unpinned,
    "fla.borrowed_pin": fla_borrowed_pin,
    "fla.borrowed_entry": fla_borrowed_entry,
    "precompile.skipped": precompile_skipped,
}


def untriggered_and_stale() -> tuple[list[str], list[str]]:
    registered = {s.name for s in ledger.all_sites()}
    return sorted(registered - set(TRIGGERS)), sorted(set(TRIGGERS) - registered)


def test_every_registered_site_has_a_trigger():
    untriggered, stale = untriggered_and_stale()
    assert not untriggered, f"ledger sites no test triggers (add them to TRIGGERS): {untriggered}"
    assert not stale, f"TRIGGERS names sites the ledger no longer registers: {stale}"


def test_a_new_site_without_a_trigger_is_named(monkeypatch):
    site = ledger.Site("test.new_site", ledger.Kind.LOUD, "a site registered without a trigger", __name__)
    monkeypatch.setitem(ledger.SITES, site.name, site)
    assert untriggered_and_stale() == (["test.new_site"], [])


@pytest.mark.parametrize("site", sorted(TRIGGERS))
def test_the_site_fires(site, tmp_path, monkeypatch):
    kind = {s.name: s.kind for s in ledger.all_sites()}[site]
    counts = ledger.COUNTS.copy()
    ledger.FIRED.discard(site)
    try:
        if kind is ledger.Kind.LOUD:
            with pytest.raises(ledger.FallbackRefused) as refused:
                TRIGGERS[site](tmp_path, monkeypatch)
            assert refused.value.site == site
        else:
            TRIGGERS[site](tmp_path, monkeypatch)
            assert ledger.COUNTS[site] == counts[site] + 1
        assert site in ledger.FIRED
    finally:
        ledger.COUNTS.clear()
        ledger.COUNTS.update(counts)
