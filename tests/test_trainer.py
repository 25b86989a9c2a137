"""Trainer gates: determinism, resume == uninterrupted, best kept, non-finite stops, lr 0, eval CLI."""

import contextlib
import dataclasses
import json
import math
import os
import random
import re
import signal

import numpy as np
import pytest
import safetensors.torch
import torch

from dormouse import checkpoint, config, counters, evaluation, ledger
from dormouse.cli import main
from dormouse.data.shards import load_corpus
from dormouse.errors import DormouseError
from dormouse.evaluation import NonFiniteError, heldout_score
from dormouse.model.loop import sample_depth
from dormouse.model.model import DormouseLM
from dormouse.ops import precompile
from dormouse.ops.fla import pin as fla_pin
from dormouse.resolve import resolve
from dormouse.train.trainer import Trainer


@pytest.fixture(scope="module")
def corpus(random_corpus):
    return load_corpus(random_corpus(6000, repeats=2))  # repeated, so the model can learn something


def tiny_config(engram=None, **train):
    """A small run with the engram on and dropout off; `engram` overrides model fields, `train` run fields."""
    values = {"seq_len": 32, "batch_size": 4, "steps": 12, "warmup_steps": 2, "eval_every": 4, "ckpt_every": 4}
    values.update(train)
    model = {"d_model": 32, "n_heads": 2, "ffn_hidden": 64, "kda_chunk_size": 16, "engram_rows": 1024, "engram_dim": 8}
    model |= {"engram": True, "dropout": 0.0}
    cfg = config.build("nano", {"model": {**model, **(engram or {})}, "train": values})
    return resolve(cfg, cuda_available=False)


def train_losses(run) -> list[float]:
    return [r["ce"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "train"]


def evals(run) -> list[dict]:
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "eval"]


def fresh(cfg, corpus, run, resume=False):
    return Trainer(cfg, corpus, run, corpus_note="test corpus", resume=resume)


def test_same_seed_twice_is_bitwise_identical_and_learns(corpus, tmp_path):
    cfg = tiny_config()
    a, b = fresh(cfg, corpus, tmp_path / "a"), fresh(cfg, corpus, tmp_path / "b")
    torch.manual_seed(1)  # the global RNG is not used: reseeding it changes nothing
    a.run_loop()
    torch.manual_seed(2)
    b.run_loop()
    assert train_losses(tmp_path / "a") == train_losses(tmp_path / "b")
    assert len(train_losses(tmp_path / "a")) == 12
    first, last = evals(tmp_path / "a")[0], evals(tmp_path / "a")[-1]
    assert last["bpb"] < first["bpb"] < 8.2
    assert last["bpb"] == pytest.approx(last["ce"] / math.log(2), rel=1e-12)
    assert last["heldout_bytes"] == corpus.split_size("heldout") - 1  # the whole split, each byte once
    seed1 = fresh(tiny_config(seed=1), corpus, tmp_path / "c")
    seed1.run_loop()
    assert train_losses(tmp_path / "c") != train_losses(tmp_path / "a")


def test_interrupted_and_resumed_equals_uninterrupted(corpus, tmp_path):
    cfg = tiny_config()
    whole = fresh(cfg, corpus, tmp_path / "whole")
    whole.run_loop()
    part = fresh(cfg, corpus, tmp_path / "part")
    part.run_loop(until_step=6)  # stops after step 6 with a checkpoint
    assert checkpoint.last_step(tmp_path / "part") == 6
    resumed = fresh(cfg, corpus, tmp_path / "part", resume=True)
    assert resumed.step == 6
    resumed.run_loop()
    assert train_losses(tmp_path / "part") == train_losses(tmp_path / "whole")
    a, b = whole.model.state_dict(), resumed.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert resumed.stress.state_dict() == whole.stress.state_dict()
    whole_evals = {e["step"]: e["bpb"] for e in evals(tmp_path / "whole")}
    part_evals = {e["step"]: e["bpb"] for e in evals(tmp_path / "part")}
    assert part_evals == {**whole_evals, 6: part_evals[6]}  # plus the eval the stop at step 6 made


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_stops_at_the_step_boundary_with_a_checkpoint_and_the_resume_is_the_whole_run(
    sig, corpus, tmp_path, monkeypatch
):
    """Ctrl-C or a preemption's SIGTERM during step 6 (0-based 5): the step finishes, a checkpoint follows
    with no eval the schedule did not ask for (evals every 4), the run raises KeyboardInterrupt; the resume
    continues it bit for bit, its losses and its evals."""
    whole = fresh(tiny_config(), corpus, tmp_path / "whole")
    whole.run_loop()
    part = fresh(tiny_config(), corpus, tmp_path / "part")
    step = part.train_step

    def signalled(i):
        ce = step(i)
        if i == 5:
            os.kill(os.getpid(), sig)  # delivered to the main thread before the next bytecode
        return ce

    monkeypatch.setattr(part, "train_step", signalled)
    previous = signal.getsignal(sig)
    with pytest.raises(KeyboardInterrupt):
        part.run_loop()
    assert signal.getsignal(sig) is previous  # the handlers are the caller's again
    assert checkpoint.last_step(tmp_path / "part") == 6 and [e["step"] for e in evals(tmp_path / "part")] == [4]
    assert (
        f"interrupted: stopped after step 6 with a checkpoint; --resume {tmp_path / 'part'}"
        in (tmp_path / "part" / "train.log").read_text()
    )
    resumed = fresh(tiny_config(), corpus, tmp_path / "part", resume=True)
    resumed.run_loop()
    assert train_losses(tmp_path / "part") == train_losses(tmp_path / "whole")
    scores = [[(e["step"], e["bpb"]) for e in evals(tmp_path / run)] for run in ("part", "whole")]
    assert scores[0] == scores[1] and len(scores[0]) == 3


def test_a_signal_in_the_last_step_still_ends_on_the_final_eval(corpus, tmp_path, monkeypatch):
    """The last step is the run's end: its eval comes even when a signal arrives in it (steps 6, evals
    every 4: the final eval at 6 is not scheduled, and no resume would have a step left to give it)."""
    run = fresh(tiny_config(steps=6), corpus, tmp_path / "r")
    step = run.train_step

    def signalled(i):
        ce = step(i)
        if i == 5:
            os.kill(os.getpid(), signal.SIGTERM)
        return ce

    monkeypatch.setattr(run, "train_step", signalled)
    with pytest.raises(KeyboardInterrupt):
        run.run_loop()
    assert checkpoint.last_step(tmp_path / "r") == 6 and [e["step"] for e in evals(tmp_path / "r")] == [4, 6]


def test_resume_keeps_a_better_best(corpus, tmp_path):
    run = tmp_path / "run"
    trainer = fresh(tiny_config(), corpus, run)
    trainer.run_loop(until_step=8)
    best_before = checkpoint.best_bpb(run)
    best_step = json.loads((run / "ckpt" / "best").read_text())["step"]
    # Resume with a learning rate that wrecks the model: later evals are worse and must not become best.
    resumed = fresh(tiny_config(), corpus, run, resume=True)
    assert resumed.evaluator.best_bpb == best_before
    resumed.opt.base_lr = dict.fromkeys(resumed.opt.base_lr, 20.0)
    resumed.run_loop()
    assert max(e["bpb"] for e in evals(run) if e["step"] > 8) > best_before
    assert checkpoint.best_bpb(run) == best_before
    assert json.loads((run / "ckpt" / "best").read_text())["step"] == best_step
    assert checkpoint.load(run, "best").step == best_step


def test_nonfinite_loss_stops_loudly_and_saves_nothing(corpus, tmp_path, monkeypatch):
    run = tmp_path / "run"
    trainer = fresh(tiny_config(), corpus, run)
    trainer.run_loop(until_step=4)
    best = (run / "ckpt" / "best").read_text()
    forward = trainer.model.forward

    def poisoned(*args, **kwargs):
        out = forward(*args, **kwargs)
        out.loss = out.loss * float("nan")
        return out

    monkeypatch.setattr(trainer.model, "forward", poisoned)
    with pytest.raises(NonFiniteError, match="step 4: training loss is nan"):
        trainer.run_loop()
    assert checkpoint.last_step(run) == 4
    assert (run / "ckpt" / "best").read_text() == best
    assert not any("nan" in line for line in (run / "metrics.jsonl").read_text().splitlines())


def test_lr_zero_leaves_every_parameter_bit_identical(corpus, tmp_path):
    trainer = fresh(tiny_config(lr=0.0, weight_decay=0.1), corpus, tmp_path / "run")
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    trainer.train_step(0)
    after = trainer.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_a_step_s_phases_are_named_for_the_profiler(corpus, tmp_path):
    # bench --profile's idle gaps line names the phase the host was in while the device waited.
    trainer = fresh(tiny_config(), corpus, tmp_path / "run")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        trainer.train_step(0)
    names = {e.key for e in prof.key_averages()}
    assert {"dormouse.batch", "dormouse.forward_backward", "dormouse.update", "dormouse.check"} <= names


def test_a_step_reads_the_next_batch_while_the_gpu_runs_it(corpus, tmp_path):
    trainer = fresh(tiny_config(), corpus, tmp_path / "run")
    t = trainer.cfg.train
    trainer.train_step(0)
    step, (x, y, _) = trainer.step_runner.next_batch
    expected = trainer.step_runner.sampler.batch(t.seed, 1)
    assert step == 1 and torch.equal(x, expected[0]) and torch.equal(y, expected[1])
    assert trainer.step_runner.batch(1) is trainer.step_runner.next_batch[1]  # used as read
    fresh_x, _, _ = trainer.step_runner.batch(5)  # any other step is read then
    assert torch.equal(fresh_x, trainer.step_runner.sampler.batch(t.seed, 5)[0])


def test_byte_noise_reaches_the_training_batches_and_repeats(corpus, tmp_path):
    runs = {name: tmp_path / name for name in ("clean", "noisy", "again")}
    for name, run in runs.items():
        fresh(tiny_config(steps=2, eval_every=2, byte_noise=0.0 if name == "clean" else 0.3), corpus, run).run_loop()
    clean, noisy = train_losses(runs["clean"]), train_losses(runs["noisy"])
    assert noisy == train_losses(runs["again"]) and noisy[0] != clean[0]
    assert evals(runs["noisy"])[-1]["heldout_bytes"] == evals(runs["clean"])[-1]["heldout_bytes"]
    unigram = tmp_path / "unigram"  # the source reaches the sampler: other replacements, other losses
    fresh(tiny_config(steps=2, eval_every=2, byte_noise=0.3, byte_noise_source="unigram"), corpus, unigram).run_loop()
    assert train_losses(unigram)[0] not in (noisy[0], clean[0])


def test_weight_average_is_what_evals_score_resumes_bitwise_and_eval_loads(corpus, tmp_path, capsys):
    cfg = tiny_config(steps=8, eval_every=4, ema_decay=0.8)
    whole = fresh(cfg, corpus, tmp_path / "whole")
    whole.run_loop()
    split = fresh(cfg, corpus, tmp_path / "split")
    split.run_loop(until_step=4)
    resumed = fresh(cfg, corpus, tmp_path / "split", resume=True)
    resumed.run_loop()
    assert train_losses(tmp_path / "split") == train_losses(tmp_path / "whole")
    assert [e["bpb"] for e in evals(tmp_path / "split")] == [e["bpb"] for e in evals(tmp_path / "whole")]
    assert all(torch.equal(a, b) for a, b in zip(resumed.ema.average, whole.ema.average, strict=True))
    # the eval scored the average, not the trained weights
    last = evals(tmp_path / "whole")[-1]
    assert last["weights"] == "ema0.8"
    score = dict(seq_len=32, batch_size=4, eval_bytes=0, device="cpu", autocast=contextlib.nullcontext)
    trained = heldout_score(whole.model, corpus, **score).bpb
    with whole.ema.in_model():
        averaged = heldout_score(whole.model, corpus, **score).bpb
    assert averaged == last["bpb"] != trained
    # `dormouse eval` loads the checkpoint's average and prints the training's score
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "whole"), "--ckpt", "last"]) == 0
    line = [x for x in capsys.readouterr().out.splitlines() if x.startswith("eval ")][0]
    assert f" bpb={last['bpb']:.4f} " in line and " weights=ema0.8 " in line


def test_a_long_eval_shows_a_bar_of_the_walks_batches_and_scores_the_same(corpus, tmp_path, monkeypatch, capsys):
    trainer = fresh(tiny_config(steps=1), corpus, tmp_path / "r")
    t = trainer.cfg.train
    score = {"seq_len": t.seq_len, "batch_size": t.batch_size, "eval_bytes": 0, "device": "cpu"}
    quiet = heldout_score(trainer.model, corpus, **score, autocast=contextlib.nullcontext).ce
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(evaluation, "PROGRESS_AFTER_S", 0.0)
    shown = heldout_score(trainer.model, corpus, **score, autocast=contextlib.nullcontext, progress=True).ce
    assert shown == quiet
    # 1,200 held-out bytes: 1,199 targets = 37 windows of 32 in 10 batches of 4, then the 15-byte tail
    assert re.search(r"\reval: +0%.* 0/11 \[", capsys.readouterr().err)


def test_refuses_to_overwrite_a_run(corpus, tmp_path):
    fresh(tiny_config(), corpus, tmp_path / "run").run_loop(until_step=4)
    with pytest.raises(config.ConfigError, match="is not empty"):
        fresh(tiny_config(), corpus, tmp_path / "run")


def test_cli_train_resume_and_eval_print_the_eval_line(corpus, tmp_path, capsys):
    run = str(tmp_path / "run")
    common = [
        "--engram",
        "--engram-rows",
        "1024",
        "--data",
        str(corpus.root),
        "--preset",
        "nano",
        "--d-model",
        "32",
        "--n-heads",
        "2",
        "--seq-len",
        "32",
        "--batch-size",
        "4",
        "--warmup-steps",
        "2",
        "--eval-every",
        "3",
    ]
    assert main(["train", *common, "--out", run, "--steps", "3"]) == 0
    assert main(["train", "--resume", run, "--steps", "6"]) == 0
    assert main(["train", "--resume", run, "--d-model", "64"]) == 2
    assert "--d-model cannot change on --resume" in capsys.readouterr().err
    assert main(["eval", run, "--ckpt", "last"]) == 0
    out = capsys.readouterr().out
    line = [x for x in out.splitlines() if x.startswith("eval ")][0]
    record = evals(tmp_path / "run")[-1]
    assert record["step"] == 6
    assert f"step=6 bpb={record['bpb']:.4f} ce={record['ce']:.4f}" in line
    rows, arms = map(int, re.search(r" engram=(\d+)/(\d+) ", line).groups())
    assert 0 < rows <= arms and f"engram={record['engram']} " in line  # the eval consulted the memory
    assert "kda=0/" in line and "fallbacks=0" in line
    assert (tmp_path / "run" / "curves.png").stat().st_size > 0


def test_cli_eval_walks_windows_of_seq_len_bytes(corpus, tmp_path, capsys):
    fresh(tiny_config(), corpus, tmp_path / "r").run_loop(until_step=4)
    capsys.readouterr()  # the training's own eval lines
    assert main(["eval", str(tmp_path / "r"), "--ckpt", "last", "--seq-len", "96,32", "--batch-size", "3"]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("eval ")]
    assert [re.search(r" window=(\d+) ", x).group(1) for x in lines] == ["96", "32"]
    bpb = float(re.search(r"^eval step=4 bpb=([0-9.]+) ", lines[0]).group(1))
    # Reference: the held-out split cut by hand into windows of 96 (the last one shorter), one forward each.
    from dormouse.runs import load_model

    model, _, _ = load_model(tmp_path / "r", "last", "cpu")
    data = torch.from_numpy(corpus.read("heldout", 0, corpus.split_size("heldout")).astype("int64"))
    nats = 0.0
    with torch.no_grad():
        for start in range(0, len(data) - 1, 96):
            x, y = data[start : start + 96][None], data[start + 1 : start + 97][None]
            x = x[:, : y.shape[1]]
            nats += torch.nn.functional.cross_entropy(model(x).logits[0].double(), y[0], reduction="sum").item()
    assert bpb == pytest.approx(nats / (len(data) - 1) / math.log(2), abs=6e-5)  # the line prints 4 decimals
    assert main(["eval", str(tmp_path / "r"), "--ckpt", "last"]) == 0
    default = capsys.readouterr().out
    bpb32 = re.search(r" bpb=([0-9.]+) ", lines[1]).group(1)
    assert f" bpb={bpb32} " in default and bpb32 != f"{bpb:.4f}"  # windows of 32 score the bytes differently
    assert main(["eval", str(tmp_path / "r"), "--ckpt", "last", "--seq-len", "0"]) == 2
    assert "seq_len must be a positive integer" in capsys.readouterr().err
    assert main(["eval", str(tmp_path / "r"), "--ckpt", "last", "--seq-len", "96,x"]) == 2


def test_evals_carry_the_wall_clock_and_the_first_step_is_logged_once(corpus, tmp_path):
    trainer = fresh(tiny_config(steps=4, eval_every=2), corpus, tmp_path / "r")
    trainer.run_loop(until_step=2)
    trainer.run_loop()
    walls = [r["wall_s"] for r in evals(tmp_path / "r")]
    assert len(walls) == 2 and 0 < walls[0] <= walls[1]
    log = (tmp_path / "r" / "train.log").read_text()
    assert log.count("first step: ") == 1 and trainer.first_step_s > 0
    assert "fla's import 0.0 s)" in log  # the CPU path never imports fla
    assert f"wall_s={walls[-1]:.4f} " in log


def test_minutes_stops_by_wall_time_with_an_eval_and_a_checkpoint(corpus, tmp_path):
    trainer = fresh(tiny_config(steps=100_000, minutes=0.02, eval_every=1000, ckpt_every=1000), corpus, tmp_path / "r")
    record = trainer.run_loop()
    assert 0 < trainer.step < 100_000
    assert record["step"] == trainer.step == checkpoint.last_step(tmp_path / "r")


def test_inspect_a_run_prints_its_checkpoints_and_plots(corpus, tmp_path, capsys):
    fresh(tiny_config(), corpus, tmp_path / "r").run_loop(until_step=4)
    assert main(["inspect", str(tmp_path / "r"), "--plot"]) == 0
    out = capsys.readouterr().out
    assert "last: step 4" in out and "best: step 4" in out and "eval step=4 " in out
    best = json.loads((tmp_path / "r" / "run.json").read_text())["best_bpb"]
    assert f"best_bpb: {best:.4f}\n" in out and f"best bpb {best:.4f} at step 4" in out
    assert not re.search(r"\d\.\d{5}", out)  # every figure to 4 decimals at most
    assert (tmp_path / "r" / "curves.png").stat().st_size > 0
    assert main(["inspect", str(corpus.root), "--plot"]) == 2


def test_the_tables_optimizer_state_is_in_the_engram_file_not_in_optimizer_pt(corpus, tmp_path):
    trainer = fresh(tiny_config(engram={"engram_layers": "0,1"}, steps=3, eval_every=3), corpus, tmp_path / "r")
    trainer.run_loop()
    path = checkpoint.load(tmp_path / "r", "last").path
    saved = torch.load(path / "optimizer.pt", weights_only=True)["state"]
    names = ["engram.0.table.weight", "engram.1.table.weight"]
    fields = ("exp_avg", "exp_avg_sq", "step")
    assert saved["sparse"]["state"] == {}  # optimizer.pt keeps the sparse group's hyperparameters only
    assert saved["sparse_tensors"] == [f"{n}.{f}" for n in names for f in fields]
    table_rows = 6 * 1024  # arms × engram_rows
    assert not [t.shape for t in tensors_in(saved) if t.ndim and t.shape[0] == table_rows]
    held = safetensors.torch.load_file(path / "engram.safetensors")
    assert sorted(held) == sorted(names + [f"optimizer/{n}.{f}" for n in names for f in fields])
    live = trainer.opt.optimizers["sparse"]
    for name in names:
        table = trainer.model.get_parameter(name)
        assert torch.equal(held[name], table.detach())
        for f in fields:
            assert torch.equal(held[f"optimizer/{name}.{f}"], live.state[table][f]), (name, f)
        steps = live.state[table]["step"]
        # 3 steps of 4 × 32 bytes: the rows read have been updated 1..3 times, the rest never.
        assert steps.max() == 3 and 0 < int((steps > 0).sum()) <= 3 * 4 * 32 * 6
        assert torch.equal(live.state[table]["exp_avg"].ne(0).any(1), steps > 0)  # moments only where updated
    # Without its table state a checkpoint is refused (never fresh moments).
    ck = checkpoint.load(tmp_path / "r", "last")
    with pytest.raises(DormouseError, match="the tables' file holds"):
        trainer.opt.load_split_state_dict(ck.optimizer_state, {})


def tensors_in(obj) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in tensors_in(v)]
    if isinstance(obj, list | tuple):
        return [t for v in obj for t in tensors_in(v)]
    return []


def test_engram_on_every_eval_line_and_off_when_turned_off(corpus, tmp_path):
    on = fresh(tiny_config(steps=2, eval_every=1), corpus, tmp_path / "on")
    on.run_loop()
    for record in evals(tmp_path / "on"):
        rows, arms = map(int, record["engram"].split("/"))
        # every held-out byte looks up every arm: 6 arms (orders 2,3,4 × 2 heads) per scored byte
        assert arms == 6 * record["heldout_bytes"] and 0 < rows <= arms
    assert checkpoint.load(tmp_path / "on", "last").tensors["engram"]  # the table travels in its own file
    # The eval really reads the tables: zeroing them moves the held-out score.
    t = on.cfg.train

    def score():
        return heldout_score(
            on.model,
            corpus,
            seq_len=t.seq_len,
            batch_size=t.batch_size,
            eval_bytes=0,
            device="cpu",
            autocast=contextlib.nullcontext,
        ).ce

    before = score()
    with torch.no_grad():
        for memory in on.model.engram.values():
            memory.table.weight.zero_()
    assert score() != before
    # A checkpoint whose engram file is gone is refused, naming it: never fresh rows.
    last = checkpoint.load(tmp_path / "on", "last").path
    (last / "engram.safetensors").unlink()
    with pytest.raises(DormouseError, match="engram.safetensors"):
        fresh(tiny_config(steps=4), corpus, tmp_path / "on", resume=True)
    off = fresh(tiny_config(engram={"engram": False}, steps=2), corpus, tmp_path / "off")
    off.run_loop()
    assert all(r["engram"] == "off" for r in evals(tmp_path / "off"))
    assert "engram" not in checkpoint.load(tmp_path / "off", "last").tensors


def test_sampled_depths_are_a_pure_function_of_seed_and_step_and_uniform():
    torch.manual_seed(7)  # the global RNG plays no part
    assert [sample_depth(0, s, 1, 3) for s in range(12)] == [2, 1, 1, 1, 2, 3, 2, 2, 3, 3, 1, 2]  # pinned stream
    assert [sample_depth(0, s, 1, 3) for s in range(12)] != [sample_depth(1, s, 1, 3) for s in range(12)]
    draws = [sample_depth(0, s, 2, 4) for s in range(3000)]
    assert {d: round(draws.count(d) / 3000, 1) for d in (2, 3, 4)} == {2: 0.3, 3: 0.3, 4: 0.3}  # 1/3 each
    assert set(draws) == {2, 3, 4}


def test_a_rand_depth_step_is_the_fixed_depth_model_at_the_sampled_depth(corpus, tmp_path):
    cfg = tiny_config({"depth": 3}, rand_depth=True)
    trainer = fresh(cfg, corpus, tmp_path / "r")
    depths = []
    for step in range(4):
        depths.append(trainer.step_runner.step_depth(step))
        fixed = DormouseLM(dataclasses.replace(cfg.model, depth=depths[-1]), seed=cfg.train.seed)
        fixed.load_state_dict(trainer.model.state_dict())
        x, y = trainer.step_runner.sampler.batch(cfg.train.seed, step)
        assert trainer.train_step(step) == fixed(x, y).ce.item(), step  # exactly
    assert depths == [2, 1, 1, 1]  # sample_depth(0, step, 1, 3), pinned above
    trainer.step = 4
    assert trainer.evaluate([1.0], [1.0])["depth"] == "1..3(mean1.25)"  # what training ran; the eval runs 3
    assert trainer.step_runner.depths == []


@pytest.mark.parametrize("masks", [{"dropout": 0.1}, {"drop_path": 0.3}, {"engram_dropout": 0.3}])
def test_dropout_runs_are_bitwise_repeatable_and_resume_exactly(masks, corpus, tmp_path):
    """Dropout's and stochastic depth's masks are a pure function of (seed, step): two runs agree, and a
    resumed run draws the masks the uninterrupted one drew."""
    cfg = tiny_config(masks, steps=8)
    whole, again = fresh(cfg, corpus, tmp_path / "whole"), fresh(cfg, corpus, tmp_path / "again")
    torch.manual_seed(1)  # the global RNG is not used: reseeding it changes nothing
    whole.run_loop()
    torch.manual_seed(2)
    again.run_loop()
    assert train_losses(tmp_path / "again") == train_losses(tmp_path / "whole")
    part = fresh(cfg, corpus, tmp_path / "part")
    part.run_loop(until_step=4)
    resumed = fresh(cfg, corpus, tmp_path / "part", resume=True)
    resumed.run_loop()
    assert train_losses(tmp_path / "part") == train_losses(tmp_path / "whole")
    scores = [[(e["step"], e["bpb"]) for e in evals(tmp_path / run)] for run in ("part", "whole")]
    assert scores[0] == scores[1] and len(scores[0]) == 2
    a, b = whole.model.state_dict(), resumed.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    off = fresh(tiny_config(steps=8), corpus, tmp_path / "off")
    off.run_loop(until_step=1)  # the same weights and batch: only the masks differ
    assert train_losses(tmp_path / "off")[0] != train_losses(tmp_path / "whole")[0]


def test_dropout_with_rand_depth_and_the_auxiliary_heads(corpus, tmp_path):
    arms = {"dropout": 0.2, "depth": 3, "jepa_weight": 0.1, "dspark_weight": 0.1}
    cfg = tiny_config(arms, rand_depth=True, rand_depth_bptt=1)
    a, b = fresh(cfg, corpus, tmp_path / "a"), fresh(cfg, corpus, tmp_path / "b")
    assert [a.train_step(s) for s in range(3)] == [b.train_step(s) for s in range(3)]
    assert a.step_runner.step_depth(0) != a.step_runner.step_depth(1)  # two depths drawn: 2, 1 (pinned above)


def test_a_run_with_every_random_arm_draws_nothing_from_the_global_rngs(corpus, tmp_path):
    # dormouse/rng.py: every draw comes from a keyed generator. A draw from torch's, numpy's or Python's
    # global stream anywhere in building, a step, an eval or a checkpoint moves that stream's state.
    arms = {"dropout": 0.2, "drop_path": 0.2, "engram_dropout": 0.2, "depth": 3, "n_experts": 2}
    arms |= {"jepa_weight": 0.1, "dspark_weight": 0.1}
    cfg = tiny_config(arms, steps=4, eval_every=2, ckpt_every=2, rand_depth=True, byte_noise=0.2)
    torch.manual_seed(5), np.random.seed(5), random.seed(5)
    states = torch.random.get_rng_state(), np.random.get_state(), random.getstate()
    fresh(cfg, corpus, tmp_path / "r").run_loop(until_step=2)
    resumed = fresh(cfg, corpus, tmp_path / "r", resume=True)
    resumed.run_loop()
    assert resumed.step == 4 and len(evals(tmp_path / "r")) == 2
    assert torch.equal(torch.random.get_rng_state(), states[0]), "a draw from torch's global RNG"
    now, was = np.random.get_state(), states[1]
    assert now[0] == was[0] and np.array_equal(now[1], was[1]) and now[2:] == was[2:], "a draw from numpy's global RNG"
    assert random.getstate() == states[2], "a draw from Python's global RNG"


# ---- the result: the best held-out eval; early stopping ---------------------------------------------------------


def scripted_scores(monkeypatch, bpbs):
    """The trainer's evals report the next of `bpbs` as their held-out bpb (a scripted curve); `dormouse
    eval` still scores the held-out split."""
    from dormouse.evaluation import HeldOut
    from dormouse.train import evaluator

    script = iter(bpbs)
    monkeypatch.setattr(evaluator, "heldout_score", lambda *a, **k: HeldOut(next(script) * math.log(2), 599))


def tiny_flags(corpus) -> list[str]:
    size = ["--d-model", "32", "--n-heads", "2", "--ffn-hidden", "64", "--seq-len", "32", "--batch-size", "4"]
    return ["--data", str(corpus.root), "--preset", "nano", *size, "--warmup-steps", "2", "--eval-every", "2"]


def run_json(run) -> dict:
    return json.loads((run / "run.json").read_text())


def test_train_s_last_line_is_the_best_eval_when_the_last_eval_is_worse(corpus, tmp_path, capsys, monkeypatch):
    """Evals at steps 2..10 score 5.0, 4.0, 4.5, 3.5, 3.9: the result is step 8's 3.5, in the last line,
    in run.json and in the checkpoint `eval` and `generate` load by default."""
    scripted_scores(monkeypatch, [5.0, 4.0, 4.5, 3.5, 3.9])
    run = tmp_path / "run"
    assert main(["train", *tiny_flags(corpus), "--out", str(run), "--steps", "10", "--patience", "0"]) == 0
    out = capsys.readouterr().out.splitlines()
    best_dir = run / "ckpt" / "step-00000008"
    result = f"result: best held-out 3.5000 bpb at step 8 ({best_dir}, --ckpt best); last eval 3.9000 bpb at step 10"
    assert out[-1] == result
    assert [e["step"] for e in evals(run)] == [2, 4, 6, 8, 10] and evals(run)[-1]["bpb"] == pytest.approx(3.9)
    meta = run_json(run)
    assert {k: meta[k] for k in ("best_step", "best_checkpoint", "last_eval_step", "early_stop_step")} == {
        "best_step": 8,
        "best_checkpoint": "ckpt/step-00000008",
        "last_eval_step": 10,
        "early_stop_step": None,
    }
    assert meta["best_bpb"] == pytest.approx(3.5) and meta["last_eval_bpb"] == pytest.approx(3.9)
    assert meta["fingerprint"] == corpus.fingerprint and len(meta["run_id"]) == 12  # the existing keys kept
    assert (run / "train.log").read_text().splitlines()[-1] == result
    assert checkpoint.load(run, "best").path == best_dir and checkpoint.last_step(run) == 10
    # `eval` and `generate` without --ckpt load the best checkpoint, step 8, not the last one
    assert main(["eval", str(run)]) == 0
    assert f"checkpoint {best_dir} (step 8);" in capsys.readouterr().out
    assert main(["generate", str(run), "--prompt", "ab", "--max-bytes", "2", "--temperature", "0"]) == 0
    assert f"generated 2 bytes from {best_dir} in " in capsys.readouterr().err
    # a resume with nothing left to train ends on the same line
    assert main(["train", "--resume", str(run)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == result


def test_a_run_that_gets_worse_reports_and_serves_its_best(corpus, tmp_path, capsys):
    """Real scores: a learning rate that wrecks the model after step 8 makes the last eval the worst; the
    result line, run.json and `dormouse eval`'s default checkpoint all give the best eval's bpb."""
    run = tmp_path / "run"
    trainer = fresh(tiny_config(), corpus, run)
    trainer.run_loop(until_step=8)
    trainer.opt.base_lr = dict.fromkeys(trainer.opt.base_lr, 20.0)
    trainer.run_loop()
    scores = {e["step"]: e["bpb"] for e in evals(run)}
    best_step = min(scores, key=scores.get)
    assert list(scores) == [4, 8, 12] and scores[12] > scores[best_step] and best_step in (4, 8)
    line = trainer.result_line()
    assert line.startswith(f"result: best held-out {scores[best_step]:.4f} bpb at step {best_step} (")
    assert line.endswith(f"; last eval {scores[12]:.4f} bpb at step 12")
    meta = run_json(run)
    assert (meta["best_step"], meta["best_bpb"], meta["last_eval_bpb"]) == (best_step, scores[best_step], scores[12])
    capsys.readouterr()
    assert main(["eval", str(run)]) == 0
    eval_out = [x for x in capsys.readouterr().out.splitlines() if x.startswith("eval ")]
    assert eval_out[0].startswith(f"eval step={best_step} bpb={scores[best_step]:.4f} ")


def test_patience_stops_at_the_eval_that_spends_it_and_a_resume_goes_on(corpus, tmp_path, capsys, monkeypatch):
    """Patience 2, evals every 2 steps scoring 5.0, 4.0, 4.2, 4.1: the best (step 4) is 2 evals old at step 8,
    where the run stops with a checkpoint, exit 0. A resume goes on under the same rule (one more eval, 4.3:
    it stops at step 10); with --patience 0 it trains to --steps."""
    scripted_scores(monkeypatch, [5.0, 4.0, 4.2, 4.1, 4.3, 3.0, 3.2, 3.3, 3.4, 3.5])
    run = tmp_path / "run"
    assert main(["train", *tiny_flags(corpus), "--out", str(run), "--steps", "20", "--patience", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    stop = (
        "early stop: 2 evals without a better held-out bpb (patience 2); stopped after step 8 of 20 with a checkpoint"
    )
    assert [x for x in out if x.startswith("early stop: ")] == [f"{stop}; best 4.0000 at step 4"]
    best_dir = run / "ckpt" / "step-00000004"
    assert (
        out[-1]
        == f"result: best held-out 4.0000 bpb at step 4 ({best_dir}, --ckpt best); last eval 4.1000 bpb at step 8"
    )
    assert len(train_losses(run)) == 8 and checkpoint.last_step(run) == 8 and checkpoint.load(run, "best").step == 4
    (record,) = [
        r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "early_stop"
    ]
    assert record == {
        "kind": "early_stop",
        "step": 8,
        "patience": 2,
        "evals": 2,
        "best_step": 4,
        "best_bpb": record["best_bpb"],
    }
    assert record["best_bpb"] == pytest.approx(4.0) and run_json(run)["early_stop_step"] == 8
    assert stop in (run / "train.log").read_text()

    assert main(["train", "--resume", str(run)]) == 0  # the same rule: step 10's 4.3 is the third eval past the best
    out = capsys.readouterr().out.splitlines()
    assert [x.split(";")[0] for x in out if x.startswith("early stop: ")] == [
        "early stop: 3 evals without a better held-out bpb (patience 2)"
    ]
    assert checkpoint.last_step(run) == 10 and run_json(run)["early_stop_step"] == 10

    assert main(["train", "--resume", str(run), "--patience", "0"]) == 0  # off: to --steps 20
    out = capsys.readouterr().out.splitlines()
    assert not [x for x in out if x.startswith("early stop: ")] and checkpoint.last_step(run) == 20
    assert out[-1].startswith("result: best held-out 3.0000 bpb at step 12 (")
    assert out[-1].endswith("; last eval 3.5000 bpb at step 20")
    assert run_json(run)["early_stop_step"] is None and len(train_losses(run)) == 20


def test_a_dry_pass_leaves_the_run_as_it_was(corpus, tmp_path, monkeypatch):
    """Trainer.dry_pass (on CUDA ops/precompile.py records its Triton launches; here it runs, values and all)
    leaves no gradient, buffer or RNG state behind: the run trains bitwise as one without it."""
    cfg = tiny_config({"n_experts": 2, "dropout": 0.3}, byte_noise=0.1)
    a, b = fresh(cfg, corpus, tmp_path / "a"), fresh(cfg, corpus, tmp_path / "b")
    monkeypatch.setattr(ledger, "COUNTS", ledger.COUNTS.copy())
    ledger.COUNTS[fla_pin.UNPINNED] = 2  # counted before it: stays
    counts = counters.snapshot()
    a.dry_pass()
    assert counters.snapshot() == counts and ledger.COUNTS[fla_pin.UNPINNED] == 2  # its forwards counted calls
    assert all(p.grad is None for p in a.model.parameters())
    buffers = dict(b.model.named_buffers())
    assert buffers and all(torch.equal(x, buffers[name]) for name, x in a.model.named_buffers())
    a.run_loop()
    b.run_loop()
    assert train_losses(a.run) == train_losses(b.run)
    assert [e["bpb"] for e in evals(a.run)] == [e["bpb"] for e in evals(b.run)]


def test_a_dry_pass_stopped_part_way_leaves_no_gradient_buffer_or_count(corpus, tmp_path, monkeypatch):
    """ops/precompile.py ends the dry pass where an autotune would time (here: after the training backward,
    at the eval's forwards); the gradients of that backward must not reach the first step's."""
    trainer = fresh(tiny_config({"n_experts": 2}), corpus, tmp_path / "run")
    before = {name: b.clone() for name, b in trainer.model.named_buffers()}
    counts = counters.snapshot()

    def stopped():
        raise RuntimeError("an autotune the dry pass would time")

    monkeypatch.setattr(trainer.evaluator, "dry_pass", stopped)
    with pytest.raises(RuntimeError, match="would time"):
        trainer.dry_pass()
    assert all(p.grad is None for p in trainer.model.parameters())
    assert all(torch.equal(b, before[name]) for name, b in trainer.model.named_buffers())
    assert counters.snapshot() == counts


def test_a_torchrun_job_on_cuda_counts_its_skipped_precompile(corpus, tmp_path, monkeypatch):
    """--precompile is one process's: under torchrun each rank compiles as its first step runs, and the run's
    log and the ledger say so; off CUDA nothing compiles and nothing is counted."""
    trainer = fresh(tiny_config(), corpus, tmp_path / "run")
    monkeypatch.setattr(ledger, "COUNTS", ledger.COUNTS.copy())
    monkeypatch.setattr(trainer, "dry_pass", lambda: pytest.fail("a job of two processes ran the dry pass"))
    trainer.compile_ahead()  # the CPU
    assert ledger.COUNTS[precompile.SKIPPED] == 0
    monkeypatch.setattr(trainer, "device", torch.device("cuda"))
    monkeypatch.setattr(trainer, "world", dataclasses.replace(trainer.world, size=2))
    trainer.compile_ahead()
    assert ledger.COUNTS[precompile.SKIPPED] == 1
    line = "precompile: skipped, a job of 2 processes: the first step compiles and times its kernels one by one"
    assert line in (trainer.run / "train.log").read_text()
