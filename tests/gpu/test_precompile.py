"""ops/precompile.py on CUDA with Triton: after the dry pass a run's steps and evals compile no Triton
kernel, and the run trains bitwise as one without it (the dry pass leaves no gradient, RNG stream,
buffer or counter behind); skipped without CUDA or fla. The logic with stand-ins: tests/test_precompile.py."""

import gc
import json

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)
from dormouse.ops.fla import kernels as fla_kernels  # noqa: E402  (fla through dormouse: the pin first)

if fla_kernels.chunk_kda()[0] is None:
    pytest.skip(f"needs fla-core (extra `gpu`): {fla_kernels.chunk_kda()[1]}", allow_module_level=True)

from triton import knobs  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

from dormouse import config  # noqa: E402
from dormouse.data.shards import load_corpus  # noqa: E402
from dormouse.resolve import resolve  # noqa: E402
from dormouse.train.trainer import Trainer  # noqa: E402


def recipe_trainer(corpus, run) -> Trainer:
    """The recipe's shapes (`small`, B 16, T 1024, bf16, CUDA graph: its kernels are pinned), 3 steps."""
    train = {"seq_len": 1024, "batch_size": 16, "steps": 3, "eval_every": 3, "dtype": "bf16", "cuda_graph": True}
    train["precompile"] = True
    cfg = resolve(config.build("small", {"train": train, "model": {"dropout": 0.3}}))
    return Trainer(cfg, corpus, run, corpus_note="test corpus")


def losses(run) -> list[tuple[str, int, float]]:
    rows = map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
    return [(r["kind"], r["step"], r.get("ce", r.get("bpb"))) for r in rows if r["kind"] in ("train", "eval")]


def test_after_the_dry_pass_nothing_compiles_and_the_run_is_bitwise_the_same(random_corpus, tmp_path, monkeypatch):
    corpus = load_corpus(random_corpus(200_000, repeats=1))
    for obj in gc.get_objects():  # this process forgets its compiled kernels (Triton's disk cache keeps them)
        if isinstance(obj, JITFunction):
            obj.device_caches.clear()
    during_steps = []  # compiles a launch asked for (not the dry pass's, which are warm-ups)
    hook = lambda *, repr, is_manual_warmup, **_: during_steps.append(repr) if not is_manual_warmup else None  # noqa: E731
    monkeypatch.setattr(knobs.runtime, "jit_cache_hook", hook)
    ahead = recipe_trainer(corpus, tmp_path / "ahead")
    ahead.run_loop()
    log = (tmp_path / "ahead" / "train.log").read_text()
    line = next(line for line in log.splitlines() if line.startswith("precompile: "))
    assert int(line.split()[1]) >= 20, line  # KDA forward and backward, norms, conv, SwiGLU, the eval's
    assert during_steps == []

    monkeypatch.setattr(Trainer, "compile_ahead", lambda self: None)
    plain = recipe_trainer(corpus, tmp_path / "plain")
    plain.run_loop()
    assert losses(tmp_path / "ahead") == losses(tmp_path / "plain")
    assert len(losses(tmp_path / "plain")) == 4
