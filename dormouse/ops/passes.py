"""The kernel-scheduling pass over a built model: what the network's math (dormouse/model/) leaves to the
kernels, applied once where a model is built to run (`schedule`: the trainer, `runs.load_model`, the
benches). Neither part changes a value on the CPU; on CUDA they save kernels (docs/performance.md).

- Norm output hints. A norm whose output feeds one matmul and nothing else may be written in autocast's
  dtype by its fused kernel (ops/norm/'s `for_matmul`). Those norms are the block layers' pre-norms of a
  KDA mixer (its packed projections) and of a dense SwiGLU (its packed pair), flagged for every call
  (`RMSNorm.feeds_one_matmul`), and the final norm's add-and-norm, which feeds the head
  (`RMSNorm.sum_feeds_one_matmul`; its plain call also feeds JEPA's teacher, which reads fp32). Not
  attention's three Linears, whose three gradients autocast sums in fp32, nor the experts, which
  accumulate in their input's dtype.
- Shared casts. The looped block (`DormouseLM.trunk`, which forward, step and new_cache run) runs
  inside `projections.shared_casts()`: each layer's bf16 weights are cast once for all its `depth`
  applications, bit for bit the unshared arithmetic.
"""

from types import MethodType

from dormouse.model.ffn import SwiGLU
from dormouse.model.kda_layer import KDALayer
from dormouse.model.model import DormouseLM
from dormouse.ops.projections import shared_casts


def schedule(model: DormouseLM) -> DormouseLM:
    """`model` with the norm hints set and its trunk run inside `shared_casts` (module docstring); applying
    it again changes nothing."""
    for layer in model.layers:
        layer.mixer_norm.feeds_one_matmul = isinstance(layer.mixer, KDALayer)
        layer.ffn_norm.feeds_one_matmul = isinstance(layer.ffn, SwiGLU)
    model.final_norm.sum_feeds_one_matmul = True
    # bound to the model, so a copy of it (copy.deepcopy) runs its own weights
    model.trunk = MethodType(_trunk_sharing_casts, model)
    return model


def _trunk_sharing_casts(model: DormouseLM, *args, **kwargs):
    with shared_casts():
        return type(model).trunk(model, *args, **kwargs)
