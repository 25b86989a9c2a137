"""kill -9 at random times of a checkpoint save and of `prepare`: nothing half-written is ever loaded.

CI runs TRIALS of each; `pytest -m slow` runs SLOW_TRIALS more (docs/reliability.md lists the results).
"""

import json
import os
import queue
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import ckpt_writer  # tests/: on the path as this package's parent
import pytest

from dormouse import checkpoint, ledger
from dormouse.data.prepare import prepare
from dormouse.data.shards import load_corpus

ROOT = Path(__file__).resolve().parents[2]
WRITER = ROOT / "tests" / "ckpt_writer.py"
TRIALS, SLOW_TRIALS = 20, 200
ENV = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")


class Writers:
    """tests/ckpt_writer.py's fork server: each `start` forks a writer saving checkpoints 1, 2, ... of a run."""

    def __init__(self):
        self.proc = subprocess.Popen(
            [sys.executable, str(WRITER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=ENV
        )
        self.lines: queue.Queue[list[str]] = queue.Queue()
        threading.Thread(target=lambda: [self.lines.put(ln.split()) for ln in self.proc.stdout], daemon=True).start()

    def _send(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def _next(self, pid, word) -> list[str]:
        while True:
            fields = self.lines.get(timeout=300)  # a loaded 2-core machine can stall an fsync
            if len(fields) >= 2 and fields[1] == word and (pid is None or int(fields[0]) == pid):
                return fields

    def start(self, run: Path) -> int:
        self._send(f"run {run} - 0")
        pid = int(self._next(None, "started")[0])
        self._next(pid, "saved")  # at least one checkpoint committed
        return pid

    def kill(self, pid: int) -> None:
        os.kill(pid, signal.SIGKILL)
        self._send(f"wait {pid}")
        self._next(pid, "reaped")

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


@pytest.fixture(scope="module")
def writers():
    w = Writers()
    yield w
    w.close()


def save_trials(writers, root: Path, trials: int, seed: int) -> dict:
    """Kill a writer `trials` times after a random delay; each time every checkpoint left loads verified
    and the next save (a resumed run's) succeeds. Returns counts for the report."""
    rand, seen = random.Random(seed), {"trials": 0, "orphans_removed": 0, "tmp_left": 0}
    for trial in range(trials):
        run = root / f"save-{trial}"
        pid = writers.start(run)
        time.sleep(rand.uniform(0.0, 0.15))
        writers.kill(pid)
        ckpt = run / "ckpt"
        seen["tmp_left"] += any(p.name.startswith(".tmp") for p in ckpt.iterdir())
        last = checkpoint.load(run, "last")  # verified, or it raises
        for d in ckpt.iterdir():
            if d.name.startswith("step-") and int(d.name[5:]) <= last.step:
                assert checkpoint.load(run, d.name).step == int(d.name[5:])
        assert checkpoint.load(run, "best").state["best_step"] == checkpoint.load(run, "best").step
        ledger.COUNTS.clear()
        step = last.step + 1
        checkpoint.save(run, step, **ckpt_writer.save_kwargs(step, (last.state["best_bpb"], last.state["best_step"])))
        seen["orphans_removed"] += ledger.COUNTS.get("checkpoint.orphan_removed", 0)
        assert checkpoint.load(run, "last").step == step
        assert not any(p.name.startswith(".tmp") for p in ckpt.iterdir())
        seen["trials"] += 1
    return seen


PREPARE = """
import sys
from pathlib import Path
from dormouse.data.prepare import prepare
prepare([sys.argv[1]], sys.argv[2], heldout_tail=0.1, shard_bytes=1 << 16)
"""


def prepare_trials(root: Path, trials: int, seed: int) -> dict:
    """Kill `prepare` `trials` times after a random delay: `out` is absent or a whole corpus."""
    source = root / "text.txt"
    source.write_bytes(random.Random(0).randbytes(1 << 22))  # 4 MiB: 64 shards, each fsynced
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", PREPARE, str(source), str(root / "whole")], env=ENV, check=True)
    full = time.monotonic() - started
    want = load_corpus(root / "whole").fingerprint
    rand, seen = random.Random(seed), {"trials": 0, "whole": 0, "absent": 0, "temporary_left": 0}
    for trial in range(trials):
        out = root / f"prepared-{trial}"
        proc = subprocess.Popen([sys.executable, "-c", PREPARE, str(source), str(out)], env=ENV)
        time.sleep(rand.uniform(0.2, 1.2) * full)  # start-up, shards, manifest, rename, after
        proc.kill()
        proc.wait()
        if out.exists():
            assert load_corpus(out).fingerprint == want  # verified shard by shard
            seen["whole"] += 1
        else:
            seen["absent"] += 1
            seen["temporary_left"] += bool(list(root.glob(f".{out.name}.tmp-*")))
            subprocess.run([sys.executable, "-c", PREPARE, str(source), str(out)], env=ENV, check=True)
            assert load_corpus(out).fingerprint == want  # a killed prepare never blocks the next
        assert not list(root.glob(f".{out.name}.tmp-*"))  # what the kill left, the next prepare removed
        seen["trials"] += 1
    assert sorted(json.loads((out / "manifest.json").read_text())["totals"].values()) == [
        419431,
        3774873,
    ]  # int(n * 0.9) train bytes
    return seen


def test_prepare_removes_what_a_killed_prepare_left_and_nothing_else(tmp_path):
    source = tmp_path / "text.txt"
    source.write_bytes(b"abcdefgh" * 512)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    host = socket.gethostname()
    left = {
        "killed": tmp_path / f".corpus.tmp-{host}-{int(dead.stdout)}-0a0b0c0d",
        "running": tmp_path / f".corpus.tmp-{host}-{os.getpid()}-0a0b0c0d",
        "another host's": tmp_path / f".corpus.tmp-elsewhere-{int(dead.stdout)}-0a0b0c0d",
    }
    for folder in left.values():
        folder.mkdir()
        (folder / "train-00000.bin").write_bytes(b"half")
    prepare([source], tmp_path / "corpus", heldout_tail=0.1)
    assert [name for name, folder in left.items() if folder.exists()] == ["running", "another host's"]
    assert load_corpus(tmp_path / "corpus").split_size("train") == 3686


def test_kill_a_checkpoint_save_at_random_times(writers, tmp_path, one_thread):
    seen = save_trials(writers, tmp_path, TRIALS, seed=0)
    print(seen)
    assert seen["trials"] == TRIALS


def test_kill_prepare_at_random_times(tmp_path):
    seen = prepare_trials(tmp_path, TRIALS, seed=0)
    print(seen)
    assert seen["trials"] == TRIALS and seen["whole"] + seen["absent"] == TRIALS


@pytest.mark.slow
def test_kill_a_checkpoint_save_many_times(writers, tmp_path, one_thread):
    print(save_trials(writers, tmp_path, SLOW_TRIALS, seed=1))


@pytest.mark.slow
def test_kill_prepare_many_times(tmp_path):
    print(prepare_trials(tmp_path, SLOW_TRIALS, seed=1))
