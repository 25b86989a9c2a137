"""DSpark: the window comes from input_ids only, the anchors follow floor((T − k − 1) / stride), a short
sequence has a term of exactly zero, and gradients reach the draft head (and the trunk when asked)."""

import pytest
import torch

from dormouse import config, rng
from dormouse.errors import ConfigError
from dormouse.model.dspark import anchors, window
from dormouse.model.model import DormouseLM
from dormouse.resolve import resolve


def tiny(**extra):
    """A small model with the draft head, the engram on and dropout off (the term's numbers are exact)."""
    model = {"d_model": 32, "n_heads": 2, "ffn_hidden": 64, "kda_chunk_size": 16, "engram": True, "dropout": 0.0}
    model["engram_rows"] = 512
    model.update({"engram_dim": 8, "dspark_weight": 0.5, "dspark_k": 3, "dspark_stride": 4, **extra})
    cfg = config.build("nano", {"model": model, "train": {"seq_len": 24}})
    return resolve(cfg, cuda_available=False).model


def ids(b, t, step=0):
    return torch.randint(0, 256, (b, t), generator=rng.generator(0, step, "test"))


@pytest.mark.parametrize(
    "length, k, stride, positions",
    [
        (512, 4, 16, list(range(0, 481, 16))),  # the default: 31 anchors, 0 … 480
        (21, 4, 16, [0]),  # T = k + 1 + stride: the first window
        (20, 4, 16, []),  # one byte short
        (12, 2, 3, [0, 3, 6]),  # floor(9 / 3) = 3
        (13, 2, 3, [0, 3, 6]),  # floor(10 / 3) = 3
        (15, 2, 3, [0, 3, 6, 9]),  # floor(12 / 3) = 4
        (10, 1, 1, [0, 1, 2, 3, 4, 5, 6, 7]),  # stride 1: a window at every position but the last two
        (3, 4, 1, []),  # shorter than the window itself
    ],
)
def test_anchor_count_and_positions_follow_the_formula(length, k, stride, positions):
    assert anchors(length, k, stride).tolist() == positions
    assert len(positions) == max(0, (length - k - 1) // stride)
    # Every window fits with a stride to spare: p + k ≤ T − 1 − stride.
    assert all(p + k <= length - 1 - stride for p in positions)


def test_the_window_is_built_from_input_ids():
    x = torch.arange(12)[None] * 10  # x[t] = 10 t: a byte names its position
    fed, target = window(x, anchors(12, 2, 3), 2)
    assert fed.tolist() == [[[0, 10], [30, 40], [60, 70]]]  # slot j is fed x[p + j]: the anchor byte first
    assert target.tolist() == [[[10, 20], [40, 50], [70, 80]]]  # and scored on x[p + j + 1]


def test_the_term_does_not_read_the_label_sequence():
    model = DormouseLM(tiny())
    x = ids(2, 24)
    a = model(x, ids(2, 24, step=1)).aux["dspark"]
    b = model(x, ids(2, 24, step=2)).aux["dspark"]  # other labels, same inputs
    assert a > 0 and torch.equal(a, b)
    assert not torch.equal(a, model(ids(2, 24, step=3)).aux["dspark"])  # other inputs do move it


@pytest.mark.parametrize("k, stride", [(3, 4), (1, 1), (4, 16)])
def test_the_term_is_exactly_zero_when_no_window_fits(k, stride):
    model = DormouseLM(tiny(dspark_k=k, dspark_stride=stride))
    short = k + stride  # T < k + 1 + stride
    out = model(ids(2, short), ids(2, short, step=1))
    assert out.aux["dspark"].item() == 0.0
    assert torch.equal(out.loss, out.ce)
    assert model(ids(2, short + 1), ids(2, short + 1, step=1)).aux["dspark"] > 0  # the first window


@pytest.mark.parametrize("detach", [True, False])
def test_gradients_reach_the_draft_head_and_the_trunk_only_when_asked(detach):
    model = DormouseLM(tiny(dspark_detach=detach))
    model(ids(2, 24)).aux["dspark"].backward()  # the term alone
    moved = {n for n, p in model.named_parameters() if p.grad is not None and p.grad.to_dense().abs().sum() > 0}
    draft = {n for n, _ in model.named_parameters() if n.startswith("draft.")}
    assert draft <= moved
    trunk = {"layers.0.mixer.q_proj.weight", "layers.1.ffn.w_down.weight", "embed.weight"}
    assert (trunk <= moved) is (not detach) and (not trunk & moved) is detach


def test_loss_adds_the_weighted_term_and_off_adds_no_head():
    model = DormouseLM(tiny(dspark_weight=0.25))
    out = model(ids(2, 24), ids(2, 24, step=1))
    assert torch.allclose(out.loss, out.ce + 0.25 * out.aux["dspark"])
    off = DormouseLM(tiny(dspark_weight=0.0))
    assert off.draft is None and "dspark" not in off(ids(2, 24)).aux
    # With the head off every other weight is what it was: the head is drawn last.
    on_state, off_state = model.state_dict(), off.state_dict()
    assert all(torch.equal(on_state[k], v) for k, v in off_state.items())


def test_decode_forwards_build_no_term():
    model = DormouseLM(tiny()).eval()
    assert "dspark" not in model(ids(1, 24), cache=model.new_cache(1), return_cache=True).aux


def test_config_refuses_stride_zero_and_a_sequence_with_no_window():
    with pytest.raises(ConfigError, match=r"dspark_stride 0 is out of range"):
        tiny(dspark_stride=0)
    with pytest.raises(ConfigError, match=r"seq_len 24 is below dspark_k \+ 1 \+ dspark_stride = 25"):
        tiny(dspark_k=4, dspark_stride=20)
    tiny(dspark_weight=0.0, dspark_k=4, dspark_stride=20)  # off: no window is needed


def test_decode_drafts_are_the_training_slots_fed_their_own_drafts():
    model = DormouseLM(tiny(dspark_k=4))
    h = torch.randn(2, 32, generator=rng.generator(0, 4, "test"))
    anchor, first = ids(2, 1)[:, 0], ids(2, 1, step=1)[:, 0]
    drafts, slot_logits = model.draft.draft(h, anchor, first, 3)
    fed = torch.cat([anchor[:, None], first[:, None], drafts[:, :2]], -1)  # what slot j reads in training
    with torch.no_grad():
        logits = model.draft(h[:, None], fed[:, None])[:, 0]  # [B, k, 256]
    assert torch.equal(logits[:, 1:], slot_logits)  # slot 0 is replaced by `first` at decode
    assert torch.equal(logits[:, 1:].argmax(-1), drafts)
