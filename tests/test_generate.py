import math
import re

import pytest
import torch
from untrained_run import save_untrained_run

from dormouse import config, rng
from dormouse.cli import main
from dormouse.decode.decoder import Decoder, sample
from dormouse.decode.generate import generate
from dormouse.errors import DormouseError
from dormouse.model.model import DormouseLM
from dormouse.resolve import resolve


def tiny_model(sharpen=40.0, **model):
    values = {"d_model": 32, "n_heads": 2, "ffn_hidden": 64, "kda_chunk_size": 16, "engram": True, **model}
    cfg = resolve(config.build("nano", {"model": values}), cuda_available=False)
    model = DormouseLM(cfg.model, seed=3).eval()
    with torch.no_grad():  # sharpen the untrained model so greedy choices are not near-ties
        model.embed.weight.mul_(sharpen)
    return model


@pytest.mark.parametrize(
    "arm", [{"mixer": "kda"}, {"mixer": "attention"}, {"attention_layers": "1"}], ids=["kda", "attention", "hybrid"]
)
def test_greedy_decoding_equals_argmax_of_the_full_forward(arm):
    model = tiny_model(**arm)
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


# ---- the iteration cap and CALM-lite's early exit ----------------------------------------------------------


def step_through(model, ids, **exit):
    """Step every byte of ids [B,T] from an empty cache: (logits [B,T,256], iterations per byte, cache)."""
    cache, logits, iterations = model.new_cache(ids.shape[0]), [], []
    for t in range(ids.shape[1]):
        out, cache = model.step(ids[:, t], cache, **exit)
        logits.append(out)
        iterations.append(cache.iterations)
    return torch.stack(logits, 1), iterations, cache


def test_threshold_one_never_exits_and_equals_full_depth():
    model = tiny_model()
    x = torch.randint(0, 256, (2, 19), generator=rng.generator(0, 0, "test"))
    logits, iterations, _ = step_through(model, x, max_iter=2, exit_threshold=1.0)
    with torch.no_grad():
        full = model(x).logits
    assert iterations == [2] * 19
    assert torch.allclose(logits, full, atol=1e-5, rtol=0), (logits - full).abs().max()
    out = generate(model, b"The dormouse", max_bytes=12, temperature=0, max_iter=2, exit_threshold=1.0)
    assert out.histogram() == {2: 12}
    assert out.bytes == generate(model, b"The dormouse", max_bytes=12, temperature=0).bytes


@torch.no_grad()
def first_iteration_by_hand(model, ids):
    """The first loop iteration alone, through the model's modules: embedding, the engram memory at its
    layer, each block layer, final norm, tied head. Returns (logits, the hidden state the head read)."""
    x = model.embed(ids)
    for j, layer in enumerate(model.layers):
        if str(j) in model.engram:
            memory = model.engram[str(j)]
            x = x + memory(x, memory.keys(ids), None)[0]
        branches = layer(x)[0]
        x = (x + branches.a) + branches.f
    return torch.nn.functional.linear(model.final_norm(x), model.embed.weight), x


def test_gen_max_iter_one_is_the_first_iteration_and_advances_the_skipped_states():
    model = tiny_model()
    x = torch.randint(0, 256, (2, 19), generator=rng.generator(0, 1, "test"))
    logits, iterations, cache = step_through(model, x, max_iter=1)
    by_hand, h = first_iteration_by_hand(model, x)
    assert iterations == [1] * 19
    assert torch.allclose(logits, by_hand, atol=1e-5, rtol=0), (logits - by_hand).abs().max()
    # State propagation: iteration 2 of each layer took in every byte with the exited state h as input.
    with torch.no_grad():
        for j, layer in enumerate(model.layers):
            _, want = layer.mixer(layer.mixer_norm(h), None, return_cache=True)
            got = cache.mixers[len(model.layers) + j]
            assert torch.allclose(got.state, want.state, atol=1e-5, rtol=0)
            assert all(torch.allclose(a, b, atol=1e-6, rtol=0) for a, b in zip(got.conv, want.conv, strict=True))
    out = generate(model, b"The dormouse", max_bytes=10, temperature=0, max_iter=1)
    assert out.histogram() == {1: 10}
    seq = list(b"The dormouse")
    for _ in range(10):
        seq.append(int(first_iteration_by_hand(model, torch.tensor([seq]))[0][0, -1].argmax()))
    assert out.bytes == bytes(seq[len(b"The dormouse") :])


def test_every_iteration_takes_in_every_byte_when_iterations_are_skipped():
    model = tiny_model(mixer="attention")
    _, _, cache = step_through(model, torch.arange(7)[None], max_iter=1)
    assert [kv.length for kv in cache.mixers] == [7] * 4  # (2 iterations × 2 layers), skipped ones included


def test_early_exit_is_taken_exactly_where_every_row_s_first_iteration_is_confident():
    # The first iteration's states take in the bytes alone, whatever was skipped before: its logits at every
    # position are the by-hand forward's, so the exit rule can be checked position by position.
    model = tiny_model(sharpen=10.0)
    x = torch.randint(0, 256, (2, 24), generator=rng.generator(0, 2, "test"))
    by_hand, _ = first_iteration_by_hand(model, x)
    top1 = torch.softmax(by_hand.double(), dim=-1).amax(-1)  # [2, 24], fp64
    threshold = 0.5
    assert (top1 - threshold).abs().min() > 5e-3  # no position is a rounding away from the other side
    confident = (top1 >= threshold).all(0)
    assert 0 < int(confident.sum()) < 24
    assert bool(((top1 >= threshold).any(0) & ~confident).any())  # a position where one row alone is confident
    logits, iterations, _ = step_through(model, x, exit_threshold=threshold)
    assert iterations == [1 if c else 2 for c in confident.tolist()]
    torch.testing.assert_close(logits[:, confident], by_hand[:, confident], atol=1e-5, rtol=0)


def test_early_exit_is_deterministic_and_a_split_decode_equals_one_go():
    model = tiny_model(sharpen=10.0)  # after one iteration the top-1 probability spreads over ~0.15 … 0.91
    settings = {"temperature": 1.0, "seed": 1, "exit_threshold": 0.6}
    once = generate(model, b"The dormouse", max_bytes=32, **settings)
    assert set(once.histogram()) == {1, 2}  # some bytes exit after one iteration, some do not
    again = generate(model, b"The dormouse", max_bytes=32, **settings)
    assert (again.bytes, again.iterations) == (once.bytes, once.iterations)
    decoder = Decoder(model, b"The dormouse", **settings)
    head, head_iters = decoder.extend(11)
    tail, tail_iters = decoder.extend(21)
    assert (head + tail, head_iters + tail_iters) == (once.bytes, once.iterations)


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"max_iter": 3}, r"gen_max_iter 3 is outside \[1, 2\]"),
        ({"max_iter": 0}, r"gen_max_iter 0 is outside \[1, 2\]"),
        ({"exit_threshold": 0.0}, r"exit_threshold 0.0 is outside \(0, 1\]"),
        ({"exit_threshold": 1.5}, r"exit_threshold 1.5 is outside \(0, 1\]"),
    ],
)
def test_decode_cap_and_threshold_refusals(settings, message):
    with pytest.raises(DormouseError, match=message):
        generate(tiny_model(), b"ab", max_bytes=2, **settings)


def test_cli_generate_reports_bytes_per_second_and_the_iteration_histogram(tmp_path, capsys):
    save_untrained_run(tmp_path, {"d_model": 32, "n_heads": 2, "engram": True, "engram_rows": 512})
    argv = ["generate", str(tmp_path), "--ckpt", "last", "--prompt", "ab", "--max-bytes", "5", "--device", "cpu"]
    assert main([*argv, "--gen-max-iter", "1"]) == 0
    err = capsys.readouterr().err
    assert re.search(r"generated 5 bytes from .* \([\d.]+ bytes/s\)", err)
    assert "loop iterations per byte (iterations:bytes): 1:5; mean 1.00" in err
    assert main([*argv, "--gen-max-iter", "3"]) == 2
    assert "gen_max_iter 3 is outside [1, 2]" in capsys.readouterr().err


def test_cli_eval_scores_each_depth_and_the_full_depth_equals_the_plain_eval(tmp_path, capsys):
    from dormouse.data.prepare import prepare
    from dormouse.data.sampler import heldout_windows
    from dormouse.data.shards import load_corpus

    (tmp_path / "text.txt").write_bytes(b"the dormouse sleeps in the teapot. " * 40)
    prepare([tmp_path / "text.txt"], tmp_path / "corpus", heldout_tail=0.25)
    run = tmp_path / "run"
    run.mkdir()
    cfg = save_untrained_run(run, {"d_model": 32, "n_heads": 2, "engram": True, "engram_rows": 512})
    argv = ["eval", str(run), "--ckpt", "last", "--data", str(tmp_path / "corpus"), "--device", "cpu"]
    assert main(argv) == 0
    plain = re.search(r"bpb=([\d.]+)", capsys.readouterr().out).group(1)
    assert main([*argv, "--depth", "all"]) == 0
    lines = re.findall(r"eval step=0 bpb=([\d.]+) .* depth=(\S+)", capsys.readouterr().out)
    assert [d for _, d in lines] == ["eval1/2", "eval2/2"] and lines[1][0] == plain
    # depth 1 by hand: the model's forward at depth 1 over the same held-out walk, summed in float64
    model = DormouseLM(cfg.model, seed=cfg.train.seed).eval()
    nats, count = 0.0, 0
    with torch.no_grad():
        for x, y in heldout_windows(load_corpus(tmp_path / "corpus"), cfg.train.seq_len, cfg.train.batch_size, None):
            logits = model(x, depth=1).logits
            nats += torch.nn.functional.cross_entropy(logits.reshape(-1, 256), y.reshape(-1), reduction="sum").item()
            count += y.numel()
    assert lines[0][0] == f"{nats / count / math.log(2):.4f}" and lines[0][0] != plain
    for bad in ("0", "3", "two"):
        assert main([*argv, "--depth", bad]) == 2
        assert "a loop depth in 1..2" in capsys.readouterr().err
