"""Data parallelism gates (CPU, gloo, 2 processes under torchrun, tests/ddp_worker.py): DDP and FSDP2
equal one process on the same global batch, the replicas (engram tables included) stay bit-identical, a
NaN on one rank stops both, `torchrun -m dormouse train` is that run, checkpoints (DDP's and FSDP's)
reload at another world size with the identical eval score, a hung rank is an error within the timeout,
a killed rank stops the job naming it and the run resumes alone, and a process group's teardown does
not deadlock. Five launches, ~100 s on 2 cores. A launch that outlives its timeout is stopped with
SIGABRT: every process of it prints its Python stacks (PYTHONFAULTHANDLER) into the failure."""

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from dormouse import checkpoint, config_flags
from dormouse.cli import build_parser, main
from dormouse.data.sampler import Sampler, heldout_windows, rank_rows
from dormouse.data.shards import load_corpus
from dormouse.errors import ConfigError
from dormouse.model.model import ENGRAM_FILE
from dormouse.parallel.world import joined
from dormouse.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "ddp_worker.py"
TORCHRUN = Path(sys.executable).with_name("torchrun")
sys.path.insert(0, str(WORKER.parent))
from ddp_worker import AUX, EMA_DECAY, MODEL, MOR, ODD, TRAIN, tiny_config  # noqa: E402

# DDP is not bitwise equal to one process: one process sums each gradient over all B rows inside
# each matmul's reduction, DDP sums over B/2 rows per rank and then adds the two halves (fp32 addition
# does not associate). Measured over the 4 steps here: losses within 2e-7 relative, every weight within
# 7e-7 absolute; the tolerance leaves a margin of 10-50x. The eval's score is bitwise (see below).
REL, ABS = 1e-5, 1e-5
# FSDP2 is not bitwise equal to one process for the same reason: its reduce-scatter adds the two ranks'
# halves of each gradient after each rank summed its B/2 rows (the Sinkhorn gather, the clip's norm and the
# weight update are exact given the gradient). Measured over the 4 steps here: losses within 2e-7 relative,
# every weight within 6.3e-7 absolute of one process (DDP's numbers): the same tolerance.
# Adam's step divides by the gradient's own scale, so an element whose gradient nearly cancels (a few
# ulps from its eps) turns a last-bit difference into a step of up to lr: measured, one engram-table
# element of 49,152 within 2.4e-6 here, past 1e-5 on another CPU. Such elements are allowed, at most one in
# 10,000 of a tensor and each within the steps' bound, 2 * lr * steps.
ADAM_TIES = 1e-4


def assert_weights_close(got: dict, want: dict, run: str = "") -> None:
    """Every weight within REL/ABS of one process's, but for Adam's near-cancelling elements (above)."""
    bound = 2 * TRAIN["steps"] * tiny_config().train.lr
    for name, value in want.items():
        off = ~torch.isclose(got[name], value, rtol=REL, atol=ABS)
        assert int(off.sum()) <= ADAM_TIES * value.numel(), f"{run} {name}: {int(off.sum())} elements differ"
        torch.testing.assert_close(got[name], value, rtol=0, atol=bound, msg=f"{run} {name}")


def as_flags(values: dict) -> list[str]:
    """The command-line flags of config values: --name=value, a bool as --name or --no-name."""
    flags = []
    for key, value in values.items():
        name = key.replace("_", "-")
        flags.append((f"--{name}" if value else f"--no-{name}") if isinstance(value, bool) else f"--{name}={value}")
    return flags


def torchrun(*args, timeout=120) -> subprocess.CompletedProcess:
    return launch([str(TORCHRUN), "--standalone", "--nproc-per-node", "2", *map(str, args)], timeout)


def launch(cmd: list[str], timeout: float) -> subprocess.CompletedProcess:
    """Run `cmd`; past `timeout` s, fail with the Python stacks of it and every process it started."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1"}
    env.pop("WORLD_SIZE", None)
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, **pipes)
    try:
        out, err = proc.communicate(timeout=timeout)
        return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    except subprocess.TimeoutExpired:
        tree = [*descendants(proc.pid), proc.pid]  # torchrun starts each rank in a session of its own
        signal_all(tree, signal.SIGABRT)  # faulthandler: each process prints its threads' stacks, then dies
        try:
            out, err = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            out, err = "", "(no stacks: the processes did not die on SIGABRT within 20 s)"
        signal_all(tree, signal.SIGKILL)  # no rank outlives its test
    print(out, err, sep="\n")  # pytest shows it with the failure
    pytest.fail(f"{' '.join(cmd[:4])} ... hung: no exit within {timeout} s; every process's stack is printed above")


def descendants(pid: int) -> list[int]:
    """The processes below `pid` (Linux /proc), children first."""
    children = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


@pytest.fixture(scope="module")
def corpus(random_corpus):
    return load_corpus(random_corpus(6000, repeats=2))


@pytest.fixture(scope="module")
def runs(corpus, tmp_path_factory, one_thread):
    """A one-process run and the DDP run of the same config, and what each rank held at the end."""
    out = tmp_path_factory.mktemp("ddp")
    single = Trainer(tiny_config(), corpus, out / "single", corpus_note="test")
    single.run_loop()
    single_evals = records(single.run, "eval")  # before the workers resume the run and add an eval
    started = time.monotonic()
    done = torchrun(WORKER, "train", corpus.root, out, out / "single")
    assert done.returncode == 0, done.stderr[-4000:]
    print(f"torchrun train: {time.monotonic() - started:.1f} s")
    ranks = [torch.load(out / f"rank-{r}.pt", weights_only=True) for r in (0, 1)]
    resumed = [json.loads((out / f"resumed-{r}.json").read_text()) for r in (0, 1)]
    return single, single_evals, out, ranks, resumed


def read_json(path: Path):
    return json.loads(path.read_text())


def records(run, kind):
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == kind]


def test_rank_slices_are_disjoint_and_make_up_the_one_process_batch(corpus):
    sampler = Sampler(corpus, 4, 32)
    x, y = sampler.batch(0, 3)
    halves = [sampler.batch(0, 3, rank=r, world_size=2) for r in (0, 1)]
    assert torch.equal(torch.cat([h[0] for h in halves]), x) and torch.equal(torch.cat([h[1] for h in halves]), y)
    assert [list(rank_rows(8, r, 4)) for r in range(4)] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    with pytest.raises(ConfigError, match="batch_size 6 is not divisible by the world size 4"):
        rank_rows(6, 0, 4)


def test_parallel_resolves_from_the_launch_and_refuses_what_is_not_built(monkeypatch):
    assert tiny_config().train.parallel == "none"
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert tiny_config().train.parallel == "ddp"
    with pytest.raises(ConfigError, match="parallel none under torchrun with WORLD_SIZE 2"):
        tiny_config(parallel="none")
    assert tiny_config(parallel="fsdp").train.parallel == "fsdp"
    monkeypatch.delenv("WORLD_SIZE")
    for parallel in ("ddp", "fsdp"):
        with pytest.raises(ConfigError, match=f"parallel {parallel} needs torchrun's environment"):
            with joined(tiny_config(parallel=parallel).train):
                pass


def test_resume_decides_parallel_by_its_own_launch(monkeypatch):
    saved = tiny_config()  # a one-process run
    monkeypatch.setenv("WORLD_SIZE", "2")
    args = build_parser().parse_args(["train", "--resume", "RUN", "--dist-timeout", "30"])
    resumed = config_flags.resume_config(saved, args)
    assert (resumed.train.parallel, resumed.train.dist_timeout) == ("ddp", 30.0)
    monkeypatch.delenv("WORLD_SIZE")
    alone = config_flags.resume_config(resumed, build_parser().parse_args(["train", "--resume", "RUN"]))
    assert alone.train.parallel == "none"


def test_ddp_on_two_ranks_equals_one_process_on_the_same_global_batch(runs):
    single, single_evals, out, ranks, _ = runs
    run = out / "run"
    one, two = records(single.run, "train"), records(run, "train")
    assert [r["step"] for r in two] == [1, 2, 3, 4]  # rank 0 alone writes: one record per step
    assert [r["ce"] for r in two] == pytest.approx([r["ce"] for r in one], rel=REL)
    assert two[0]["ce"] == pytest.approx(one[0]["ce"], rel=1e-6)
    evals_one, evals_two = single_evals, records(run, "eval")
    assert [e["step"] for e in evals_two] == [2, 4]
    assert [e["bpb"] for e in evals_two] == pytest.approx([e["bpb"] for e in evals_one], rel=REL)
    assert [e["engram"] for e in evals_two] == [e["engram"] for e in evals_one]  # keys depend on bytes only
    # Every rank holds the same replica, bit for bit, the engram tables included.
    assert ranks[0].keys() == ranks[1].keys()
    assert all(torch.equal(ranks[0][k], ranks[1][k]) for k in ranks[0]), "replicas differ"
    assert_weights_close(ranks[0], single.model.state_dict())
    log = (run / "train.log").read_text()
    assert log.count("\nparallel: ddp, 2 ranks (gloo)") == 1 and log.count("eval step=4 ") == 1


def test_ddp_steps_where_parameters_get_no_gradient(runs):
    """Unchosen experts and, under rand_depth_bptt, the memory: DDP finds them; the replicas stay equal."""
    out = runs[2]
    states = [torch.load(out / f"unused-{r}.pt", weights_only=True) for r in (0, 1)]
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0]), "replicas differ"
    assert [r["step"] for r in records(out / "unused", "train")] == [1, 2, 3]
    assert [e["step"] for e in records(out / "unused", "eval")] == [3]


def test_the_weight_average_under_ddp_is_one_processs_on_every_rank(runs, corpus, tmp_path):
    """Each replica averages the same weights: the averages agree bit for bit across ranks and with one
    process's within DDP's tolerance, and so do the evals, which score the average."""
    out = runs[2]
    single = Trainer(tiny_config(ema_decay=EMA_DECAY), corpus, tmp_path / "single", corpus_note="test")
    single.run_loop()
    averages = [torch.load(out / f"ema-{r}.pt", weights_only=True) for r in (0, 1)]
    assert averages[0].keys() == single.ema.state_dict().keys()
    assert all(torch.equal(averages[0][k], averages[1][k]) for k in averages[0]), "averages differ"
    assert_weights_close(averages[0], single.ema.state_dict())
    evals_ddp, evals_one = records(out / "ema", "eval"), records(single.run, "eval")
    assert [e["weights"] for e in evals_ddp] == [f"ema{EMA_DECAY:g}"] * 2
    assert [e["bpb"] for e in evals_ddp] == pytest.approx([e["bpb"] for e in evals_one], rel=REL)
    # the average is not the trained weights: a run without it scores otherwise
    assert evals_ddp[-1]["bpb"] != records(out / "run", "eval")[-1]["bpb"]


@pytest.mark.parametrize("name,extra,terms", [("aux", AUX, ("dspark", "jepa")), ("mor", MOR, ())])
def test_per_sequence_terms_under_ddp_and_fsdp_are_one_processs(runs, corpus, tmp_path, name, extra, terms):
    """DSpark, JEPA and MoR's routing and router term: per sequence, so each rank's terms over its rows
    (JEPA's spans are its rows of the batch's), averaged over equal halves, are the one-process terms:
    losses, evals and weights within DDP's tolerance."""
    out = runs[2]
    single = Trainer(tiny_config(**extra), corpus, tmp_path / "single", corpus_note="test")
    single.run_loop()
    state, one = single.model.state_dict(), records(single.run, "train")
    for run in (name, f"fsdp-{name}"):
        ranks = [torch.load(out / f"{run}-{r}.pt", weights_only=True) for r in (0, 1)]
        assert all(torch.equal(ranks[0][k], ranks[1][k]) for k in ranks[0]), f"{run}: replicas differ"
        assert_weights_close(ranks[0], state, run)
        assert [r["ce"] for r in records(out / run, "train")] == pytest.approx([r["ce"] for r in one], rel=REL)
        evals, evals_one = records(out / run, "eval"), records(single.run, "eval")
        for term in ("bpb", *terms):
            assert [e[term] for e in evals] == pytest.approx([e[term] for e in evals_one], rel=REL), term


def test_a_nan_on_one_rank_stops_every_rank_at_that_step(runs):
    out = runs[2]
    for r in (0, 1):
        assert (out / f"nan-{r}.txt").read_text() == "step 0: training loss is nan; stopping before the update"


def test_torchrun_m_dormouse_train_is_the_same_run(runs, corpus, tmp_path):
    """The command line under torchrun: rank 0 alone prints and writes, and the run is the worker's, bitwise."""
    run = runs[2] / "run"
    flags = as_flags({**MODEL, **TRAIN})
    done = torchrun("-m", "dormouse", "train", "--data", corpus.root, "--out", tmp_path / "cli", *flags)
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.count("curves: ") == 1 and done.stdout.count("eval step=4 ") == 1
    assert "parallel: ddp, 2 ranks (gloo)" in done.stdout
    assert records(tmp_path / "cli", "train") == records(run, "train")
    assert [e["bpb"] for e in records(tmp_path / "cli", "eval")] == [e["bpb"] for e in records(run, "eval")]


def test_ctrl_c_to_torchrun_stops_every_rank_at_one_step_with_a_checkpoint(corpus, tmp_path, one_thread):
    """Ctrl-C reaches torchrun, which passes SIGINT to its workers: they agree on one step boundary,
    checkpoint (no eval: none is scheduled) and exit; the run resumes from that step alone."""
    run = tmp_path / "run"
    flags = as_flags({**MODEL, **TRAIN})
    flags += ["--steps=400", "--eval-every=1000", "--ckpt-every=1000"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1"}
    env.pop("WORLD_SIZE", None)
    cmd = [str(TORCHRUN), "--standalone", "--nproc-per-node", "2", "-m", "dormouse", "train"]
    proc = subprocess.Popen([*cmd, "--data", str(corpus.root), "--out", str(run), *flags], env=env, cwd=ROOT)
    try:
        deadline = time.monotonic() + 90
        while not (run / "metrics.jsonl").exists() or len(records(run, "train")) < 3:
            assert proc.poll() is None and time.monotonic() < deadline, "the run ended or stalled before step 3"
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) != 0
    finally:
        if proc.poll() is None:
            signal_all([*descendants(proc.pid), proc.pid], signal.SIGKILL)
    stopped = records(run, "train")[-1]["step"]
    assert 3 <= stopped < 400 and checkpoint.last_step(run) == stopped
    assert records(run, "eval") == []
    assert f"interrupted: stopped after step {stopped} with a checkpoint" in (run / "train.log").read_text()
    alone = Trainer(tiny_config(steps=400), corpus, run, corpus_note="test", resume=True)
    assert alone.step == stopped


def test_checkpoints_reload_at_another_world_size_with_the_identical_eval(runs, corpus, capsys):
    _, single_evals, out, _, resumed = runs
    run = out / "run"
    # 2 → 1: the checkpoint the DDP run's rank 0 wrote is the one-process format; scored alone, the
    # held-out bpb is the one the two ranks agreed on, bit for bit.
    last = records(run, "eval")[-1]
    assert checkpoint.last_step(run) == 4
    assert main(["eval", str(run), "--ckpt", "last"]) == 0
    assert f"step=4 bpb={last['bpb']:.4f} " in capsys.readouterr().out
    alone = Trainer(tiny_config(), corpus, run, corpus_note="test", resume=True)
    assert alone.evaluate([], [])["bpb"] == last["bpb"]
    # 1 → 2: a one-process run resumed on two ranks scores its checkpoint exactly as it did alone.
    assert resumed[0]["bpb"] == resumed[1]["bpb"] == single_evals[-1]["bpb"]
    assert resumed[0]["engram"] == single_evals[-1]["engram"]


def test_fsdp_on_two_ranks_equals_one_process_on_the_same_global_batch(runs):
    """FSDP2 with the Sinkhorn routing (NesterovSinkhorn on the sharded matrices, AdamW, SparseRowAdam on
    the replicated engram tables) steps as one process does, within the DDP test's tolerance."""
    single, single_evals, out, _, _ = runs
    run = out / "fsdp"
    one, two = records(single.run, "train"), records(run, "train")
    assert [r["step"] for r in two] == [1, 2, 3, 4]
    assert [r["ce"] for r in two] == pytest.approx([r["ce"] for r in one], rel=REL)
    assert [e["bpb"] for e in records(run, "eval")] == pytest.approx([e["bpb"] for e in single_evals], rel=REL)
    ranks = [torch.load(out / f"fsdp-rank-{r}.pt", weights_only=True) for r in (0, 1)]
    assert all(torch.equal(ranks[0][k], ranks[1][k]) for k in ranks[0]), "gathered states differ"
    state = single.model.state_dict()
    assert ranks[0].keys() == state.keys()
    assert_weights_close(ranks[0], state)
    facts = [read_json(out / f"fsdp-{r}.json") for r in (0, 1)]
    # The matrices and their momentum buffers are sharded on their rows; the clip's norm is global.
    assert all(local * 2 == rows for rows, local in facts[0]["rows"]), facts[0]["rows"]
    assert facts[0]["momentum_rows"] == [local for _, local in facts[0]["rows"]]
    assert facts[0]["grad_norm"] == facts[1]["grad_norm"] == pytest.approx(single.step_runner.grad_norm.item(), rel=REL)
    log = (run / "train.log").read_text()
    assert log.count("\nparallel: fsdp, 2 ranks (gloo)") == 1 and log.count("eval step=4 ") == 1


def test_fsdp_steps_where_parameters_get_no_gradient_as_ddp_does(runs):
    """Unchosen experts and, under rand_depth_bptt, the first iteration's memory and engram: FSDP2 steps
    them as DDP does (within DDP's tolerance), every rank gathering the same state. DDP, not one process,
    is the reference: the MoE balance term is each rank's slice's (known-issues), so both parallel runs
    differ from one process by more than rounding (~1e-5 relative in the second step's loss)."""
    out = runs[2]
    ranks = [torch.load(out / f"fsdp-unused-{r}.pt", weights_only=True) for r in (0, 1)]
    assert all(torch.equal(ranks[0][k], ranks[1][k]) for k in ranks[0]), "gathered states differ"
    ddp = torch.load(out / "unused-0.pt", weights_only=True)
    assert ranks[0].keys() == ddp.keys()
    assert_weights_close(ranks[0], ddp)
    fsdp_ce, ddp_ce = records(out / "fsdp-unused", "train"), records(out / "unused", "train")
    assert [r["ce"] for r in fsdp_ce] == pytest.approx([r["ce"] for r in ddp_ce], rel=REL)
    fsdp_evals, ddp_evals = records(out / "fsdp-unused", "eval"), records(out / "unused", "eval")
    assert [e["bpb"] for e in fsdp_evals] == pytest.approx([e["bpb"] for e in ddp_evals], rel=REL)


def test_fsdp_shards_matrices_whose_rows_do_not_divide_by_the_world_size(runs, corpus, tmp_path):
    """3 heads: beta's projection [3, d] is split 2 + 1 rows (FSDP2 pads the short shard). The run steps as
    DDP does, weight for weight, and its losses are one process's within DDP's tolerance. (Its weights are
    not: NesterovSinkhorn's normalisation amplifies DDP's summation-order differences in f_b's gradient to
    1.7e-5 at this size, the same under DDP and FSDP.)"""
    out = runs[2]
    single = Trainer(tiny_config(**ODD), corpus, tmp_path / "single", corpus_note="test")
    single.run_loop()
    ranks = [torch.load(out / f"fsdp-odd-{r}.pt", weights_only=True) for r in (0, 1)]
    assert any(v.ndim == 2 and v.shape[0] % 2 for k, v in ranks[0].items() if k.startswith("layers."))
    assert all(torch.equal(ranks[0][k], ranks[1][k]) for k in ranks[0]), "gathered states differ"
    ddp = torch.load(out / "odd-0.pt", weights_only=True)
    assert ranks[0].keys() == ddp.keys()
    assert_weights_close(ranks[0], ddp)
    one, two = records(single.run, "train"), records(out / "fsdp-odd", "train")
    assert [r["ce"] for r in two] == pytest.approx([r["ce"] for r in one], rel=REL)


def test_fsdp_checkpoints_reload_at_another_world_size_with_the_identical_eval(runs, corpus):
    _, single_evals, out, _, _ = runs
    # 2 → 1: rank 0 consolidated the shards into the one-process format; scored alone, the identical bpb.
    run = out / "fsdp"
    assert checkpoint.last_step(run) == 4
    alone = Trainer(tiny_config(), corpus, run, corpus_note="test", resume=True)
    assert alone.evaluate([], [])["bpb"] == records(run, "eval")[-1]["bpb"]
    # 1 → 2: a one-process checkpoint loaded into the sharded model (and optimizer) scores as it did alone.
    resumed = [read_json(out / f"fsdp-resumed-{r}.json") for r in (0, 1)]
    assert resumed[0]["bpb"] == resumed[1]["bpb"] == single_evals[-1]["bpb"]
    assert resumed[0]["engram"] == single_evals[-1]["engram"]


def test_a_killed_rank_stops_the_job_naming_it_and_the_run_resumes_alone(runs, corpus, tmp_path):
    """Rank 1 is SIGKILLed mid-run (FSDP, after the checkpoint of step 2): torchrun stops rank 0, which is
    waiting in a collective, and exits non-zero naming rank 1 and the signal; one process then resumes
    the run from that checkpoint and trains it to the end, to one process's result."""
    started = time.monotonic()
    done = torchrun(WORKER, "kill", corpus.root, tmp_path, timeout=90)
    elapsed = time.monotonic() - started
    assert done.returncode != 0
    root_cause = done.stderr.split("Root Cause (first observed failure):", 1)[-1]
    assert re.search(r"rank\s*: 1 \(local_rank: 1\)\s+exitcode\s*: -9 .*\(SIGKILL\)", root_cause), done.stderr[-3000:]
    assert elapsed < 45, elapsed  # torchrun notices at once: two start-ups and three steps, not dist_timeout
    run = tmp_path / "run"
    assert checkpoint.last_step(run) == 2
    alone = Trainer(tiny_config(), corpus, run, corpus_note="test", resume=True)
    record = alone.run_loop()
    assert checkpoint.last_step(run) == 4 and [r["step"] for r in records(run, "train")] == [1, 2, 3, 4]
    assert record["bpb"] == pytest.approx(runs[1][-1]["bpb"], rel=REL)


def test_a_hung_rank_is_an_error_within_the_timeout(corpus, tmp_path, one_thread):
    started = time.monotonic()
    done = torchrun(WORKER, "hang", corpus.root, tmp_path)
    elapsed = time.monotonic() - started
    assert done.returncode != 0
    # gloo's collective timeout (not the rendezvous's): rank 0 waited dist_timeout for rank 1, then raised
    assert "Timed out waiting 3000ms" in done.stderr, done.stderr[-3000:]
    assert elapsed < 45, elapsed  # 3 s of dist_timeout plus two start-ups, far below the 60 s sleep


def test_a_process_group_torn_down_after_a_collective_exits(one_thread):
    """A replica freed after `joined`'s block must not destroy the group while gloo's worker thread still
    holds the last collective's tensor: that deadlocked on the GIL (a rank that never exited). 40 blocks:
    the old teardown hung within 5-34 blocks in each of 8 runs."""
    done = launch([sys.executable, str(WORKER), "teardown", "40"], timeout=90)
    assert done.returncode == 0, done.stderr[-4000:]


def test_sharded_engram_tables_train_score_and_checkpoint_as_replicated_ones(corpus, tmp_path, one_thread):
    """--engram-shard on 2 ranks against the replicated DDP run of the same config (one launch, ~25 s):
    the same losses and evals, the same tables and SparseRowAdam state once gathered, and checkpoints
    that load at another world size (2 sharded → 1, 1 → 2 sharded) with the identical eval. The held-out
    walk has an odd number of batches, so one rank joins the last round's lookups with an empty request.
    Without gradient clipping the two runs are equal bit for bit. With it they are not: the clip's norm
    adds the shards' squared norms in another order, which moves a weight by an ulp (measured: 6e-8 on
    norm weights near 1), and 4 steps carry that into the tables (measured 4e-9 with separate input
    projections, 1.8e-7 with fused ones): hence 1e-6 there, against tables of magnitude ~0.1."""
    assert len(list(heldout_windows(corpus, TRAIN["seq_len"], TRAIN["batch_size"]))) % 2 == 1
    single = Trainer(tiny_config(), corpus, tmp_path / "single", corpus_note="test")
    single.run_loop()
    single_bpb = records(single.run, "eval")[-1]["bpb"]
    started = time.monotonic()
    done = torchrun(WORKER, "shard", corpus.root, tmp_path, tmp_path / "single")
    assert done.returncode == 0, done.stderr[-4000:]
    print(f"torchrun shard: {time.monotonic() - started:.1f} s")
    for suffix, atol in (("-noclip", 0.0), ("", 1e-6)):
        replicated, sharded = tmp_path / f"replicated{suffix}", tmp_path / f"sharded{suffix}"
        ce, evals = [r["ce"] for r in records(sharded, "train")], records(sharded, "eval")
        ref_ce, ref_evals = [r["ce"] for r in records(replicated, "train")], records(replicated, "eval")
        if atol:
            assert ce == pytest.approx(ref_ce, rel=1e-6)
            assert [e["bpb"] for e in evals] == pytest.approx([e["bpb"] for e in ref_evals], rel=1e-6)
        else:
            assert ce == ref_ce and [e["bpb"] for e in evals] == [e["bpb"] for e in ref_evals]
        assert [e["engram"] for e in evals] == [e["engram"] for e in ref_evals]
        # rank 0 wrote whole tables and whole row-wise state: the replicated run's
        ours, theirs = checkpoint.load(sharded), checkpoint.load(replicated)
        for part in ("tensors", "optimizer_tensors"):
            mine, ref = getattr(ours, part)[ENGRAM_FILE], getattr(theirs, part)[ENGRAM_FILE]
            assert mine.keys() == ref.keys()
            for key, value in ref.items():
                torch.testing.assert_close(mine[key], value, rtol=0, atol=atol, msg=key)
        step = "engram.0.table.weight.step"
        assert torch.equal(ours.optimizer_tensors[ENGRAM_FILE][step], theirs.optimizer_tensors[ENGRAM_FILE][step])
    # 2 sharded → 1: the whole tables, scored alone, give the score the two ranks agreed on, bit for bit
    alone = Trainer(tiny_config(), corpus, sharded, corpus_note="test", resume=True)
    assert alone.evaluate([], [])["bpb"] == evals[-1]["bpb"]
    # 1 → 2 sharded: a one-process checkpoint cut into shards scores as it did alone
    resumed = [json.loads((tmp_path / f"shard-resumed-{r}.json").read_text()) for r in (0, 1)]
    assert resumed[0]["bpb"] == resumed[1]["bpb"] == single_bpb
