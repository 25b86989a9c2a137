"""On CUDA: `dormouse eval` of a bf16 run scores under the run's autocast, so it reprints the training's
last eval exactly (an fp32 eval of a bf16 run reads another number: 3.2447 against the run's 3.2446).
Skipped without CUDA."""

import json

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

from dormouse import evaluation  # noqa: E402
from dormouse.cli import main  # noqa: E402


def test_eval_of_a_bf16_run_equals_its_training_eval_exactly(random_corpus, tmp_path, monkeypatch):
    run = tmp_path / "run"
    data = random_corpus(20000)
    flags = ["--preset", "nano", "--data", str(data), "--steps", "4", "--eval-every", "4", "--dtype", "bf16"]
    assert main(["train", *flags, "--out", str(run)]) == 0
    trained = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "eval"]
    scored = []
    score = evaluation.heldout_score
    monkeypatch.setattr(evaluation, "heldout_score", lambda *a, **k: scored.append(score(*a, **k)) or scored[-1])
    assert main(["eval", str(run), "--ckpt", "last", "--device", "cuda"]) == 0
    assert [held.ce for held in scored] == [trained[-1]["ce"]]
