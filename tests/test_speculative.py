"""Self-speculative decoding: greedy output is plain greedy decoding's, sampled bytes follow the model's
distribution (speculative sampling's rule), and the acceptance counts the drafts the rule accepted."""

import re

import pytest
import torch
from untrained_run import save_untrained_run

from dormouse import config, rng
from dormouse.cli import main
from dormouse.decode.generate import generate
from dormouse.decode.speculative import verify
from dormouse.errors import DormouseError
from dormouse.model.model import DormouseLM
from dormouse.resolve import resolve
from dormouse.tools.history import read_history

PROMPT = b"The dormouse"


def draft_model(mixer="kda", **model):
    values = {"d_model": 32, "n_heads": 2, "ffn_hidden": 64, "kda_chunk_size": 16, "engram_rows": 512}
    values.update({"mixer": mixer, "dspark_weight": 0.5, "dspark_k": 3, **model})
    cfg = resolve(config.build("nano", {"model": values}), cuda_available=False)
    model = DormouseLM(cfg.model, seed=3).eval()
    with torch.no_grad():  # sharpen the untrained model so greedy choices are not near-ties
        model.embed.weight.mul_(40.0)
    return model


@pytest.mark.parametrize(
    "mixer,layers", [("kda", ""), ("attention", ""), ("kda", "1")], ids=["kda", "attention", "hybrid"]
)
def test_greedy_speculative_output_is_plain_greedy_output(mixer, layers):
    model = draft_model(mixer, attention_layers=layers)
    plain = generate(model, PROMPT, max_bytes=20, temperature=0)
    spec = generate(model, PROMPT, max_bytes=20, temperature=0, speculative=True)
    assert (spec.bytes, spec.iterations) == (plain.bytes, plain.iterations)
    a = spec.acceptance
    assert plain.acceptance is None and a.k == 3
    # Every round but a one-byte last one verifies its drafts: 2 per round, or fewer at the end.
    assert 0 <= a.accepted <= a.drafted <= 2 * a.rounds and a.rounds > 0


def test_speculative_refuses_a_per_byte_depth():
    model = draft_model()
    for exit in ({"max_iter": 1}, {"exit_threshold": 0.6}):
        with pytest.raises(DormouseError, match="--gen-max-iter and --exit-threshold"):
            generate(model, PROMPT, max_bytes=4, temperature=0, speculative=True, **exit)


@pytest.mark.parametrize("agree, drafted, accepted, rounds, forwards", [(True, 8, 8, 4, 4), (False, 6, 0, 6, 12)])
def test_one_forward_verifies_a_round_and_a_rejection_costs_one_more(
    monkeypatch, agree, drafted, accepted, rounds, forwards
):
    # An oracle draft head: the right next bytes (plain greedy decoding's), or all wrong. k − 1 = 2 drafts
    # a round. Agreeing: each round is 3 bytes from one forward over them (12 bytes: 4 rounds, 4
    # forwards). Disagreeing: b, then the first draft rejected and corrected: 2 bytes a round, one forward
    # to verify and one from the round's start over the kept bytes (12 bytes: 6 rounds, 12 forwards).
    model = draft_model()
    plain = list(generate(model, PROMPT, max_bytes=12, temperature=0).bytes) + [0] * 4
    at = [0]  # where the next round starts in the output

    def oracle(h, anchor, first, count, choose):
        pos = at[0]
        assert int(first) == plain[pos]  # fed the model's own byte
        right = torch.tensor([plain[pos + 1 : pos + 1 + count]])
        drafts = right if agree else (right + 1) % 256
        at[0] += 1 + count if agree else 2
        return drafts, torch.nn.functional.one_hot(drafts, 256).float()  # the logits of a sure draft

    monkeypatch.setattr(model.draft, "draft", oracle)
    calls = []
    real_forward = model.forward
    monkeypatch.setattr(model, "forward", lambda *a, **kw: calls.append(1) or real_forward(*a, **kw))
    spec = generate(model, PROMPT, max_bytes=12, temperature=0, speculative=True)
    assert list(spec.bytes) == plain[:12]
    a = spec.acceptance
    assert (a.drafted, a.accepted, a.rounds) == (drafted, accepted, rounds)
    assert len(calls) == 2 + forwards  # + the prompt's prefill and the feed of its last byte


def test_the_rule_draws_bytes_from_the_models_distribution():
    p = torch.tensor([0.6, 0.3, 0.1] + [0.0] * 253)
    q = torch.tensor([0.2, 0.2, 0.6] + [0.0] * 253)  # a draft that prefers the wrong byte
    drafts = torch.multinomial(q, 3000, replacement=True, generator=rng.generator(0, 0, "test")).tolist()
    out = [verify(p, q, d, rng.generator(0, i, "decode")) for i, d in enumerate(drafts)]
    freq = [sum(b == v for b, _ in out) / len(out) for v in range(3)]
    assert freq == pytest.approx([0.6, 0.3, 0.1], abs=0.03)
    accepted = sum(a for _, a in out) / len(out)
    assert accepted == pytest.approx(0.2 + 0.2 + 0.1, abs=0.03)  # Σ min(p, q)


def test_sampling_is_a_function_of_the_seed_and_top_k_one_is_greedy():
    model = draft_model()
    greedy = generate(model, PROMPT, max_bytes=16, temperature=0).bytes
    one = generate(model, PROMPT, max_bytes=16, temperature=1.5, top_k=1, seed=4, speculative=True)
    assert one.bytes == greedy and one.acceptance.drafted > 0
    soft = draft_model()
    with torch.no_grad():
        soft.embed.weight.div_(40.0)  # near-uniform: every draw matters
    a = generate(soft, PROMPT, max_bytes=16, temperature=1.0, seed=1, speculative=True)
    b = generate(soft, PROMPT, max_bytes=16, temperature=1.0, seed=1, speculative=True)
    c = generate(soft, PROMPT, max_bytes=16, temperature=1.0, seed=2, speculative=True)
    assert (a.bytes, a.acceptance) == (b.bytes, b.acceptance) and a.bytes != c.bytes


def test_refusals():
    with pytest.raises(DormouseError, match="needs a DSpark draft head"):
        generate(draft_model(dspark_weight=0.0), PROMPT, max_bytes=4, temperature=0, speculative=True)
    with pytest.raises(DormouseError, match="needs dspark_k >= 2"):
        generate(draft_model(dspark_k=1), PROMPT, max_bytes=4, temperature=0, speculative=True)


def test_cli_generate_speculative_reports_the_acceptance(tmp_path, capsys):
    save_untrained_run(
        tmp_path, {"d_model": 32, "n_heads": 2, "engram": True, "engram_rows": 512, "dspark_weight": 0.5}
    )
    argv = ["generate", str(tmp_path), "--ckpt", "last", "--prompt", "ab", "--max-bytes", "6", "--device", "cpu"]
    for temperature in ("0", "0.8"):
        assert main([*argv, "--speculative", "--temperature", temperature]) == 0
        err = capsys.readouterr().err
        assert re.search(r"speculative: k=4, \d+ rounds, accepted \d+ of \d+ drafted bytes \(rate [\d.]+\)", err)


def test_cli_generate_record_appends_a_decode_row_with_the_reported_rate(tmp_path, capsys):
    run, history = tmp_path / "run", tmp_path / "history.tsv"
    run.mkdir()
    save_untrained_run(run, {"d_model": 32, "n_heads": 2, "engram": True, "engram_rows": 512, "dspark_weight": 0.5})
    argv = ["generate", str(run), "--ckpt", "last", "--prompt", "abc", "--max-bytes", "6", "--device", "cpu"]
    assert main([*argv, "--temperature", "0", "--record"]) == 0  # no --history: the run directory's own
    assert main([*argv, "--temperature", "0", "--speculative", "--record", "--history", str(history)]) == 0
    reported = re.findall(r"generated 6 bytes from .* in ([\d.]+) s \(([\d.]+) bytes/s\)", capsys.readouterr().err)
    rows = read_history(run / "history.tsv") + read_history(history)
    assert len(rows) == 2 == len(reported)
    for row, (_, rate), options in zip(
        rows, reported, ("--temperature 0", "--speculative --temperature 0"), strict=True
    ):
        assert (row["model"], row["batch"], row["seq_len"], row["dtype"], row["steps"]) == (
            "dormouse-decode",
            "1",
            "6",
            "fp32",
            "6",
        )
        assert float(row["tokens_per_s"]) == pytest.approx(float(rate), rel=0.01)
        assert float(row["ms_per_step"]) == pytest.approx(1000 / float(rate), rel=0.01)
        assert row["note"].startswith(f"decode {options}; prompt 3 bytes; mean iterations/byte 2.00")
        assert row["heldout_bpb"] == "-" and row["mfu"] == "-"
    assert "dspark=4/16" in rows[0]["arms"].split(",") and rows[1]["arms"] == rows[0]["arms"] + ",speculative"
    assert "speculative: k=4" in rows[1]["note"] and "speculative" not in rows[0]["note"].split(";")[0][7:]


def test_a_decode_rows_cuda_graph_arm_is_the_decodes_not_the_trainings(tmp_path):
    from dormouse.decode.generate import Generation
    from dormouse.tools.decode_row import decode_row

    cfg = save_untrained_run(tmp_path, {"d_model": 32, "n_heads": 2, "engram": True, "engram_rows": 512})
    cfg.train.cuda_graph, cfg.train.graph_update = True, False  # trained graphed, the update eager
    result = Generation(b"abcd", 0.5, [2, 2, 2, 2], None)
    row = {
        g: decode_row(cfg, result, options="", graphed=g, prompt_bytes=1, commit="c", log="l") for g in (False, True)
    }
    assert (
        row[False]["arms"] == row[True]["arms"].removesuffix(",cuda_graph") and "cuda_graph" not in row[False]["arms"]
    )
    assert row[True]["arms"].endswith(",cuda_graph") and cfg.train.cuda_graph and not cfg.train.graph_update
