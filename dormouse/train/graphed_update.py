"""`--cuda-graph`'s second graph: the update after the replayed step, its clip and matrix step captured.

Why: after the forward and backward replay as one graph (train/graphed.py), the update is what the host
still launches one kernel at a time: the clip's norms and NesterovSinkhorn's batched SR-Sinkhorn, about
300 small kernels (6.3 ms of GPU time per `small` step, launch-bound: docs/performance.md). Captured,
they launch as one.

The update of a graphed step, in order:
0. the step's skip flag (the trainer's: a non-finite loss term) copied into a static tensor that every
   optimizer reads as `found_inf` (torch's GradScaler convention): a skipped update leaves every weight
   and optimizer state bit-identical, decided on the device, so the trainer queues the update before its
   check reads the loss and the GPU does not wait for the host between the two;
1. eager: each engram table's sparse gradient coalesced (a graphed step hands it over coalesced:
   train/graphed.py's RowPlan) and its norm taken (its size changes per step,
   which a graph cannot hold), copied into a static tensor; NesterovSinkhorn's lr and weight-decay
   factor copied into its device tensors (`load_lr_`);
2. captured: the total norm of the dense gradients' norms and the tables' (torch's `get_total_norm`
   arithmetic: one `_foreach_norm`, then the norm of the stacked norms), the dense gradients clipped
   (`clip_grads_with_norm_`), NesterovSinkhorn's step;
3. eager: the tables' gradients scaled by the same clip coefficient, AdamW's fused step and
   SparseRowAdam's row step (their learning rates are floats).
The first update runs the captured part eagerly (it creates the momentum buffers a capture must find),
the second captures it, every later one replays it. Each computes what `clip_grad_norm_` and
`Optimizers.step` compute, in the same bits (tests/test_graphed_update.py checks it on the CPU, without
the capture; tests/gpu/test_graphed_step.py the whole run on the GPU).
"""

import torch
from torch import nn

from dormouse.train.optim import NesterovSinkhorn
from dormouse.train.routing import Optimizers
from dormouse.train.sparse import clip_sparse_grads_, split_grads_


class GraphedUpdate:
    """Clip and optimizer step of one training step; `__call__(max_norm)` returns the total gradient norm
    before clipping (a device tensor, refilled by the next call). `capture=False` runs every update
    eagerly, as the first one runs: the CPU, where the arithmetic is tested."""

    def __init__(self, model: nn.Module, opt: Optimizers, *, capture: bool = True):
        self.model, self.capture = model, capture
        matrices = opt.optimizers.get("matrices")
        if matrices is not None and not (isinstance(matrices, NesterovSinkhorn) and matrices.capturable):
            raise ValueError("a graphed update needs a capturable NesterovSinkhorn (build_optimizers(capturable=True))")
        adamw = opt.optimizers.get("adamw")
        if adamw is not None and not adamw.defaults["fused"]:
            raise ValueError(
                "a graphed update skips steps on the device, which needs fused AdamW (build_optimizers(fused=True))"
            )
        self.matrices = matrices
        self.eager = [o for name, o in opt.optimizers.items() if name != "matrices"]
        self.skip = torch.zeros((), device=next(model.parameters()).device)  # 1: this step's update is skipped
        for o in opt.optimizers.values():
            o.found_inf = self.skip
        self.graph: torch.cuda.CUDAGraph | None = None
        self.sparse_norms: torch.Tensor | None = None  # [tables]: the coalesced table gradients' norms
        self.total: torch.Tensor | None = None
        self.calls = 0

    def __call__(self, max_norm: float, skip: torch.Tensor | None = None) -> torch.Tensor:
        """`skip`: a device bool scalar; True leaves every weight and optimizer state as it was (the norm is
        still taken). None: the update runs."""
        if skip is None:
            self.skip.zero_()
        else:
            self.skip.copy_(skip)
        dense, sparse = split_grads_(self.model.parameters())
        if sparse:
            norms = torch.stack(torch._foreach_norm([p.grad.values() for p in sparse], 2.0))
            if self.sparse_norms is None:
                self.sparse_norms = torch.empty_like(norms)
            self.sparse_norms.copy_(norms)
        if self.matrices is not None:
            self.matrices.load_lr_()
        if self.calls == 0 or not self.capture:
            self.total = self._clip_and_step(dense, max_norm)
        else:
            if self.graph is None:
                self.graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(self.graph):
                    self.total = self._clip_and_step(dense, max_norm)
            self.graph.replay()
        self.calls += 1
        clip_sparse_grads_(sparse, max_norm, self.total)
        for opt in self.eager:
            opt.step()
        return self.total

    def _clip_and_step(self, dense: list[torch.Tensor], max_norm: float) -> torch.Tensor:
        """The captured part: what `clip_grad_norm_` does to the dense gradients, then the matrices' step."""
        norms = list(torch._foreach_norm([p.grad for p in dense], 2.0))
        if self.sparse_norms is not None:
            norms += list(self.sparse_norms.unbind(0))
        total = torch.linalg.vector_norm(torch.stack(norms), 2.0)
        nn.utils.clip_grads_with_norm_(dense, max_norm, total)
        if self.matrices is not None:
            self.matrices.step()
        return total
