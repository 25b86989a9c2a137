"""Weight averaging (train/ema.py): the recurrence by hand, the swap, and the checkpoint file's checks."""

import pytest
import torch

from dormouse import config, config_checks
from dormouse.errors import CheckpointError, ConfigError
from dormouse.train.ema import WeightAverage, load_average_


def test_the_average_follows_the_recurrence_computed_by_hand():
    model = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(0.5)
    avg = WeightAverage(model, decay=0.9)
    expected = 0.5
    for step, value in enumerate([1.0, 2.0, 3.0, -4.0, 0.25] + [1.0] * 90):
        with torch.no_grad():
            model.weight.fill_(value)
        avg.update(step)
        d = min(0.9, (1 + step) / (10 + step))  # 0.1, 2/11, 3/12, ...; 0.9 from step 80 on
        expected = d * expected + (1 - d) * value
        assert avg.average[0][0, 0].item() == pytest.approx(expected, rel=1e-6)
    assert avg.decay_at(0) == 0.1 and avg.decay_at(10**6) == 0.9


def test_in_model_swaps_the_average_in_and_the_trained_weights_back_in_place():
    model = torch.nn.Linear(3, 2)
    avg = WeightAverage(model, decay=0.5)
    trained = {n: p.detach().clone() for n, p in model.named_parameters()}
    with torch.no_grad():
        for p in avg.average:
            p.fill_(7.0)
    pointers = [p.data_ptr() for p in model.parameters()]
    with avg.in_model():
        assert all(torch.all(p == 7.0) for p in model.parameters())
    assert [p.data_ptr() for p in model.parameters()] == pointers  # a captured graph's addresses hold
    assert all(torch.equal(p, trained[n]) for n, p in model.named_parameters())


def test_loading_refuses_a_missing_file_or_other_parameters():
    model = torch.nn.Linear(3, 2)
    with pytest.raises(CheckpointError, match="no ema.safetensors"):
        load_average_(model, None)
    with pytest.raises(CheckpointError, match="other parameters than the model's: \\['bias'\\]"):
        load_average_(model, {"weight": torch.zeros(2, 3)})
    load_average_(model, {"weight": torch.ones(2, 3), "bias": torch.full((2,), 2.0)})
    assert model.weight.sum().item() == 6.0 and model.bias.sum().item() == 4.0


@pytest.mark.parametrize("train", [{"parallel": "fsdp"}, {"engram_shard": True, "parallel": "ddp"}])
def test_config_refuses_averaging_sharded_parameters(train):
    with pytest.raises(ConfigError, match="ema_decay averages whole parameters"):
        config_checks.validate(config.build("nano", {"model": {"engram": True}, "train": {"ema_decay": 0.99, **train}}))
