"""`dormouse replay`: a step replayed in two fresh processes is IDENTICAL; an injected non-deterministic
op is caught as DIFFERS; refusals are one-line errors."""

import hashlib

import pytest

from dormouse import config, config_flags
from dormouse.cli import build_parser, main
from dormouse.data.shards import load_corpus
from dormouse.resolve import resolve
from dormouse.tools import replay
from dormouse.tools.replay import INJECT_ENV, compare
from dormouse.train.trainer import Trainer

# The Engram arm is off: its 16384-row tables would dominate the tiny model's time.
TINY_MODEL = {"d_model": 32, "n_heads": 2, "ffn_hidden": 64, "kda_chunk_size": 16}
TINY_MODEL.update({"engram": False})
TINY_TRAIN = {"seq_len": 32, "batch_size": 4, "steps": 12, "warmup_steps": 2, "eval_every": 2, "ckpt_every": 2}


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def corpus_dir(random_corpus):
    return random_corpus(6000, repeats=2)


@pytest.fixture(scope="module")
def run(corpus_dir, tmp_path_factory):
    """A tiny run trained to step 4, with checkpoints after 2 and 4 updates."""
    cfg = resolve(config.build("nano", {"model": TINY_MODEL, "train": TINY_TRAIN}), cuda_available=False)
    run = tmp_path_factory.mktemp("runs") / "tiny"
    Trainer(cfg, load_corpus(corpus_dir), run, corpus_note="test corpus").run_loop(until_step=4)
    return run


def digest(run) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in run.rglob("*") if p.is_file()}


def test_a_replayed_step_is_identical_and_the_run_is_untouched(run, capsys, monkeypatch):
    monkeypatch.delenv(INJECT_ENV, raising=False)
    before = digest(run)
    assert main(["replay", str(run), "--step", "2"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("IDENTICAL"))
    assert line.startswith("IDENTICAL step=2 loss=") and " grad_norm=" in line and " weights=" in line
    # The run's own record of train_step(2) (metrics.jsonl step 3), from the training process: equal too.
    assert "logged ce=" in out and "equal to worker a's" in out and "NOT equal" not in out
    assert "injected noise" not in out
    assert digest(run) == before


def test_an_injected_nondeterministic_op_is_caught(run, capsys, monkeypatch):
    monkeypatch.setenv(INJECT_ENV, "1")
    assert main(["replay", str(run)]) == 1  # default: the last checkpoint (step 4)
    out = capsys.readouterr().out
    assert "DIFFERS at loss: " in out
    assert out.count("injected noise") == 2


def test_replay_without_a_run_trains_the_config_first(corpus_dir, capsys, monkeypatch):
    """The temporary run is trained, checkpointed and resumable at step N. The workers are called in this
    process here (the two-process path is the RUN tests' own), so only the config path is new."""
    seen = {}

    def in_process(run, step, data, tmp):
        seen["ckpt"] = sorted(p.name for p in (run / "ckpt").iterdir())
        result = replay.replay_step(run, step, data)
        return result, dict(result)

    monkeypatch.setattr(replay, "_run_workers", in_process)
    flags = ["--d-model", "32", "--n-heads", "2", "--ffn-hidden", "64", "--seq-len", "32", "--batch-size", "4"]
    flags += ["--no-kda", "--grad-clip", "0", "--device", "cpu", "--no-engram"]
    assert main(["replay", "--data", str(corpus_dir), "--step", "2", *flags]) == 0
    assert "IDENTICAL step=2 " in capsys.readouterr().out
    assert seen["ckpt"] == ["last", "step-00000002"]


def test_compare_reports_the_first_field_that_differs():
    a = {"step": 3, "loss": (1.5).hex(), "grad_norm": (0.25).hex(), "weights": "ab" * 32}
    assert compare(3, a, dict(a)).identical
    v = compare(3, a, {**a, "grad_norm": (0.5).hex(), "weights": "cd" * 32})
    assert not v.identical and v.line == "DIFFERS at grad_norm: 0.25 != 0.5"
    v = compare(3, a, {**a, "weights": "cd" * 32})
    assert v.line == f"DIFFERS at weights: {'ab' * 32} != {'cd' * 32}"


def test_a_missing_checkpoint_and_config_flags_with_a_run_are_refused(run, capsys):
    assert main(["replay", str(run), "--step", "3"]) == 2
    err = capsys.readouterr().err
    assert "no checkpoint after 3 updates" in err and "step-00000002, step-00000004" in err
    assert main(["replay", str(run), "--d-model", "64"]) == 2
    assert "--d-model cannot be given with RUN" in capsys.readouterr().err


def test_a_step_with_dropout_replays_identical_with_the_masks_of_its_step(corpus_dir, tmp_path, capsys, monkeypatch):
    """Two real worker processes draw the dropout masks of (seed, step 1): the same as this process's."""
    monkeypatch.delenv(INJECT_ENV, raising=False)
    flags = ["--d-model", "32", "--n-heads", "2", "--ffn-hidden", "64", "--seq-len", "32", "--batch-size", "4"]
    flags += ["--no-kda", "--device", "cpu", "--no-engram"]
    assert main(["replay", "--data", str(corpus_dir), "--step", "1", *flags, "--dropout", "0.1"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("IDENTICAL step=1 "))
    loss = float(line.split(" loss=")[1].split()[0])

    def second_step_ce(dropout: str) -> float:
        cfg = config_flags.config_from_args(build_parser().parse_args(["replay", *flags, "--dropout", dropout]))
        trainer = Trainer(cfg, load_corpus(corpus_dir), tmp_path / dropout, corpus_note="test corpus")
        trainer.train_step(0)
        return trainer.train_step(1)

    assert second_step_ce("0.1") == loss
    assert second_step_ce("0.0") != loss  # the workers did drop
