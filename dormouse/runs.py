"""Run directories as the tools see them: their config, their corpus, a model from a checkpoint.

Eval and decode load models through here, without importing the trainer.
"""

import json
from pathlib import Path

import torch

from dormouse import checkpoint
from dormouse.config import Config
from dormouse.data.default_corpus import default_corpus_dir, describe_default_corpus
from dormouse.data.shards import Corpus, load_corpus
from dormouse.errors import ConfigError
from dormouse.model import precision
from dormouse.resolve import resolve
from dormouse.train.ema import EMA_FILE, load_average_


def open_corpus(data: str | Path | None) -> tuple[Corpus, str]:
    """The corpus at `data`, or the embedded default corpus; and a one-line description for headers."""
    if data is None:
        corpus = load_corpus(default_corpus_dir())
        return corpus, describe_default_corpus()
    corpus = load_corpus(data)
    note = (
        f"{corpus.root}: {corpus.split_size('train')} bytes train / {corpus.split_size('heldout')} bytes "
        f"held-out, fingerprint {corpus.fingerprint[:12]}"
    )
    return corpus, note


def run_config(run: str | Path) -> Config:
    path = Path(run) / "config.json"
    if not path.is_file():
        raise ConfigError(f"{run} is not a run directory: {path} is missing")
    return Config.from_dict(json.loads(path.read_text()))


def run_corpus(run: str | Path, data: str | Path | None) -> tuple[Corpus, str]:
    """The corpus a run trained on (from run.json), or `data` when given."""
    if data is not None:
        return open_corpus(data)
    meta = json.loads((Path(run) / "run.json").read_text())
    corpus, note = open_corpus(meta["corpus"])
    if corpus.fingerprint != meta["fingerprint"]:
        raise ConfigError(f"the corpus at {meta['corpus']} changed since run {run} trained on it (fingerprint)")
    return corpus, note


def load_model(run: str | Path, which: str = "best", device: str = "cpu"):
    """(model in eval mode, resolved config, checkpoint) from a verified checkpoint of `run`."""
    from dormouse.model.model import DormouseLM

    cfg = run_config(run)
    # The KDA, norm, conv and SwiGLU backends compute one function (tests/test_kda.py, tests/gpu/): pick this
    # device's.
    m = cfg.model
    cfg.train.device, m.kda_backend, m.norm_backend, m.conv_backend, m.swiglu_backend = device, *["auto"] * 4
    if torch.device(device).type == "cpu":
        cfg.train.dtype = "fp32"  # eval and decode run without autocast; the CPU has no bf16/tf32 path
    cfg = resolve(cfg, cuda_available=torch.cuda.is_available())
    precision.apply(cfg.train.dtype)
    ck = checkpoint.load(run, which)
    model = DormouseLM(cfg.model, seed=cfg.train.seed)
    model.load_checkpoint_parts(ck.model_state, ck.tensors, ck.state["extra"])
    if cfg.train.ema_decay:  # the run scored its average: so do eval and decode
        load_average_(model, ck.tensors.get(EMA_FILE))
    return model.to(device).eval(), cfg, ck
