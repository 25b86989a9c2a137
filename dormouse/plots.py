"""RUN/curves.png: train and held-out bits per byte against step and against bytes trained."""

import json
import math
from pathlib import Path


def plot_curves(run: str | Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on training machines
    import matplotlib.pyplot as plt

    run = Path(run)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    config = json.loads((run / "config.json").read_text())["train"]
    bytes_per_step = config["batch_size"] * config["seq_len"]
    train = [(r["step"], r["ce"] / math.log(2)) for r in records if r["kind"] == "train"]
    held = [(r["step"], r["bpb"]) for r in records if r["kind"] == "eval"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    for ax, scale, label in ((axes[0], 1, "step"), (axes[1], bytes_per_step, "bytes trained")):
        if train:
            ax.plot([s * scale for s, _ in train], [b for _, b in train], label="train", alpha=0.6)
        if held:
            ax.plot([s * scale for s, _ in held], [b for _, b in held], "o-", label="held-out")
        ax.set_xlabel(label)
        ax.set_ylabel("bits per byte")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(run.name)
    out = run / "curves.png"
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
