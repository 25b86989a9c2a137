"""A run directory with one checkpoint of an untrained model, for the CLI tests of generate and eval."""

from pathlib import Path

from dormouse import checkpoint, config
from dormouse.model.model import DormouseLM
from dormouse.resolve import resolve
from dormouse.train.stress import StressMonitor


def save_untrained_run(run: Path, model_values: dict) -> config.Config:
    """Write config.json and checkpoint step 0 of a nano model with `model_values` into `run`; returns the config.
    The run keeps no weight average (ema_decay 0): step 0's checkpoint holds the model's weights only."""
    cfg = resolve(config.build("nano", {"model": model_values, "train": {"ema_decay": 0.0}}), cuda_available=False)
    model = DormouseLM(cfg.model, seed=cfg.train.seed)
    model_state, tensors, stamp = model.checkpoint_parts()
    (run / "config.json").write_text(cfg.to_json())
    state = {"run_id": "t", "best_bpb": None, "best_step": None, "sampler": {}, "stress": StressMonitor().state_dict()}
    state["extra"] = {"config": cfg.to_dict(), **stamp}
    checkpoint.save(run, 0, model_state=model_state, tensors=tensors, optimizer_state={}, state=state)
    return cfg
