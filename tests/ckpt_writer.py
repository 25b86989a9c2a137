"""Checkpoint writer for the kill test in tests/test_checkpoint.py: a small fork server.

Importing torch takes seconds on a 2-core machine, so this process imports it once and forks one
writer per kill. Commands, one per line on stdin:

    run <run_dir> <point|-> <step>   fork a writer that saves checkpoints 1, 2, ... of run_dir until
                                     killed; answers `<pid> started`. The writer prints
                                     `<pid> saved <step>` after each save and, when the save of <step>
                                     reaches the named point (dormouse.checkpoint._at), prints
                                     `<pid> paused <point> <step>` and sleeps there.
    wait <pid>                       reap a writer the test has SIGKILLed; answers `<pid> reaped <signal>`.

On end of input it SIGKILLs and reaps any writer still alive, then exits.
"""

import os
import signal
import sys
import time
import traceback

import torch

from dormouse import checkpoint
from dormouse.errors import DormouseError

KEEP_LAST = 2


def bpb(step: int) -> float:
    return 3.0 - 0.01 * step


def is_best(step: int) -> bool:
    """Every third step, starting at 1, evaluates to a new best (bpb falls with the step)."""
    return step % 3 == 1


def save_kwargs(step: int, prev_best: tuple[float | None, int | None]) -> dict:
    """The arguments a trainer would pass to checkpoint.save at `step` (about 4 MB of files)."""
    best = (bpb(step), step) if is_best(step) else prev_best
    gen = torch.Generator().manual_seed(step)
    w = torch.randn(512, 1024, generator=gen)  # 2 MB
    return dict(
        model_state={"w": w, "b": torch.full((1024,), float(step))},
        optimizer_state={"state": {0: {"m": w * 0.5}}, "param_groups": [{"lr": 0.01, "params": [0]}]},
        tensors={"engram": {"table": torch.full((256, 1024), float(step))}},  # 1 MB
        state={
            "run_id": "kill-test",
            "best_bpb": best[0],
            "best_step": best[1],
            "sampler": {"seed": 0, "step": step},
            "stress": {},
            "extra": {},
        },
        is_best=is_best(step),
        keep_last=KEEP_LAST,
    )


def writer(run_dir: str, point: str, pause_step: int) -> None:
    current = 0

    def hook(name: str) -> None:
        if name == point and current == pause_step:
            print(f"{os.getpid()} paused {name} {current}", flush=True)
            time.sleep(600)

    checkpoint._at = hook
    best = (None, None)
    for step in range(1, 100_000):
        current = step
        kwargs = save_kwargs(step, best)
        checkpoint.save(run_dir, step, **kwargs)
        best = (kwargs["state"]["best_bpb"], kwargs["state"]["best_step"])
        print(f"{os.getpid()} saved {step}", flush=True)


def main() -> None:
    torch.set_num_threads(1)  # fork after torch starts no thread pool
    children: set[int] = set()
    for line in sys.stdin:
        cmd = line.split()
        if cmd[0] == "run":
            sys.stdout.flush()
            pid = os.fork()
            if pid == 0:
                code = 1  # the child never returns into this loop
                try:
                    writer(cmd[1], cmd[2], int(cmd[3]))
                    code = 0
                except (DormouseError, OSError, RuntimeError, ValueError):
                    traceback.print_exc()
                finally:
                    os._exit(code)
            children.add(pid)
            print(f"{pid} started", flush=True)
        elif cmd[0] == "wait":
            pid = int(cmd[1])
            _, status = os.waitpid(pid, 0)
            children.discard(pid)
            print(f"{pid} reaped {os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0}", flush=True)
    for pid in children:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    sys.stdout.flush()
    os._exit(0)  # skip torch's interpreter teardown (about a second)


if __name__ == "__main__":
    main()
