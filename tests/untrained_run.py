"""A run directory holding one checkpoint of an untrained model: what `dormouse generate` loads in the CLI tests."""

from pathlib import Path

from dormouse import checkpoint, config
from dormouse.model.model import DormouseLM


def save_untrained_run(run: Path, model_values: dict) -> config.Config:
    """Write config.json and checkpoint step 0 of a nano model with `model_values` into `run`; returns the config."""
    cfg = config.resolve(config.build("nano", {"model": model_values}), cuda_available=False)
    model = DormouseLM(cfg.model, seed=cfg.train.seed)
    model_state, tensors, stamp = model.checkpoint_parts()
    (run / "config.json").write_text(cfg.to_json())
    state = {"run_id": "t", "best_bpb": None, "best_step": None, "sampler": {}, "stress": {}}
    state["extra"] = {"config": cfg.to_dict(), **stamp}
    checkpoint.save(run, 0, model_state=model_state, tensors=tensors, optimizer_state={}, state=state)
    return cfg
