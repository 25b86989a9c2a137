"""Who this process is in a torchrun job, and the few collectives the trainer and the eval need.

`World()` is one process alone: rank 0 of 1, every collective below returns its input untouched, so a
single-process run takes exactly the path it took before distributed training existed.

`joined(train_cfg)` is the job under `--parallel ddp` or `fsdp`: it reads torchrun's environment (RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), starts the default process group (gloo on the CPU,
NCCL on CUDA, one GPU per local rank) and ends it on exit. Its timeout is the config's `dist_timeout`:
a collective that waits that long for a rank that hangs or died raises in every rank still waiting,
and torchrun then stops the other workers, so a stuck job becomes an error in bounded time.

After the block the process group stays referenced here until the interpreter exits (`_RETIRED`): a
DDP replica that outlives the block holds the group too, and if freeing the replica dropped the group's
last reference, gloo's destructor would join its worker threads with the GIL held while a worker thread
waits for the GIL to free the tensors of the last collective, a deadlock (seen: a rank that finished its
work and never exited, `tests/test_distributed.py::test_a_process_group_torn_down_after_a_collective_exits`).
Dropped from Python at exit, the group is destroyed with the GIL released.
"""

import atexit
import contextlib
import datetime
import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist

from dormouse.errors import ConfigError

TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
_RETIRED: list = []  # process groups of finished blocks, destroyed at exit (see the module's docstring)
atexit.register(_RETIRED.clear)


@dataclass(frozen=True)
class World:
    """This process's place in the job: rank `rank` of `size`, on local GPU `local_rank` under NCCL."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    backend: str = "none"  # gloo, nccl, or none (one process)

    @property
    def is_main(self) -> bool:
        """Rank 0: the one rank that prints and writes logs, metrics and checkpoints."""
        return self.rank == 0

    def device(self, name: str) -> torch.device:
        """This rank's device for the config's `device`: under NCCL, the GPU of its local rank."""
        if self.backend == "nccl":
            return torch.device("cuda", self.local_rank)
        return torch.device(name)

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """The sum over ranks of `tensor` (alone: `tensor` itself). Exact where all ranks but one hold zeros."""
        return tensor if self.size == 1 else self._reduce(tensor, dist.ReduceOp.SUM)

    def mean(self, values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The mean over ranks of each scalar in `values` (alone: `values` itself)."""
        if self.size == 1:
            return values
        stacked = torch.stack([v.detach().float().reshape(()) for v in values.values()])
        return dict(zip(values, self._reduce(stacked, dist.ReduceOp.SUM) / self.size, strict=True))

    def max(self, value: int) -> int:
        """The largest of the ranks' `value`s, on every rank: ranks that stop, stop at the same step."""
        if self.size == 1:
            return value
        return int(self._reduce(torch.tensor([value]), dist.ReduceOp.MAX).item())

    def gather_objects(self, obj) -> list:
        """Every rank's `obj` (picklable, CPU tensors only), in rank order."""
        if self.size == 1:
            return [obj]
        out = [None] * self.size
        dist.all_gather_object(out, obj)
        return out

    def _reduce(self, tensor: torch.Tensor, op) -> torch.Tensor:
        # NCCL reduces CUDA tensors only; gloo takes CPU tensors.
        on_wire = tensor.to(self.device("cpu"), copy=True)
        dist.all_reduce(on_wire, op=op)
        return on_wire.to(tensor.device)


@contextlib.contextmanager
def joined(train_cfg) -> Iterator[World]:
    """The process group of a resolved TrainConfig's `parallel` for the duration of the block."""
    if train_cfg.parallel == "none":
        yield World()
        return
    if train_cfg.parallel not in ("ddp", "fsdp"):
        raise ConfigError(f"parallel {train_cfg.parallel!r} is not built: use ddp, fsdp or none")
    missing = [name for name in TORCHRUN_ENV if name not in os.environ]
    if missing:
        raise ConfigError(
            f"parallel {train_cfg.parallel} needs torchrun's environment ({', '.join(missing)} unset): launch with "
            "`torchrun --nproc-per-node N -m dormouse train ...`"
        )
    local_rank = int(os.environ["LOCAL_RANK"])
    cuda = train_cfg.device == "cuda"
    if cuda:
        torch.cuda.set_device(local_rank)
    backend = "nccl" if cuda else "gloo"
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=train_cfg.dist_timeout))
    group = dist.group.WORLD
    try:
        yield World(dist.get_rank(), dist.get_world_size(), local_rank, backend)
    finally:
        dist.destroy_process_group()
        _RETIRED.append(group)
