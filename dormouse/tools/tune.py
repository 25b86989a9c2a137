"""`dormouse tune`: choose every fla kernel configuration of a config on this card ahead of the first run.

A card without a committed pin times each fla kernel on first use (minutes, fla_pin.kernel_source).
Tune runs two training steps and one eval of the config, as `dormouse train` would, in a temporary run
directory, and adds the choices the files fla read did not make to the card's user cache (or to
`--into DIR`, a folder that becomes a card's pin when committed under dormouse/ops/fla/configs/).
"""

import os
import tempfile
import time
from pathlib import Path

import dormouse
from dormouse.errors import ConfigError, DormouseError

STEPS = 2  # the second step is the first replayed one under --cuda-graph: no fla kernel is new after it


def cli(args) -> int:
    import torch

    if not torch.cuda.is_available():
        raise DormouseError("dormouse tune times fla's kernels on a CUDA card, and this machine has none")
    if args.into is not None:
        if "FLA_CONFIG_DIR" in os.environ or "FLA_CACHE_MODE" in os.environ:
            raise ConfigError("--into sets FLA_CONFIG_DIR and FLA_CACHE_MODE: unset yours, or drop --into")
        # Read before fla's import: the folder's choices stand, new shapes of a kernel take their entry (fuzzy).
        os.environ["FLA_CONFIG_DIR"], os.environ["FLA_CACHE_MODE"] = str(Path(args.into).resolve()), "fuzzy"
    from dormouse.config_flags import config_from_args
    from dormouse.ops.fla import pin as fla_pin
    from dormouse.runs import open_corpus
    from dormouse.train.trainer import Trainer

    cfg = config_from_args(args)
    t = cfg.train
    if t.device != "cuda":
        raise ConfigError(f"dormouse tune runs on the CUDA card it tunes, not --device {t.device}")
    corpus, note = open_corpus(args.data)
    with tempfile.TemporaryDirectory(prefix="dormouse-tune-") as tmp:
        trainer = Trainer(cfg, corpus, Path(tmp) / "run", corpus_note=note)
        source = fla_pin.applied_source()  # set by the trainer's header, before fla's import
        folder = Path(args.into) if args.into is not None else source.store
        added: dict[str, int] = {}

        def keep() -> None:  # after each phase: a run stopped in the eval keeps the steps' choices
            if folder is not None:
                for name, n in fla_pin.store_new_choices(folder).items():
                    added[name] = added.get(name, 0) + n

        for step in range(STEPS):
            trainer.train_step(step)
        keep()
        trainer.evaluate([], [])
        keep()
    took = time.monotonic() - dormouse.IMPORTED
    cc = ".".join(map(str, torch.cuda.get_device_capability()))
    shapes = f"{cfg.preset} at batch {t.batch_size} x {t.seq_len} bytes"
    card = f"{torch.cuda.get_device_name()} (compute capability {cc})"
    print(f"tune: {card}, {shapes}: {STEPS} training steps and an eval, {took:.1f} s from the command's start")
    if folder is None:  # the card's committed pin (or the user's FLA_* variables) decides; nothing is kept
        unpinned = len(list(fla_pin.unpinned_choices()))
        print(f"tune: nothing written ({source.note}); {unpinned} kernel choices were not in those files")
    elif added:
        print(f"tune: {sum(added.values())} new kernel choices ({len(added)} kernels) written to {folder}")
    else:
        print(f"tune: every kernel choice was already in {folder}: nothing new to write")
    return 0
