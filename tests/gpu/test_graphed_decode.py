"""On CUDA: `dormouse generate --cuda-graph` gives plain decoding's bytes and logits, bit for bit, greedy and
sampled, from a prompt of one byte (an empty state before the first, eager, step) or several. Skipped
without CUDA."""

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

from dormouse import config  # noqa: E402
from dormouse.decode.decoder import Decoder, sample  # noqa: E402
from dormouse.decode.graphed import GraphedDecoder  # noqa: E402
from dormouse.model.model import DormouseLM  # noqa: E402
from dormouse.ops import passes  # noqa: E402
from dormouse.resolve import resolve


def model_on_cuda(**arm):
    values = {"d_model": 64, "n_heads": 2, "ffn_hidden": 128, **arm}
    cfg = resolve(config.build("nano", {"model": values, "train": {"device": "cuda"}}), cuda_available=True)
    return passes.schedule(DormouseLM(cfg.model, seed=3)).cuda().eval()  # as runs.load_model builds it


def logits_and_bytes(decoder, n):
    got = []
    for _ in range(n):
        with torch.no_grad():
            logits, decoder.cache = decoder._step()
        got.append(logits.clone())
        decoder.last = sample(logits, decoder.temperature, 0, torch.Generator().manual_seed(len(got)))
    return got


@pytest.mark.parametrize("arm", [{}, {"n_experts": 2, "experts_dense": True}], ids=["default", "experts-dense"])
@pytest.mark.parametrize("prompt", [b"T", b"The dormouse"], ids=["one-byte", "prompt"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_graphed_decoding_equals_plain_decoding_bitwise(arm, prompt, temperature):
    model = model_on_cuda(**arm)
    plain = Decoder(model, prompt, temperature=temperature, seed=5)
    graphed = GraphedDecoder(model, prompt, temperature=temperature, seed=5)
    want, got = logits_and_bytes(plain, 24), logits_and_bytes(graphed, 24)
    assert graphed.graph is not None
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)
    again = GraphedDecoder(model, prompt, temperature=temperature, seed=5)
    assert again.extend(24) == Decoder(model, prompt, temperature=temperature, seed=5).extend(24)
