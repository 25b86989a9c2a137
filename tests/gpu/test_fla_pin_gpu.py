"""On CUDA with fla: every fla kernel reads the committed pin, and the recipe
(configs/tinyshakespeare.toml, 3 steps in bf16)
trains and evaluates with no kernel chosen by timing. Choices timed per process give one config
different numbers from run to run (five layer-norm kernels alone): this is what must not happen.
Skipped without CUDA or fla."""

from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)
# fla through dormouse, never directly (see test_graphed_step.py).
from dormouse.ops.fla import kernels as fla_kernels  # noqa: E402
from dormouse.ops.fla import pin as fla_pin  # noqa: E402

if fla_kernels.chunk_kda()[0] is None:
    pytest.skip(f"needs fla-core (extra `gpu`): {fla_kernels.chunk_kda()[1]}", allow_module_level=True)

from dormouse import config  # noqa: E402
from dormouse.data.shards import load_corpus  # noqa: E402
from dormouse.resolve import resolve
from dormouse.train.trainer import Trainer  # noqa: E402


def test_every_fla_autotuner_reads_the_pin():
    from fla.ops.utils.cache import CachedAutotuner

    fla_kernels.rms_norm()  # the layer norms' module, whose autotuners are Triton's own in fla 0.6.0
    plain = [kernel for kernel, tuner in fla_pin._autotuners() if not isinstance(tuner, CachedAutotuner)]
    assert plain == []


def test_the_recipes_shape_chooses_no_kernel_by_timing(random_corpus, tmp_path):
    fla_pin.count_unpinned()  # choices of earlier tests in this process are theirs
    values = config.load_toml(Path(__file__).parents[2] / "configs/tinyshakespeare.toml")
    overrides = config.toml_overrides(values, "recipe")
    overrides["train"].update(steps=3, eval_every=3, dtype="bf16")
    cfg = config.build(values["preset"], overrides)
    corpus = load_corpus(random_corpus(40000, repeats=2))
    Trainer(resolve(cfg), corpus, tmp_path / "run", corpus_note="test corpus").run_loop()
    assert fla_pin.count_unpinned() == 0
