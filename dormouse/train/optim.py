"""NesterovSinkhorn: Nesterov momentum, then SR-Sinkhorn normalisation of the update.

SinkGD (Scetbon et al., arXiv 2502.06742) replaces a matrix gradient by its alternating row/column
normalisation; here the normalised quantity is a Nesterov look-ahead of an EMA momentum, in Muon's form
(reference sheet §7.2, a derived variant with no published source). Per 2-D parameter W [out, in]
(m = out rows, n = in columns) with gradient G, momentum β, learning rate η, weight decay λ:

    M ← β M + (1 − β) G                 EMA momentum buffer, fp32 at least
    U = (1 − β) G + β M                 Nesterov look-ahead
    X = sr_sinkhorn(U, iters)           rows → ℓ2 norm √n, then columns → ℓ2 norm √m, `iters` times
    W ← W (1 − η λ) − η X               decoupled weight decay, then the step

The last half-step normalises columns, so every non-zero column of X has norm √m exactly and the
update has entry RMS 1 (exactly, when no column is all zero): the scale of Adam's update in the
signal-dominated regime, independent of the gradient's scale. Nothing here is random.

Orientation is `[out, in]` as `nn.Linear` stores it; the result is not transpose-symmetric.

A step updates all matrices of one shape together: their gradients are stacked into one [N, m, n]
tensor, their momentum buffers are views of one such stack (`_momentum`), the momentum and look-ahead
are one pass over the two (`momentum_lookahead_`), the look-aheads are normalised by one batched
SR-Sinkhorn, and the weight updates are `_foreach` ops; on CUDA in fp32 the Sinkhorn kernels' last pass
writes the weight update itself (`sinkhorn_step_`, through a table of the matrices' addresses). The
arithmetic per matrix is the same; the point is launches and passes over memory (a `small` model has 50
matrices in 7 shapes, and each SR-Sinkhorn in torch's form is 40 small kernels: on CUDA dormouse's
Triton kernels take three an iteration and one more, 16 in all), which bound the update on a GPU.

Under FSDP2 the matrices are DTensors sharded on their rows (dim 0) and the normalisation still needs
whole matrices: the gather approach. The momentum buffer is a DTensor sharded like its parameter (so it
checkpoints like one) and M is updated on the local rows; the stacked look-aheads U of a shape group are
gathered whole in one all-gather, every rank runs the same batched SR-Sinkhorn on the whole stack, and
applies to its shard only its own rows of X (a local slice). Cost per step: each rank receives
(W − 1)/W · 4 bytes per matrix parameter (fp32 U), one all-gather per shape group, and computes the
whole Sinkhorn (W times the work of one process, spread over W ranks). The step equals one process's
given the same gradient. One process and DDP take the plain path, unchanged.

The step is applied as X·η (one multiply of the stack), then W·(1 − ηλ) and W − X·η (`_foreach` ops),
with η and 1 − ηλ each rounded once to the parameters' precision. `capturable=True` reads the two from
device tensors that `load_lr_()` fills from the group's Python floats before each step, so that a step
captured in a CUDA graph (train/graphed_update.py) takes each step's learning rate, in the same bits as
the float path.
"""

from collections import defaultdict

import torch
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from dormouse.ops import momentum, sinkhorn


class NesterovSinkhorn(torch.optim.Optimizer):
    """Nesterov momentum + SR-Sinkhorn normalised update for 2-D weight matrices (see module docstring).

    Refuses any parameter that is not a 2-D matrix: vectors and conv filters belong on AdamW
    (dormouse.train.routing decides). A DTensor sharded on dim 0 over a 1-D mesh (FSDP2) is taken and
    gathered whole for the normalisation (see the module docstring); any other DTensor layout is refused.
    """

    def __init__(
        self,
        params,
        lr: float,
        momentum: float = 0.95,
        weight_decay: float = 0.0,
        iters: int = 5,
        eps: float = 1e-12,
        capturable: bool = False,
    ):
        if lr < 0:
            raise ValueError(f"lr must be >= 0, got {lr}")
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {momentum}")
        if weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
        if iters < 1:
            raise ValueError(f"iters must be >= 1, got {iters}")
        defaults = {"lr": lr, "momentum": momentum, "weight_decay": weight_decay, "iters": iters, "eps": eps}
        super().__init__(params, defaults)
        self.capturable = capturable
        # torch's GradScaler convention (fused AdamW reads it too): a device scalar, 1 skips the step on the
        # device with every weight and buffer left bit-identical; None steps unconditionally.
        self.found_inf: torch.Tensor | None = None
        self._lr_tensors: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # group index -> (η, 1 − ηλ)
        self._address_tables: dict[tuple[int, ...], torch.Tensor] = {}  # a shape group's matrices' addresses

    def load_lr_(self) -> None:
        """Capturable mode: copy each group's lr η and weight-decay factor 1 − ηλ (computed in Python, as
        the float path computes it) into the device tensors a captured step reads. Outside any graph."""
        if not self.capturable:
            raise RuntimeError("load_lr_ is for a capturable NesterovSinkhorn (capturable=True)")
        for i, group in enumerate(self.param_groups):
            if i not in self._lr_tensors:
                device = group["params"][0].device
                self._lr_tensors[i] = (torch.zeros((), device=device), torch.zeros((), device=device))
            lr, decay = self._lr_tensors[i]
            lr.fill_(group["lr"])
            decay.fill_(1 - group["lr"] * group["weight_decay"])

    def _lr_and_decay(self, group: dict) -> tuple[float | torch.Tensor, float | torch.Tensor]:
        if not self.capturable:
            return group["lr"], 1 - group["lr"] * group["weight_decay"]
        i = next(i for i, g in enumerate(self.param_groups) if g is group)
        if i not in self._lr_tensors:
            raise RuntimeError("a capturable NesterovSinkhorn steps after load_lr_(), which fills its lr tensors")
        return self._lr_tensors[i]

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)
        for p in self.param_groups[-1]["params"]:
            if p.ndim != 2:
                raise ValueError(
                    f"NesterovSinkhorn updates 2-D matrices [out, in]; got a parameter of shape {tuple(p.shape)} "
                    "(route it to AdamW: dormouse.train.routing)"
                )
            if isinstance(p, DTensor) and p.device_mesh.ndim == 1 and tuple(p.placements) == (Shard(0),):
                continue
            if type(p.data) is not torch.Tensor:
                raise ValueError(
                    f"NesterovSinkhorn needs whole matrices; the parameter of shape {tuple(p.shape)} is a "
                    f"{type(p.data).__name__} (sharded): its row/column norms would be per shard"
                )

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            same_shape = defaultdict(list)
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError(f"NesterovSinkhorn got a sparse gradient for shape {tuple(p.shape)}")
                same_shape[(p.shape, p.dtype, p.device, isinstance(p, DTensor))].append(p)
            for params in same_shape.values():
                self._update(params, group)
        return loss

    def _update(self, params: list[torch.Tensor], group: dict) -> None:
        """The module docstring's update for matrices of one shape, dtype and device, in one batch."""
        if isinstance(params[0], DTensor):
            return self._update_sharded(params, group)
        beta, wd = group["momentum"], group["weight_decay"]
        lr, decay = self._lr_and_decay(group)
        work = torch.promote_types(params[0].dtype, torch.float32)
        g = torch.stack([p.grad.to(work) for p in params])
        if self.found_inf is not None:  # a skipped step leaves W and M as they were, bit for bit
            run = self.found_inf == 0
            lr, decay = torch.where(run, lr, 0.0), torch.where(run, decay, 1.0)
        u = momentum.momentum_lookahead_(g, self._momentum(params, work), beta, self.found_inf)
        if sinkhorn.steps_in_kernel(u, params[0].dtype):  # X and the step in the weights
            sinkhorn.sinkhorn_step_(u, group["iters"], group["eps"], self._addresses(params), lr, decay)
            return
        x = sinkhorn.sr_sinkhorn(u, group["iters"], group["eps"]).to(params[0].dtype).mul_(lr)
        if wd != 0:
            torch._foreach_mul_(params, decay)
        torch._foreach_sub_(params, list(x.unbind(0)))

    def _addresses(self, params: list[torch.Tensor]) -> torch.Tensor:
        """The int64 addresses of a shape group's matrices on their device, for the SR-Sinkhorn kernels'
        step (ops/sinkhorn/ `sinkhorn_step_`): made once per group (the first, eager, update;
        a captured one finds it), again only if a matrix moved."""
        key = tuple(p.data_ptr() for p in params)
        table = self._address_tables.get(key)
        if table is None:
            if any(not p.is_contiguous() for p in params):
                raise ValueError("NesterovSinkhorn's CUDA step writes contiguous matrices; got a strided one")
            table = self._address_tables[key] = torch.tensor(key, dtype=torch.int64).to(params[0].device)
        return table

    def _momentum(self, params: list[torch.Tensor], work: torch.dtype) -> torch.Tensor:
        """The momentum buffers of one shape group as one [N, m, n] stack (zeros at first), each parameter's
        state["momentum_buffer"] a view of it, so the step updates them in one pass. Made on the first
        step, and again (one copy) where the state holds separate tensors (loaded from a checkpoint) or
        the group changed (a matrix without a gradient this step)."""
        bufs = [self.state[p].get("momentum_buffer") for p in params]
        base = None if bufs[0] is None else bufs[0]._base
        if base is not None and base.shape == (len(params), *params[0].shape) and base.dtype == work:
            at = base.data_ptr()
            step = base.stride(0) * base.element_size()
            if all(b is not None and b._base is base and b.data_ptr() == at + i * step for i, b in enumerate(bufs)):
                return base
        stack = torch.zeros(len(params), *params[0].shape, dtype=work, device=params[0].device)
        for i, (p, buf) in enumerate(zip(params, bufs, strict=True)):
            if buf is not None:
                stack[i].copy_(buf)
            self.state[p]["momentum_buffer"] = stack[i]
        return stack

    def _update_sharded(self, params: list[DTensor], group: dict) -> None:
        """`_update` for matrices sharded on their rows (FSDP2): the momentum buffers are sharded like the
        parameters and updated locally; the look-aheads are gathered whole (one all-gather of the stack),
        normalised by the same batched SR-Sinkhorn on every rank, and each rank applies its own rows."""
        if self.found_inf is not None:
            raise NotImplementedError("a NesterovSinkhorn step skipped on the device (found_inf) takes whole matrices")
        beta, wd = group["momentum"], group["weight_decay"]
        lr, decay = self._lr_and_decay(group)
        work = torch.promote_types(params[0].dtype, torch.float32)
        grads = [p.grad.to_local().to(work) for p in params]
        bufs = []
        for p in params:
            state = self.state[p]
            if "momentum_buffer" not in state:  # a DTensor placed as the parameter: checkpointed like it
                state["momentum_buffer"] = torch.zeros_like(p.grad, dtype=work)
            bufs.append(state["momentum_buffer"].to_local())
        torch._foreach_mul_(bufs, beta)
        torch._foreach_add_(bufs, grads, alpha=1 - beta)
        u = torch.stack(grads).mul_(1 - beta).add_(torch.stack(bufs), alpha=beta)  # [N, rows of this rank, n]
        mesh, (n, m, k) = params[0].device_mesh, (len(params), *params[0].shape)
        whole = DTensor.from_local(u, mesh, [Shard(1)], shape=(n, m, k), stride=(m * k, k, 1)).full_tensor()
        x = sinkhorn.sr_sinkhorn(whole, group["iters"], group["eps"]).to(params[0].dtype)
        mine = distribute_tensor(x, mesh, [Shard(1)], src_data_rank=None).to_local()  # a slice: no communication
        local = [p.to_local() for p in params]
        if wd != 0:
            torch._foreach_mul_(local, decay)
        torch._foreach_sub_(local, list(mine.mul_(lr).unbind(0)))
