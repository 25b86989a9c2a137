"""`dormouse tune` on the CPU: refused in one line without CUDA; with a stand-in card and trainer, it runs
two training steps and an eval of the config and writes the new kernel choices where the card's rule says."""

from types import SimpleNamespace

import pytest
import torch

from dormouse.cli import main
from dormouse.ops.fla import pin as fla_pin
from dormouse.train import trainer

# fla and Triton exist only on the GPU machine: the stand-in card runs the config with torch's kernels.
TORCH_KERNELS = [
    "--kda-backend",
    "chunked",
    "--norm-backend",
    "plain",
    "--conv-backend",
    "plain",
    "--swiglu-backend",
    "plain",
]


def test_tune_without_cuda_exits_2_with_one_line(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["tune", "--preset", "nano"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == "error: dormouse tune times fla's kernels on a CUDA card, and this machine has none\n"


@pytest.fixture
def fake_card(monkeypatch):
    """A CUDA card to torch, and a trainer that records what tune runs instead of running it."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Fake GPU Y8")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 9))
    ran = []

    class Trainer:
        def __init__(self, cfg, corpus, run, corpus_note):
            ran.append(("trainer", cfg.train.batch_size, cfg.train.seq_len, cfg.train.device))

        def train_step(self, step):
            ran.append(("step", step))

        def evaluate(self, window_ce, window_ms):
            ran.append(("eval",))

    monkeypatch.setattr(trainer, "Trainer", Trainer)
    return ran


def test_tune_runs_the_configs_steps_and_eval_and_writes_to_the_cards_cache(fake_card, capsys, monkeypatch, tmp_path):
    cache = tmp_path / "dormouse/kernels/Fake_GPU_Y8"
    source = fla_pin.KernelSource("autotune", cache, cache, None, "note")
    monkeypatch.setattr(fla_pin, "applied_source", lambda: source)
    found = iter([{"k.json": 3}, {"k.json": 1, "j.json": 2}])  # after the steps, after the eval
    monkeypatch.setattr(fla_pin, "store_new_choices", lambda folder: fake_card.append(("store", folder)) or next(found))

    argv = ["tune", "--preset", "nano", "--batch-size", "6", "--seq-len", "64", *TORCH_KERNELS]
    assert main(argv) == 0
    steps = [("step", 0), ("step", 1)]
    assert fake_card == [("trainer", 6, 64, "cuda"), *steps, ("store", cache), ("eval",), ("store", cache)]
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("tune: Fake GPU Y8 (compute capability 8.9), nano at batch 6 x 64 bytes: 2 training")
    assert out[1] == f"tune: 6 new kernel choices (2 kernels) written to {cache}"


def test_tune_into_a_folder_reads_it_and_refuses_the_users_fla_variables(fake_card, capsys, monkeypatch, tmp_path):
    for name in ("FLA_CONFIG_DIR", "FLA_CACHE_MODE"):
        monkeypatch.setenv(name, "")  # recorded, so that the undo removes what tune sets
        monkeypatch.delenv(name)
    user = SimpleNamespace(store=None, note="set by the user")
    monkeypatch.setattr(fla_pin, "applied_source", lambda: user)
    monkeypatch.setattr(fla_pin, "store_new_choices", lambda folder: fake_card.append(("store", folder)) or {})
    pin = tmp_path / "pin"
    assert main(["tune", "--preset", "nano", "--into", str(pin), *TORCH_KERNELS]) == 0
    assert fla_pin.os.environ["FLA_CONFIG_DIR"] == str(pin) and fla_pin.os.environ["FLA_CACHE_MODE"] == "fuzzy"
    assert [what for what in fake_card if what[0] == "store"] == [("store", pin)] * 2
    last = capsys.readouterr().out.splitlines()[-1]
    assert last == f"tune: every kernel choice was already in {pin}: nothing new to write"
    assert main(["tune", "--preset", "nano", "--into", str(pin), *TORCH_KERNELS]) == 2  # FLA_CONFIG_DIR is set now
    assert "unset yours, or drop --into" in capsys.readouterr().err


def test_tune_under_the_users_fla_variables_writes_nothing(fake_card, capsys, monkeypatch):
    user = fla_pin.KernelSource("user", None, None, None, "FLA_CONFIG_DIR=/mine (set by the user)")
    monkeypatch.setattr(fla_pin, "applied_source", lambda: user)
    monkeypatch.setattr(fla_pin, "unpinned_choices", lambda: iter([("k", (1,), None, None)]))
    assert main(["tune", "--preset", "nano", *TORCH_KERNELS]) == 0
    assert [what[0] for what in fake_card] == ["trainer", "step", "step", "eval"]
    last = capsys.readouterr().out.splitlines()[-1]
    assert (
        last
        == "tune: nothing written (FLA_CONFIG_DIR=/mine (set by the user)); 1 kernel choices were not in those files"
    )
