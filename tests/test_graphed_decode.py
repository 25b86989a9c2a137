"""decode/graphed.py on the CPU: the cache's tensors out and back in (the capture's static buffers), the
decoder around a graph with the replay contract emulated, and every refusal. A real capture and replay
need CUDA: tests/gpu/test_graphed_decode.py."""

from dataclasses import dataclass

import pytest
import torch
from test_generate import tiny_model
from untrained_run import save_untrained_run

from dormouse.cli import main
from dormouse.decode import graphed
from dormouse.decode.decoder import Decoder
from dormouse.decode.generate import generate
from dormouse.decode.graphed import GraphedDecoder, cache_tensors, check_capturable, with_tensors
from dormouse.errors import DormouseError


def test_a_cache_rebuilt_from_copies_of_its_tensors_steps_exactly_as_the_cache():
    model = tiny_model(engram_layers="0,1", n_experts=2, experts_dense=True)
    decoder = Decoder(model, b"The dormouse", temperature=0)
    decoder.extend(3)
    cache, byte = decoder.cache, decoder.last
    tensors = cache_tensors(cache)
    kinds = {type(t) for t in tensors}
    assert kinds == {torch.Tensor} and len(tensors) == len({id(t) for t in tensors}) > 10
    copies = [t.clone() for t in tensors]
    rebuilt = with_tensors(cache, iter(copies))
    assert all(a is b for a, b in zip(cache_tensors(rebuilt), copies, strict=True))
    assert (rebuilt.position, rebuilt.iterations) == (cache.position, cache.iterations)
    with torch.no_grad():
        want, after = model.step(byte, cache)
        got, after_rebuilt = model.step(byte, rebuilt)
    assert torch.equal(got, want)
    for a, b in zip(cache_tensors(after_rebuilt), cache_tensors(after), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize(
    "arm, exit_threshold, named",
    [
        ({"attention_layers": "1"}, 1.0, "attention layers"),
        ({"n_experts": 2}, 1.0, "sparse experts"),
        ({"mor": True}, 1.0, "MoR"),
        ({}, 0.9, "--exit-threshold"),
    ],
)
def test_what_a_captured_step_cannot_hold_is_refused_by_name(arm, exit_threshold, named):
    with pytest.raises(DormouseError, match=f"--cuda-graph decoding cannot capture .*{named}"):
        check_capturable(tiny_model(**arm), exit_threshold)
    check_capturable(tiny_model(), 1.0)  # the default arms are capturable


def test_graphed_decoding_is_refused_off_cuda_and_with_speculative():
    model = tiny_model()
    with pytest.raises(DormouseError, match="--cuda-graph decodes on CUDA; this model is on cpu"):
        GraphedDecoder(model, b"ab", temperature=0)
    with pytest.raises(DormouseError, match="--speculative and --cuda-graph"):
        generate(model, b"ab", max_bytes=2, speculative=True, cuda_graph=True)


def test_cli_generate_cuda_graph_on_the_cpu_is_refused(tmp_path, capsys):
    save_untrained_run(tmp_path, {"d_model": 32, "n_heads": 2, "engram": True, "engram_rows": 512})
    argv = ["generate", str(tmp_path), "--ckpt", "last", "--prompt", "ab", "--device", "cpu", "--cuda-graph"]
    assert main(argv) == 2
    assert "--cuda-graph decodes on CUDA; this model is on cpu" in capsys.readouterr().err


class ReplayedOnTheCpu:
    """A stand-in for a captured graph with a CUDA graph's contract: capturing executes nothing and returns
    the outputs' tensors; each replay runs the step again and writes its results into those tensors."""

    def __init__(self, run):
        self.run = run
        self.outputs = run(False)  # the tensors a capture would hand back (their values are not read)

    def replay(self):
        logits, after, _ = self.run(True)
        self.outputs[0].copy_(logits)
        for static, value in zip(cache_tensors(self.outputs[1]), cache_tensors(after), strict=True):
            static.copy_(value)


@pytest.fixture
def graphs_on_the_cpu(monkeypatch):
    """GraphedDecoder on the CPU, its captures ReplayedOnTheCpu."""
    monkeypatch.setattr(graphed, "check_device", lambda device: None)
    monkeypatch.setattr(graphed, "capture", lambda run: (graph := ReplayedOnTheCpu(run), graph.outputs))


@pytest.mark.parametrize("prompt", [b"T", b"The dormouse"], ids=["one-byte", "prompt"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_decoder_around_a_graph_gives_plain_decodings_bytes(prompt, temperature, graphs_on_the_cpu):
    # What the GPU test checks end to end, here with the graph's replay contract emulated: the static
    # buffers, the state written back after each step, the eager first byte, positions and sampling.
    model = tiny_model(sharpen=1.0 if temperature else 40.0, engram_layers="0,1")
    plain = Decoder(model, prompt, temperature=temperature, seed=5)
    emulated_graph = GraphedDecoder(model, prompt, temperature=temperature, seed=5)
    for n in (1, 5, 10):  # extended in parts, as a decode may be
        assert emulated_graph.extend(n) == plain.extend(n)
    assert emulated_graph.graph is not None and emulated_graph.cache.position == plain.cache.position


@dataclass
class PairCache:
    pair: list
    position: int
    iterations: int = 1


class Swapper(torch.nn.Module):
    """A model whose step passes its two state tensors through, swapped: each is another's buffer."""

    def __init__(self):
        super().__init__()
        self.cfg, self.weight = tiny_model().cfg, torch.nn.Parameter(torch.zeros(1))

    def new_cache(self, batch_size, device):
        return PairCache([torch.tensor([1.0]), torch.tensor([2.0])], 0)

    def step(self, byte, cache, **exit):
        first, second = cache.pair
        return torch.zeros(1, 256), PairCache([second, first], cache.position + 1)


def test_a_state_passed_through_into_another_buffer_is_copied_before_it_is_overwritten(graphs_on_the_cpu):
    decoder = GraphedDecoder(Swapper(), b"T", temperature=0)
    pairs = []
    for _ in range(4):  # the first eager, the rest replayed
        decoder.extend(1)
        pairs.append([float(t) for t in decoder.cache.pair])
    assert pairs == [[2.0, 1.0], [1.0, 2.0], [2.0, 1.0], [1.0, 2.0]]
