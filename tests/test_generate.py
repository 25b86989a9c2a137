import pytest
import torch

from dormouse import config, rng
from dormouse.decode.generate import generate
from dormouse.errors import DormouseError
from dormouse.model.model import DormouseLM


def tiny_model(sharpen=40.0, **model):
    values = {"d_model": 32, "n_heads": 2, "ffn_hidden": 64, "kda_chunk_size": 16, **model}
    cfg = config.resolve(config.build("nano", {"model": values}), cuda_available=False)
    model = DormouseLM(cfg.model, seed=3).eval()
    with torch.no_grad():  # sharpen the untrained model so greedy choices are not near-ties
        model.embed.weight.mul_(sharpen)
    return model


@pytest.mark.parametrize("mixer", ["kda", "attention"])
def test_greedy_decoding_equals_argmax_of_the_full_forward(mixer):
    model = tiny_model(mixer=mixer)
    prompt = b"The dormouse"
    out = generate(model, prompt, max_bytes=12, temperature=0)
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(12):
            seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
    assert out.bytes == bytes(seq[len(prompt) :])


def test_sampling_is_a_function_of_the_seed():
    model = tiny_model(sharpen=1.0)  # near-uniform: every draw matters
    torch.manual_seed(0)
    a = generate(model, b"abc", max_bytes=16, temperature=1.0, seed=1).bytes
    torch.manual_seed(99)
    b = generate(model, b"abc", max_bytes=16, temperature=1.0, seed=1).bytes
    c = generate(model, b"abc", max_bytes=16, temperature=1.0, seed=2).bytes
    assert a == b and a != c


def test_top_k_one_is_greedy():
    model = tiny_model()
    greedy = generate(model, b"xyz", max_bytes=10, temperature=0).bytes
    assert generate(model, b"xyz", max_bytes=10, temperature=1.5, top_k=1, seed=5).bytes == greedy


def test_sampled_bytes_follow_the_distribution():
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1] + [0.0] * 253]) + 1e-30)
    from dormouse.decode.generate import sample

    draws = [int(sample(logits, 1.0, 0, rng.generator(0, i, "decode"))) for i in range(2000)]
    freq = [draws.count(b) / len(draws) for b in range(3)]
    assert freq == pytest.approx([0.7, 0.2, 0.1], abs=0.03)


def test_refusals():
    model = tiny_model()
    with pytest.raises(DormouseError, match="prompt is empty"):
        generate(model, b"", max_bytes=4)
    with pytest.raises(DormouseError, match="max_bytes must be >= 1"):
        generate(model, b"a", max_bytes=0)
    with pytest.raises(DormouseError, match="top_k in"):
        generate(model, b"a", max_bytes=2, top_k=300)
