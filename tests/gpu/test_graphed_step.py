"""--cuda-graph on CUDA: a run whose forward and backward are replayed from a captured graph, and its
clip and NesterovSinkhorn step from a second one, trains exactly as the eager run (losses, evals and
final weights bitwise; kernel counters equal); skipped without CUDA or fla. The parts that need no GPU:
tests/test_graphed.py and tests/test_graphed_update.py."""

import json

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)
# fla through dormouse, never directly: fla reads the kernel pin's variables once, at its import, and a
# direct import before them left every kernel to Triton's timing (minutes of autotuning, other kernels).
from dormouse.ops.fla import kernels as fla_kernels  # noqa: E402

if fla_kernels.chunk_kda()[0] is None:
    pytest.skip(f"needs fla-core (extra `gpu`): {fla_kernels.chunk_kda()[1]}", allow_module_level=True)

from dormouse import config  # noqa: E402
from dormouse.data.shards import load_corpus  # noqa: E402
from dormouse.evaluation import NonFiniteError  # noqa: E402
from dormouse.resolve import resolve
from dormouse.train.trainer import Trainer  # noqa: E402


def records(run, kind):
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == kind]


AUX = {"jepa_weight": 0.2, "dspark_weight": 0.2, "engram_layers": "0,1"}
# `small`'s widths at T 256, B 64 (the quality runs' shape): fla's kernels are the ones those runs
# compiled and pinned, so the tests do not autotune for minutes on a cold machine.
SHAPE = {
    "d_model": 512,
    "n_heads": 8,
    "head_dim": 64,
    "block_layers": 2,
    "ffn_hidden": 1536,
    "engram": True,
    "engram_rows": 4096,
}


def graphed_trainer(random_corpus, run) -> Trainer:
    """A --cuda-graph trainer of SHAPE at T 256, B 64, bf16, for 8 steps."""
    corpus = load_corpus(random_corpus(20000, repeats=2))
    train = {"seq_len": 256, "batch_size": 64, "steps": 8, "eval_every": 4, "dtype": "bf16", "cuda_graph": True}
    cfg = resolve(config.build("nano", {"model": SHAPE, "train": train}))
    return Trainer(cfg, corpus, run, corpus_note="test corpus")


# bf16 autocast, and fp32 weights on TF32 kernels; not IEEE fp32, whose Triton kernels take ~4 minutes
# to compile and autotune on a cold machine. Dropout:
# the captured masks come from a registered generator reseeded per step, the eager ones from a fresh one.
# The weight average swaps itself into the captured parameters for each eval and back (in place); byte
# noise changes the batch before it is copied into the graph's inputs.
AVERAGED = {"ema_decay": 0.9, "byte_noise": 0.05}


@pytest.mark.parametrize(
    "model,dtype,extra",
    [
        ({}, "bf16", {}),
        ({"dropout": 0.2}, "bf16", {}),
        ({"drop_path": 0.2}, "bf16", {}),
        ({"engram_dropout": 0.3}, "bf16", {}),
        (AUX, "bf16", {}),
        ({"mixer": "attention"}, "bf16", {}),
        ({"n_experts": 4, "experts_dense": True}, "bf16", {}),
        ({}, "bf16", AVERAGED),
        ({"depth": 3}, "bf16", {"rand_depth": True}),
        ({"depth": 3, "engram": False}, "bf16", {"rand_depth": True, "rand_depth_bptt": 2}),
        ({}, "tf32", {}),
        ({"dropout": 0.2, **AUX}, "tf32", {}),
    ],
    ids=[
        "default-bf16",
        "dropout-bf16",
        "drop-path-bf16",
        "engram-dropout-bf16",
        "aux-terms-two-memories-bf16",
        "attention-bf16",
        "experts-dense-bf16",
        "ema-byte-noise-bf16",
        "rand-depth-bf16",
        "rand-depth-bptt-no-engram-bf16",
        "default-tf32",
        "all-tf32",
    ],
)
def test_graphed_run_equals_eager_run_bitwise(random_corpus, tmp_path, model, dtype, extra):
    corpus = load_corpus(random_corpus(20000, repeats=2))
    train = {"seq_len": 256, "batch_size": 64, "steps": 8, "warmup_steps": 2, "eval_every": 4, "dtype": dtype, **extra}
    # Eager, graphed, eager again: a kernel autotuned inside the first run (counted as fla.unpinned on its
    # eval line) is told apart from a graph that computes differently. The graph is held to the second.
    runs = []
    for i, graph in enumerate((False, True, False)):
        cfg = config.build("nano", {"model": {**SHAPE, **model}, "train": {**train, "cuda_graph": graph}})
        run = tmp_path / f"run-{i}-graph-{graph}"
        trainer = Trainer(resolve(cfg), corpus, run, corpus_note="test corpus")
        trainer.run_loop()
        weights = {k: v.detach().cpu() for k, v in trainer.model.state_dict().items()}
        runs.append((records(run, "train"), records(run, "eval"), weights, trainer))
    first, (graph_train, graph_evals, graph_w, graphed), (eager_train, eager_evals, eager_w, _) = runs
    runner = graphed.step_runner
    assert runner.graphed.replays == 8
    # one graph per loop depth the steps drew (--rand-depth: depths 1..3 over 8 steps; else the config's)
    drawn = {runner.step_depth(s) for s in range(8)}
    assert sorted(runner.graphed.captures) == sorted(drawn) and (len(drawn) > 1) == bool(extra.get("rand_depth"))
    assert runner.graphed_update.calls == 8 and runner.graphed_update.graph is not None
    assert [r["ce"] for r in graph_train] == [r["ce"] for r in eager_train]
    for g, e in zip(graph_evals, eager_evals, strict=True):
        assert all(g[k] == e[k] for k in ("bpb", "kda", "norm", "conv", "engram")), (g, e)
    assert graph_w.keys() == eager_w.keys()
    for k in eager_w:
        assert torch.equal(graph_w[k], eager_w[k]), k
    if extra.get("ema_decay"):  # the averages too, and the evals scored them
        assert all(torch.equal(g, e) for g, e in zip(graphed.ema.average, runs[2][3].ema.average, strict=True))
        assert graph_evals[-1]["weights"] == "ema0.9"
    # Two eager runs of one process agree too (what `dormouse replay` checks across processes).
    assert [r["ce"] for r in first[0]] == [r["ce"] for r in eager_train]


def test_a_graphed_step_with_a_nan_loss_stops_with_every_weight_and_state_as_before(random_corpus, tmp_path):
    """The graphed update is queued before the step's check and skipped on the device when a loss term is
    not finite (train/graphed_update.py): the run stops at that step, and neither the weights nor any
    optimizer state (the captured NesterovSinkhorn's momentum, fused AdamW's, the tables' rows) moved."""
    trainer = graphed_trainer(random_corpus, tmp_path / "run")
    trainer.run_loop(until_step=3)  # the update's graph is captured at the second step, replayed at the third
    assert trainer.step_runner.graphed_update.graph is not None
    with torch.no_grad():
        trainer.model.final_norm.weight[0] = float("nan")  # in place: the captured forward reads it
    weights = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    state = [v.clone() for o in trainer.opt.optimizers.values() for s in o.state.values() for v in s.values()]
    with pytest.raises(NonFiniteError, match="step 3: training loss is nan"):
        trainer.run_loop()
    after = trainer.model.state_dict()
    assert all(
        torch.equal(
            weights[k],
            after[k],
        )
        for k in weights
        if k != "final_norm.weight"
    )
    assert torch.equal(weights["final_norm.weight"].nan_to_num(), after["final_norm.weight"].nan_to_num())
    moved = [v for o in trainer.opt.optimizers.values() for s in o.state.values() for v in s.values()]
    assert len(moved) == len(state) and all(torch.equal(a, b) for a, b in zip(state, moved, strict=True))


def test_a_graphed_step_waits_for_the_gpu_only_at_its_check(random_corpus, tmp_path):
    """After the captures, a step's one host sync is the check's read of the loss terms: the batch's
    copy, the look-up, the coalescing of the tables' gradients (RowPlan, planned ahead) and the update
    are queued without waiting, so the GPU runs while the host launches."""
    import warnings

    trainer = graphed_trainer(random_corpus, tmp_path / "run")
    trainer.run_loop(until_step=3)
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            trainer.train_step(3)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = [f"{w.filename}:{w.lineno}: {w.message}" for w in caught if "called a synchronizing" in str(w.message)]
    assert len(syncs) == 1 and "step_runner.py" in syncs[0], syncs
    # and the next step's inputs were filled before that wait (GraphedStep.stage), for its replay to take
    runner = trainer.step_runner
    assert runner.graphed.staged is not None and runner.graphed.staged[0] is runner.next_batch[1][0]
