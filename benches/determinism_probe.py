"""Where two processes of one training config part: a fingerprint of every step's gradients and weights.

Runs `--steps` training steps of the config given by dormouse's own flags and writes one JSON line per
step: the training ce (float.hex), a sha256 prefix of every parameter's gradient before the clip, and of
every parameter after the update. Run it twice, each its own process, and `--compare` the two
files: the first step, stage (grads or weights) and parameters that differ say where the bits part.

    python benches/determinism_probe.py --config configs/tinyshakespeare.toml --data DIR --out a.jsonl
    python benches/determinism_probe.py --compare a.jsonl b.jsonl

`--torch-deterministic` turns on torch.use_deterministic_algorithms(True) first (a diagnostic arm).
"""

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

import torch


def digest(t: torch.Tensor | None) -> str:
    if t is None:
        return "-"
    if t.is_sparse:
        t = t.coalesce().to_dense()
    return hashlib.sha256(t.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes()).hexdigest()[:12]


def probe(args) -> None:
    from dormouse import config
    from dormouse.runs import open_corpus
    from dormouse.train.trainer import Trainer

    if args.torch_deterministic:
        torch.use_deterministic_algorithms(True)
    cfg = config.resolve(config.config_from_args(args))
    corpus, note = open_corpus(args.data)
    with tempfile.TemporaryDirectory(prefix="determinism-probe-") as tmp:
        trainer = Trainer(cfg, corpus, Path(tmp) / "run", corpus_note=note)
        names = [n for n, _ in trainer.model.named_parameters()]
        params = [p for _, p in trainer.model.named_parameters()]
        seen: dict[str, list[str]] = {}

        def grads_now():
            seen["grads"] = [digest(p.grad) for p in params]

        if trainer.graphed_update is not None:  # the graphed update clips in place: read the grads first
            update = trainer.graphed_update

            class Reading:
                def __call__(self, max_norm):
                    grads_now()
                    return update(max_norm)

            trainer.graphed_update = Reading()
        else:  # the eager update clips in place too: read the grads as the clip receives them
            from dormouse.train import trainer as trainer_module

            clip = trainer_module.clip_grad_norm_

            def reading_clip(*a, **kw):
                grads_now()
                return clip(*a, **kw)

            trainer_module.clip_grad_norm_ = reading_clip
        with open(args.out, "w") as f:
            for s in range(cfg.train.steps):
                ce = trainer.train_step(s)
                weights = [digest(p) for p in params]
                row = {"step": s + 1, "ce": float(ce).hex(), "grads": seen.pop("grads"), "weights": weights}
                f.write(json.dumps({**row, "names": names} if s == 0 else row) + "\n")


def compare(a_path: str, b_path: str) -> int:
    a = [json.loads(line) for line in open(a_path)]
    b = [json.loads(line) for line in open(b_path)]
    names = a[0]["names"]
    for ra, rb in zip(a, b, strict=True):
        for stage in ("grads", "weights"):
            parted = [n for n, x, y in zip(names, ra[stage], rb[stage], strict=True) if x != y]
            if parted:
                print(f"PARTED at step {ra['step']} {stage}: {len(parted)} of {len(names)} tensors, e.g. {parted[:6]}")
                print(f"  ce {ra['ce']} vs {rb['ce']}")
                return 1
    print(f"IDENTICAL over {len(a)} steps (ce, every gradient, every weight)")
    return 0


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--compare":
        return compare(sys.argv[2], sys.argv[3])
    from dormouse import config

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=None, help="a prepared corpus (default: the embedded default corpus)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--torch-deterministic", action="store_true")
    config.add_config_flags(parser)
    args = parser.parse_args()
    probe(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
