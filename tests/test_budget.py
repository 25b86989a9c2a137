"""`--steps auto` (train/budget.py): the rule by hand, the spellings, and a run that trains what it chose."""

import json

import pytest

from dormouse import config
from dormouse.cli import main
from dormouse.errors import ConfigError
from dormouse.train import budget

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = ["--preset", "nano", "--d-model", "32", "--n-heads", "2", "--ffn-hidden", "64", "--kda-chunk-size", "16"]
TINY += ["--seq-len", "32", "--batch-size", "4", "--warmup-steps", "1", "--eval-bytes", "64", "--device", "cpu"]


def test_the_rule_by_hand():
    # tiny shakespeare's 1,003,854 training bytes and `small` (14,336,800 parameters), 16 KiB a step:
    # data-limited, 40.8 · 1,003,854 / 16,384 = 2499.8 -> the recipe's 2500 steps
    assert budget.auto_steps(1_003_854, 14_336_800, 16_384) == 2500
    # a 21.7 MB corpus: 40.8 epochs would be 885 MB; 40 bytes per parameter caps it at 573,472,000 bytes
    assert budget.auto_steps(21_700_000, 14_336_800, 16_384) == 35_002  # 573,472,000 / 16,384 = 35001.95
    assert budget.auto_steps(10, 1000, 16_384) == 1  # at least one step


def test_given_steps_are_kept_and_auto_says_how_it_chose():
    cfg = config.build("nano", {"train": {"steps": 7}})
    assert budget.resolved(cfg, 10**6, 10**6) == (cfg, None)
    auto = config.build("nano", {"train": {"steps": "auto", "batch_size": 4, "seq_len": 32}})
    assert auto.train.steps == config.STEPS_AUTO
    chosen, note = budget.resolved(auto, 1000, 10**6)  # 40.8 · 1000 / 128 = 318.75
    assert chosen.train.steps == 319 and chosen.model == auto.model
    assert note.startswith("steps auto: 319 (40.8 epochs of 1,000 training bytes, at 128 bytes a step")
    chosen, note = budget.resolved(auto, 10**6, 100)  # 40 · 100 / 128 = 31.25
    assert chosen.train.steps == 31 and "40 bytes per parameter × 100 parameters" in note


def test_bad_steps_are_refused(capsys):
    for value in ("1.5", "many"):
        with pytest.raises(SystemExit):
            main(["train", "--steps", value])
        assert f"argument --steps: expected an integer or auto, got '{value}'" in capsys.readouterr().err
    assert main(["train", "--steps", "-1", "--out", "/nonexistent/run"]) == 2
    assert "steps -1 is out of range; allowed [0, inf]" in capsys.readouterr().err


def test_a_run_with_steps_auto_trains_the_steps_it_chose(random_corpus, tmp_path, monkeypatch, capsys):
    corpus = random_corpus(3000, repeats=1)  # 2700 training bytes: 0.5 epochs of 128-byte steps = 10.55 -> 11
    monkeypatch.setattr(budget, "EPOCHS", 0.5)
    run = tmp_path / "run"
    assert main(["train", *TINY, "--steps", "auto", "--eval-every", "5", "--data", str(corpus), "--out", str(run)]) == 0
    assert json.loads((run / "config.json").read_text())["train"]["steps"] == 11
    assert [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()][-1] == 11
    assert "steps auto: 11 (0.5 epochs of 2,700 training bytes" in (run / "train.log").read_text()
    assert main(["train", "--resume", str(run), "--steps", "auto"]) == 2
    assert "--steps auto on --resume" in capsys.readouterr().err


def test_a_toml_config_may_say_auto(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[schedule]\nsteps = "auto"\n')
    overrides = config.toml_overrides(config.load_toml(path), str(path))
    assert config.build("nano", overrides).train.steps == config.STEPS_AUTO
    with pytest.raises(ConfigError, match="steps: expected int"):
        config.build("nano", {"train": {"steps": "all"}})


def test_ab_gives_both_arms_arm_as_auto_steps(random_corpus, tmp_path, monkeypatch, capsys):
    corpus = random_corpus(3000, repeats=1)
    monkeypatch.setattr(budget, "EPOCHS", 0.25)  # 0.25 · 2700 / 128 = 5.27 -> 5
    out, history = tmp_path / "ab", tmp_path / "history.tsv"
    argv = ["ab", "--a", "", "--b", "--lr 0.01", "--seeds", "1", "--steps", "auto", *TINY, "--eval-every", "5"]
    assert main([*argv, "--data", str(corpus), "--out", str(out), "--history", str(history)]) == 0
    result = json.loads((out / "ab.json").read_text())
    assert result["steps"] == 5 and [r["steps"] for arm in "ab" for r in result["runs"][arm]] == [5, 5]
    assert "arm A: steps auto: 5 (0.25 epochs of 2,700 training bytes" in capsys.readouterr().out
