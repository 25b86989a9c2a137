"""Learning sanity: the nano model memorises a 2 KB text, through the real optimizers and schedule."""

import math
from pathlib import Path

import torch

from dormouse import config, rng
from dormouse.model.model import DormouseLM
from dormouse.resolve import resolve
from dormouse.train.routing import build_optimizers, route
from dormouse.train.schedule import lr_multiplier
from dormouse.train.sparse import clip_grad_norm_

# About 2 KB of public-domain prose (Alice's Adventures in Wonderland, ch. 7), read as bytes.
TEXT = (Path(__file__).parent / "data" / "tea_party.txt").read_bytes()


def test_nano_overfits_2kb_below_half_a_bit_per_byte():
    assert len(TEXT) == 2001
    data = torch.tensor(list(TEXT))
    T, B, steps = 128, 8, 200
    train = {"seq_len": T, "batch_size": B, "steps": steps, "warmup_steps": 20, "lr": 3e-3, "weight_decay": 0.0}
    train["lr_floor"] = 0.1
    # Chunk 32: the CPU chunked form's cost grows with the chunk (T = 128 is 4 chunks). The engram on and
    # dropout off: memorising is the point.
    model_values = {"kda_chunk_size": 32, "engram": True, "dropout": 0.0}
    cfg = resolve(config.build("nano", {"train": train, "model": model_values}), cuda_available=False)
    model = DormouseLM(cfg.model, seed=0)
    opt = build_optimizers(route(model), cfg.train)
    for step in range(steps):
        offsets = torch.randint(0, len(data) - T - 1, (B,), generator=rng.generator(0, step, "batch"))
        window = torch.stack([data[o : o + T + 1] for o in offsets.tolist()])
        opt.set_lr(lr_multiplier(step, cfg.train))
        out = model(window[:, :-1], window[:, 1:])
        out.loss.backward()
        clip_grad_norm_(model.parameters(), 1.0)  # sparse-aware: the engram table's gradient is sparse
        opt.step()
        opt.zero_grad()
    # Score the whole text in consecutive windows of the training length (each byte after the first once).
    windows = [data[i : i + T + 1] for i in range(0, len(data) - 1, T)]
    with torch.no_grad():
        nats = sum(model(w[None, :-1], w[None, 1:]).ce.item() * (len(w) - 1) for w in windows)
    bpb = nats / (len(data) - 1) / math.log(2)
    assert bpb < 0.5, f"nano did not memorise 2 KB: {bpb:.3f} bits per byte after {steps} steps"
    print(f"memorised to {bpb:.4f} bits per byte")
