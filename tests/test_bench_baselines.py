"""`dormouse bench --model gpt|fla-kda` and `--baselines`: the same-size baselines, timed like dormouse."""

import csv
import math
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from dormouse import config
from dormouse.cli import main
from dormouse.errors import ConfigError
from dormouse.resolve import resolve
from dormouse.tools.bench import baseline_models as baselines
from dormouse.tools.bench import device
from dormouse.tools.bench.flops import count_baseline_flops

pytestmark = pytest.mark.usefixtures("one_thread")
TINY = ["--d-model", "32", "--n-heads", "2", "--ffn-hidden", "64", "--kda-chunk-size", "16", "--no-engram"]
TINY += ["--seq-len", "32", "--batch-size", "4", "--device", "cpu"]


def read_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f, delimiter="\t"))


def tiny(**model) -> config.Config:
    sizes = {"d_model": 32, "n_heads": 2, "ffn_hidden": 64, "block_layers": 1, "depth": 2, "engram": False, **model}
    cfg = config.build("nano", {"model": sizes, "train": {"seq_len": 32, "batch_size": 4, "device": "cpu"}})
    return resolve(cfg, cuda_available=False)


def test_gpt_parameter_count_by_hand():
    # head_dim 8 (inner 16 ≠ d_model) and ffn_hidden 0, resolved by config.resolve to 64·⌈8·32/3/64⌉ = 128
    cfg = tiny(head_dim=8, ffn_hidden=0, block_layers=1, depth=3)
    model = baselines.GPT(cfg.model)
    assert len(model.blocks) == 3 and model.blocks[0].ffn.w_up.weight.shape == (128, 32)
    # per layer: q, k, v 32×16 each, o 16×32, SwiGLU 3·32·128, two RMSNorm gains of 32
    layer = 3 * 32 * 16 + 16 * 32 + 3 * 32 * 128 + 2 * 32
    assert layer == 14400
    # the byte embedding (also the head: tied, counted once), 3 layers, the final norm's gain
    assert sum(p.numel() for p in model.parameters()) == 256 * 32 + 3 * layer + 32 == 51424


def test_gpt_loss_at_init_is_ln_256():
    """Weights are N(0, 0.02²) and the head reads an RMS-normalised state, so a logit is ≈ N(0, 0.02²·32), std
    0.11: on uniform random bytes the expected cross-entropy is ln 256 + σ²/2 ≈ ln 256 + 0.006, and the mean
    over 128 targets scatters by ≈ σ/√128 ≈ 0.01. 0.05 holds both with room; logits of std 1 (no final
    norm, a head not scaled) would miss by ~0.5."""
    _, step = baselines.baseline_step("gpt", tiny(), "cpu")
    ce = step(0)  # the loss before the step's update
    assert abs(ce - math.log(256)) < 0.05, ce
    assert step(1) != ce  # a different batch (the `bench` stream of step 1) and updated weights


def test_gpt_matmul_flops_equal_torchs_flop_counter():
    cfg = tiny(head_dim=8)
    model = baselines.GPT(cfg.model)
    x, y = baselines.random_batch(0, 0, 4, 32)
    with FlopCounterMode(display=False) as counter:
        torch.nn.functional.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1)).backward()
    counts = {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}
    flops = count_baseline_flops(model, cfg, "gpt")
    assert flops.dense == counts["aten.mm"] + counts.get("aten.addmm", 0)
    # H·head_dim·2·(T+1) per position, × 3 (fwd + bwd) × B·T × 2 layers
    assert flops.mixer == 3 * 4 * 32 * 2 * (2 * 8 * 2 * 33)


def test_bench_model_gpt_appends_one_gpt_sdpa_row(tmp_path, monkeypatch):
    monkeypatch.setattr(device, "CPU_PEAK_N", 256)
    history, logs = tmp_path / "history.tsv", tmp_path / "logs"
    argv = ["bench", "--model", "gpt", *TINY, "--steps", "2", "--warmup", "1"]
    assert main([*argv, "--history", str(history), "--log-dir", str(logs)]) == 0
    (row,) = read_rows(history)
    assert (row["model"], row["preset"], row["batch"], row["seq_len"]) == ("gpt-sdpa", "nano", "4", "32")
    assert row["arms"] == "gpt-sdpa,L=4,d=32,H=2,K=16,ffn=64" and row["kernels"] == "-"
    assert (row["steps"], row["warmup"], row["compiled"]) == ("2", "1", "no")
    # embedding 256·32, 4 layers of 4·32·32 attention + 3·32·64 SwiGLU + 2·32 gains, the final gain
    assert row["params"] == str(256 * 32 + 4 * (4 * 32 * 32 + 3 * 32 * 64 + 2 * 32) + 32)
    assert float(row["tokens_per_s"]) == pytest.approx(4 * 32 / (float(row["ms_per_step"]) / 1000), rel=1e-3)
    assert float(row["mfu"]) > 0 and math.isfinite(float(row["flops_per_step"]))
    log = Path(row["log"])
    assert log.name.endswith("-nano-gpt-sdpa-cpu.log") and log.read_text().count(" timed ms=") == 2


def test_baselines_add_a_gpt_row_and_skip_fla_kda_on_the_cpu(random_corpus, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(device, "CPU_PEAK_N", 256)
    history, logs = tmp_path / "history.tsv", tmp_path / "logs"
    argv = ["bench", "--baselines", "--data", str(random_corpus(4000)), *TINY, "--steps", "1", "--warmup", "1"]
    assert main([*argv, "--history", str(history), "--log-dir", str(logs)]) == 0
    rows = read_rows(history)
    assert [r["model"] for r in rows] == ["dormouse", "gpt-sdpa"]
    assert "includes the 1 model(s) benched before it" in rows[1]["mem_source"]
    out = capsys.readouterr().out
    assert "skipping baseline fla-kda: fla-kda runs fla's Triton kernels: it needs CUDA and fla" in out


def test_fla_kda_is_refused_on_the_cpu(tmp_path, capsys):
    with pytest.raises(ConfigError, match="needs CUDA and fla, and the device is cpu"):
        baselines.baseline_step("fla-kda", tiny(), "cpu")
    argv = ["bench", "--model", "fla-kda", *TINY, "--history", str(tmp_path / "h.tsv"), "--log-dir", str(tmp_path)]
    assert main(argv) == 2
    assert "--model fla-kda: fla-kda runs fla's Triton kernels: it needs CUDA and fla" in capsys.readouterr().err
    assert not (tmp_path / "h.tsv").exists()


def test_flags_that_do_not_combine_are_refused(capsys):
    assert main(["bench", "--model", "gpt", "--baselines", "--device", "cpu"]) == 2
    assert "drop --model gpt, or drop --baselines" in capsys.readouterr().err
    assert main(["bench", "--model", "gpt", "--data", "somewhere", "--device", "cpu"]) == 2
    assert "--data feeds dormouse's trainer only" in capsys.readouterr().err
    assert main(["bench", "--op", "kda", "--model", "gpt", "--device", "cpu"]) == 2
    assert "--model and --baselines do not apply" in capsys.readouterr().err
