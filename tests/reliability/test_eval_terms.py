"""Every number of an eval is checked; a term with nothing to score says n/a, not 0."""

import contextlib
import math

import pytest
import torch

from dormouse import config
from dormouse.evaluation import NonFiniteError, eval_line, eval_record, heldout_score
from dormouse.model.model import DormouseLM
from dormouse.resolve import resolve


def dspark_model():
    model = {"d_model": 32, "n_heads": 2, "ffn_hidden": 64, "kda_chunk_size": 16, "dspark_weight": 0.1}
    cfg = resolve(config.build("nano", {"model": model, "train": {"seq_len": 32}}), cuda_available=False)
    return DormouseLM(cfg.model, seed=0)


def score(model, corpus, seq_len):
    return heldout_score(
        model, corpus, seq_len=seq_len, batch_size=4, eval_bytes=0, device="cpu", autocast=contextlib.nullcontext
    )


def line(held) -> str:
    return eval_line(eval_record(5, held, train_ce=None, tokens=0, ms_per_step=None, depth=2, stress="spikes=0"))


def test_a_nan_draft_head_stops_the_eval_naming_dspark(corpus):
    model = dspark_model()
    held = score(model, corpus, 32)
    assert math.isfinite(held.aux["dspark"]) and held.aux["dspark"] > 0 and " dspark=n/a " not in line(held)
    with torch.no_grad():
        for p in model.draft.parameters():
            p.fill_(float("nan"))
    with pytest.raises(NonFiniteError, match="held-out dspark term is nan"):
        score(model, corpus, 32)


def test_a_nan_cross_entropy_stops_the_held_out_score_itself(corpus):
    # heldout_score is read without an eval record too (`dormouse ab`): its own check stops a NaN.
    model = dspark_model()
    with torch.no_grad():
        model.final_norm.weight.fill_(float("nan"))
    with pytest.raises(NonFiniteError, match="held-out cross-entropy is nan"):
        score(model, corpus, 32)


def test_no_window_that_fits_reads_n_a(corpus):
    held = score(dspark_model(), corpus, 16)  # 16 bytes < dspark_k + 1 + stride: no anchor
    assert held.aux == {"dspark": None, "jepa": "off"}
    assert " dspark=n/a jepa=off " in line(held)


@pytest.mark.parametrize("term", ["train_ce", "ms_per_step"])
def test_every_number_of_the_eval_record_is_checked(corpus, term):
    held = score(dspark_model(), corpus, 32)
    values = {"train_ce": None, "ms_per_step": None, term: float("inf")}
    with pytest.raises(NonFiniteError, match=f"eval at step 5: {term} is inf"):
        eval_record(5, held, tokens=0, depth=2, stress="", **values)
