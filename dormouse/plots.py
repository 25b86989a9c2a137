"""Curves as PNG files: a run's RUN/curves.png (train and held-out bits per byte against step and bytes
trained) and an A/B's ab.png (both arms' held-out curves, one line per seed per arm)."""

import json
import math
from pathlib import Path

from dormouse import metrics


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on training machines
    import matplotlib.pyplot as plt

    return plt


def plot_curves(run: str | Path) -> Path:
    plt = _pyplot()
    run = Path(run)
    records = metrics.records(run)
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


def plot_ab(result: dict, out: str | Path) -> Path:
    """ab.png from ab.json's content: colour = arm, line style = seed round."""
    plt = _pyplot()
    styles = ("-", "--", ":", "-.")
    fig, ax = plt.subplots(figsize=(8, 5), constrained_layout=True)
    for colour, arm in (("C0", "a"), ("C1", "b")):
        for i, run in enumerate(result["runs"][arm]):
            steps, bpb = zip(*run["curve"], strict=True)
            label = f"{arm.upper()} seed {run['seed']}"
            ax.plot(steps, bpb, styles[i % len(styles)], color=colour, marker="o", markersize=3, label=label)
    ax.set_xlabel("step")
    ax.set_ylabel("held-out bits per byte (the runs' evals)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    overall = result["overall"]
    ax.set_title(f"B-A {overall['diff_mean']:+.4f} bpb (full held-out walk): {overall['verdict']}", fontsize="medium")
    out = Path(out)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
