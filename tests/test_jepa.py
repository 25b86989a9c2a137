"""JEPA: span starts are a pure function of (seed, step), the term is 1 − cos(prediction, stop-gradient
teacher latent), its gradient reaches the predictor and the context, and a run with it resumes bitwise."""

import json
import subprocess
import sys

import pytest
import torch
from torch import nn

from dormouse import config, rng
from dormouse.data.shards import load_corpus
from dormouse.errors import ConfigError, DormouseError
from dormouse.evaluation import heldout_score
from dormouse.model.jepa import Predictor, jepa_term, span_starts
from dormouse.model.model import DormouseLM
from dormouse.resolve import resolve
from dormouse.train.trainer import Trainer


def test_same_seed_and_step_give_the_same_starts_in_two_processes():
    code = "from dormouse.model.jepa import span_starts; print(span_starts(3, 7, 4, 64, 8, 5).tolist())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == span_starts(3, 7, 4, 64, 8, 5).tolist()


def test_starts_differ_by_step_and_seed_and_fit():
    a = span_starts(3, 7, 4, 64, 8, 5)
    assert not torch.equal(a, span_starts(3, 8, 4, 64, 8, 5))
    assert not torch.equal(a, span_starts(4, 7, 4, 64, 8, 5))
    assert not torch.equal(a, span_starts(3, 7, 4, 64, 8, 5, "jepa_eval"))
    assert a.shape == (4, 5) and a.min() >= 1 and a.max() <= 64 - 8  # a span ends inside the sequence
    assert all(row.unique().numel() == 5 and torch.equal(row, row.sort().values) for row in a)
    assert span_starts(0, 0, 1, 9, 8, 1).tolist() == [[1]]  # the one start that fits
    with pytest.raises(DormouseError, match="need sequences of at least 10 bytes"):
        span_starts(0, 0, 1, 9, 8, 2)


def test_the_term_on_a_hand_built_case():
    hidden = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, 0.0]]])
    # One span of 2 at s = 1: context h[0] = (1, 0); teacher mean(h[1], h[2]) = (0.5, 1);
    # cos = 0.5 / √1.25, term = 1 − 0.5 / √1.25.
    term = jepa_term(nn.Identity(), hidden, hidden, torch.tensor([[1]]), 2)
    assert term.item() == pytest.approx(1 - 0.5 / 1.25**0.5, abs=1e-6)
    # Two spans (s = 1 and s = 2, span 2): context h[1] = (0, 1) vs teacher (1.5, 0.5): cos = 0.5 / √2.5.
    term = jepa_term(nn.Identity(), hidden, hidden, torch.tensor([[1, 2]]), 2)
    assert term.item() == pytest.approx(((1 - 0.5 / 1.25**0.5) + (1 - 0.5 / 2.5**0.5)) / 2, abs=1e-6)
    with pytest.raises(DormouseError, match="no teacher latent"):
        jepa_term(nn.Identity(), hidden, hidden, None, 2)


def test_gradient_reaches_the_predictor_and_the_context_not_the_teacher():
    predictor = Predictor(4, eps=1e-6, generator=rng.generator(0, 0, "test"))
    hidden = torch.randn(1, 10, 4, generator=rng.generator(0, 1, "test")).requires_grad_()
    jepa_term(predictor, hidden, hidden * 2, torch.tensor([[3]]), 4).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in predictor.parameters())
    moved = (hidden.grad.abs().sum(-1) > 0)[0].tolist()
    assert moved == [i == 2 for i in range(10)]  # only the context h[s − 1]: the teacher is a stop-gradient


def tiny(**extra):
    """A small model with the JEPA term, the engram on and dropout off (the term's numbers are exact)."""
    model = {"d_model": 32, "n_heads": 2, "ffn_hidden": 64, "kda_chunk_size": 16, "engram": True, "dropout": 0.0}
    model["engram_rows"] = 512
    model.update({"engram_dim": 8, "jepa_weight": 0.5, "jepa_span": 4, "jepa_spans": 3, **extra})
    cfg = config.build("nano", {"model": model, "train": {"seq_len": 24}})
    return resolve(cfg, cuda_available=False).model


def test_model_term_weight_and_a_missing_mask():
    model = DormouseLM(tiny())
    x = torch.randint(0, 256, (2, 24), generator=rng.generator(0, 0, "test"))
    y = torch.randint(0, 256, (2, 24), generator=rng.generator(0, 1, "test"))
    out = model(x, y, jepa_starts=span_starts(0, 0, 2, 24, 4, 3))
    assert torch.allclose(out.loss, out.ce + 0.5 * out.aux["jepa"]) and out.aux["jepa"] > 0
    out.loss.backward()
    assert all(p.grad.abs().sum() > 0 for p in model.jepa.parameters())
    with pytest.raises(DormouseError, match="no span starts"):
        model(x, y)  # a training forward without its mask is refused, never a term of zero
    assert "jepa" not in model(x).aux  # decode and plain forwards have no term
    with pytest.raises(ConfigError, match=r"seq_len 24 is below jepa_span \+ jepa_spans = 25"):
        tiny(jepa_span=20, jepa_spans=5)


@pytest.fixture(scope="module")
def corpus(random_corpus):
    return load_corpus(random_corpus(3000))


def run_config(**model):
    train = {"seq_len": 32, "batch_size": 2, "steps": 4, "warmup_steps": 1, "eval_every": 2, "ckpt_every": 2}
    values = {"d_model": 32, "n_heads": 2, "ffn_hidden": 64, "kda_chunk_size": 16, "engram": True, "engram_rows": 512}
    values.update({"engram_dim": 8, "jepa_weight": 0.5, "dspark_weight": 0.5, "dspark_stride": 8, **model})
    return resolve(config.build("nano", {"model": values, "train": train}), cuda_available=False)


def records(run, kind):
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == kind]


def test_a_resumed_run_draws_the_same_masks_and_the_eval_line_names_both_terms(corpus, tmp_path, one_thread):
    cfg = run_config()
    Trainer(cfg, corpus, tmp_path / "a", corpus_note="test").run_loop()
    Trainer(cfg, corpus, tmp_path / "b", corpus_note="test").run_loop(until_step=2)
    resumed = Trainer(cfg, corpus, tmp_path / "b", corpus_note="test", resume=True)
    assert torch.equal(resumed.step_runner.jepa_starts(3), span_starts(cfg.train.seed, 3, 2, 32, 8, 4))
    resumed.run_loop()
    assert [r["ce"] for r in records(tmp_path / "a", "train")] == [r["ce"] for r in records(tmp_path / "b", "train")]
    last = records(tmp_path / "a", "eval")[-1]
    assert last["dspark"] > 0 and last["jepa"] > 0
    line = [x for x in (tmp_path / "a" / "train.log").read_text().splitlines() if x.startswith("eval ")][-1]
    assert f" dspark={last['dspark']:.4f} jepa={last['jepa']:.4f} " in line
    off = DormouseLM(run_config(jepa_weight=0.0, dspark_weight=0.0).model)
    held = heldout_score(off, corpus, seq_len=32, batch_size=2, eval_bytes=0, device="cpu", autocast=torch.no_grad)
    assert held.aux == {"dspark": "off", "jepa": "off"}
    # A held-out window too short for any DSpark anchor has nothing to score: n/a (k + 1 + stride = 13 > 12).
    short = DormouseLM(run_config(jepa_weight=0.0).model)
    held = heldout_score(short, corpus, seq_len=12, batch_size=2, eval_bytes=0, device="cpu", autocast=torch.no_grad)
    assert held.aux == {"dspark": None, "jepa": "off"}
