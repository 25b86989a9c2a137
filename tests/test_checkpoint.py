"""Checkpoints: bit-exact round trip, pointers and pruning, every refusal of a bad set, and kill -9 mid-write."""

import hashlib
import importlib.util
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from dormouse import checkpoint, ledger
from dormouse.errors import CheckpointError
from dormouse.ledger import FallbackRefused

ROOT = Path(__file__).resolve().parents[1]
WRITER = ROOT / "tests" / "ckpt_writer.py"


def bits(t: torch.Tensor) -> bytes:
    return t.detach().contiguous().flatten().view(torch.uint8).numpy().tobytes()


def model_state(step: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(step)
    w = torch.randn(64, 48, generator=gen)
    w[0, 0] = float("nan")  # a NaN must round-trip bit-exactly too
    return {
        "emb.weight": w,
        "head.weight": w,  # tied: the same tensor under two names
        "norm.gain": torch.randn(48, generator=gen).to(torch.bfloat16),
        "pos": torch.arange(17, dtype=torch.int64) * step,
        "view": torch.randn(10, 10, generator=gen).t(),  # not contiguous
    }


def optimizer_state() -> dict:
    """The shape of torch.optim.AdamW's state_dict (built by hand: constructing an optimizer imports dynamo, 2-3 s)."""
    gen = torch.Generator().manual_seed(0)
    group = {"lr": 1e-3, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.01, "amsgrad": False}
    group.update(foreach=None, maximize=False, capturable=False, differentiable=False, fused=None, params=[0, 1])
    return {
        "state": {
            i: {
                "step": torch.tensor(3.0),
                "exp_avg": torch.randn(shape, generator=gen),
                "exp_avg_sq": torch.rand(shape, generator=gen),
            }
            for i, shape in enumerate([(4, 8), (4,)])
        },
        "param_groups": [group],
    }


def state(best_bpb=None, best_step=None, **over) -> dict:
    s = {
        "run_id": "run-a",
        "best_bpb": best_bpb,
        "best_step": best_step,
        "sampler": {"seed": 7, "position": 1234},
        "stress": {"window": [2.5, 2.25], "spikes": 1},
        "extra": {"note": "x", "lr": 0.001},
    }
    s.update(over)
    return s


def save(run: Path, step: int, *, best: float | None = None, prev_best=(None, None), keep_last=3, tensors=True):
    """Save step with the trainer's bookkeeping: `best` is this step's bpb when it is a new best."""
    b = (best, step) if best is not None else prev_best
    return checkpoint.save(
        run,
        step,
        model_state=model_state(step),
        optimizer_state=optimizer_state(),
        tensors={"engram": {"table": torch.full((32, 8), float(step)), "gate": torch.ones(3)}} if tensors else None,
        state=state(*b),
        is_best=best is not None,
        keep_last=keep_last,
    )


def pointer(run: Path, name: str) -> dict:
    return json.loads((run / "ckpt" / name).read_text())


def step_dirs(run: Path) -> list[str]:
    return sorted(p.name for p in (run / "ckpt").iterdir() if p.name.startswith("step-"))


def equal_nested(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and bits(a) == bits(b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(equal_nested(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(map(equal_nested, a, b))
    return a == b


# --- round trip, pointers, pruning ---


def test_round_trip_is_bit_exact(tmp_path):
    path = save(tmp_path, 120, best=2.5)
    assert path == tmp_path / "ckpt" / "step-00000120"
    assert sorted(os.listdir(path)) == ["engram.safetensors", "model.safetensors", "optimizer.pt", "state.json"]
    ck = checkpoint.load(tmp_path, "last")
    assert ck.path == path and ck.step == 120
    want = model_state(120)
    assert ck.model_state.keys() == want.keys()
    for k, t in want.items():
        assert ck.model_state[k].dtype == t.dtype and ck.model_state[k].shape == t.shape, k
        assert bits(ck.model_state[k]) == bits(t), k
    assert equal_nested(ck.optimizer_state, optimizer_state())
    assert ck.optimizer_state["param_groups"][0]["betas"] == (0.9, 0.95)
    assert set(ck.tensors) == {"engram"}
    assert bits(ck.tensors["engram"]["table"]) == bits(torch.full((32, 8), 120.0))
    want_state = {"format": 1, "step": 120, **state(2.5, 120)}
    assert {k: v for k, v in ck.state.items() if k != "files"} == want_state
    assert set(ck.state["files"]) == {"model.safetensors", "optimizer.pt", "engram.safetensors"}
    for name, entry in ck.state["files"].items():
        data = (path / name).read_bytes()
        assert entry == {"sha256": hashlib.sha256(data).hexdigest(), "step": 120, "size": len(data)}
    assert pointer(tmp_path, "last") == {"dir": "step-00000120", "step": 120, "bpb": 2.5}
    assert pointer(tmp_path, "best") == {"dir": "step-00000120", "step": 120, "bpb": 2.5}
    assert checkpoint.best_bpb(tmp_path) == 2.5 and checkpoint.last_step(tmp_path) == 120
    assert checkpoint.load(tmp_path, "best").step == 120
    assert checkpoint.load(tmp_path, "step-120").step == 120
    assert checkpoint.load(tmp_path, path).step == 120


def test_no_extra_tensor_files_and_load_to_a_path(tmp_path):
    save(tmp_path, 3, tensors=False)
    ck = checkpoint.load(tmp_path)
    assert ck.tensors == {} and ck.step == 3
    assert pointer(tmp_path, "last") == {"dir": "step-00000003", "step": 3, "bpb": None}
    assert checkpoint.best_bpb(tmp_path) is None
    assert not (tmp_path / "ckpt" / "best").exists()


def test_optimizer_tensors_travel_in_their_stems_file_and_come_back_apart(tmp_path):
    table = torch.full((32, 8), 5.0)
    moments = {"table.exp_avg": torch.arange(256.0).reshape(32, 8), "table.step": torch.arange(32)}
    path = checkpoint.save(
        tmp_path,
        5,
        model_state=model_state(5),
        optimizer_state=optimizer_state(),
        tensors={"engram": {"table": table}},
        optimizer_tensors={"engram": moments, "side": {"x": torch.ones(2)}},
        state=state(),
    )
    assert sorted(os.listdir(path)) == [
        "engram.safetensors",
        "model.safetensors",
        "optimizer.pt",
        "side.safetensors",
        "state.json",
    ]
    with safe_open(str(path / "engram.safetensors"), framework="pt") as f:  # one stamped file holds both
        assert sorted(f.keys()) == ["optimizer/table.exp_avg", "optimizer/table.step", "table"]
        assert f.metadata() == {"step": "5", "kind": "engram"}
    ck = checkpoint.load(tmp_path)
    assert {stem: sorted(sd) for stem, sd in ck.tensors.items()} == {"engram": ["table"], "side": []}
    assert bits(ck.tensors["engram"]["table"]) == bits(table)
    assert set(ck.optimizer_tensors) == {"engram", "side"}
    for key, t in moments.items():
        assert equal_nested(ck.optimizer_tensors["engram"][key], t), key  # dtype, shape and bits
    assert torch.equal(ck.optimizer_tensors["side"]["x"], torch.ones(2))
    with pytest.raises(CheckpointError, match="the optimizer's prefix"):
        checkpoint.save(
            tmp_path,
            6,
            model_state=model_state(6),
            optimizer_state={},
            tensors={"engram": {"optimizer/x": torch.ones(1)}},
            state=state(),
        )


def test_pointers_and_pruning_keep_the_older_best(tmp_path):
    save(tmp_path, 10, best=2.5)
    for step in (20, 30, 40, 50):
        save(tmp_path, step, prev_best=(2.5, 10), keep_last=2)
    assert step_dirs(tmp_path) == ["step-00000010", "step-00000040", "step-00000050"]
    assert pointer(tmp_path, "last") == {"dir": "step-00000050", "step": 50, "bpb": None}
    assert pointer(tmp_path, "best") == {"dir": "step-00000010", "step": 10, "bpb": 2.5}
    assert checkpoint.load(tmp_path, "best").step == 10
    ck = checkpoint.load(tmp_path, "last")
    assert (ck.state["best_bpb"], ck.state["best_step"]) == (2.5, 10)
    # a new best moves the pointer; the old best is then an ordinary old directory and goes
    save(tmp_path, 60, best=2.4, keep_last=2)
    assert step_dirs(tmp_path) == ["step-00000050", "step-00000060"]
    assert pointer(tmp_path, "best") == {"dir": "step-00000060", "step": 60, "bpb": 2.4}
    with pytest.raises(FallbackRefused, match="step-00000010 does not exist") as e:
        checkpoint.load(tmp_path, "step-10")
    assert e.value.site == "checkpoint.file_missing"


def test_a_step_is_saved_once_and_forward_only(tmp_path):
    save(tmp_path, 10)
    with pytest.raises(CheckpointError, match="not after the last checkpoint"):
        save(tmp_path, 10)
    with pytest.raises(CheckpointError, match="not after the last checkpoint"):
        save(tmp_path, 5)
    with pytest.raises(CheckpointError, match="one run directory holds one run"):
        checkpoint.save(
            tmp_path, 20, model_state=model_state(20), optimizer_state={}, state=state(run_id="run-b"), keep_last=3
        )
    assert step_dirs(tmp_path) == ["step-00000010"]


# --- the best score ---


@pytest.mark.parametrize("bad", [float("inf"), float("nan"), float("-inf")])
def test_non_finite_best_is_refused_and_best_is_untouched(tmp_path, bad):
    save(tmp_path, 10, best=2.5)
    before = (tmp_path / "ckpt" / "best").read_bytes()
    with pytest.raises(CheckpointError, match="non-finite"):
        save(tmp_path, 20, best=bad)
    with pytest.raises(CheckpointError, match="non-finite"):
        save(tmp_path, 20, prev_best=(bad, 10))
    assert (tmp_path / "ckpt" / "best").read_bytes() == before
    assert checkpoint.best_bpb(tmp_path) == 2.5
    assert step_dirs(tmp_path) == ["step-00000010"]
    assert [p.name for p in (tmp_path / "ckpt").iterdir() if p.name.startswith(".tmp")] == []


def test_a_resume_that_forgot_its_best_cannot_overwrite_it(tmp_path):
    """The predecessor kept best_eval_bpb in a local: after a resume the first eval overwrote a better best."""
    save(tmp_path, 10, best=2.5)
    with pytest.raises(CheckpointError, match="forgets, the best 2.5"):
        save(tmp_path, 20)  # state best_bpb=None: the run lost its best
    with pytest.raises(CheckpointError, match="is_best=True would overwrite it"):
        save(tmp_path, 20, best=2.6)  # "new best" only against a forgotten one
    assert pointer(tmp_path, "best")["bpb"] == 2.5
    save(tmp_path, 20, best=2.5)  # a tie may move it
    save(tmp_path, 30, prev_best=(2.4, 25))  # a better eval at a step without a checkpoint is allowed
    assert pointer(tmp_path, "best") == {"dir": "step-00000020", "step": 20, "bpb": 2.5}


def test_inconsistent_best_bookkeeping_is_refused(tmp_path):
    with pytest.raises(CheckpointError, match="is_best=True at step 10"):
        checkpoint.save(
            tmp_path, 10, model_state={}, optimizer_state={}, state=state(2.5, 9), is_best=True, keep_last=1
        )
    with pytest.raises(CheckpointError, match="is_best=False"):
        checkpoint.save(tmp_path, 10, model_state={}, optimizer_state={}, state=state(2.5, 10))
    with pytest.raises(CheckpointError, match="exactly the keys"):
        checkpoint.save(tmp_path, 10, model_state={}, optimizer_state={}, state={"run_id": "r"})
    with pytest.raises(CheckpointError, match="optimizer state must hold only tensors"):
        checkpoint.save(tmp_path, 10, model_state={}, optimizer_state={"f": print}, state=state())
    assert not (tmp_path / "ckpt").exists() or step_dirs(tmp_path) == []


# --- refusals at load ---


def test_a_tampered_byte_is_refused_naming_the_file(tmp_path):
    path = save(tmp_path, 10)
    f = path / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[-5] ^= 0x01  # one bit of one weight
    f.write_bytes(bytes(data))
    with pytest.raises(FallbackRefused, match=r"model\.safetensors has sha256") as e:
        checkpoint.load(tmp_path)
    assert e.value.site == "checkpoint.hash_mismatch"


def test_a_truncated_file_is_refused(tmp_path):
    path = save(tmp_path, 10)
    f = path / "engram.safetensors"
    f.write_bytes(f.read_bytes()[:-4])
    with pytest.raises(FallbackRefused, match=r"engram\.safetensors has \d+ bytes") as e:
        checkpoint.load(tmp_path)
    assert e.value.site == "checkpoint.hash_mismatch"


@pytest.mark.parametrize("name", ["optimizer.pt", "engram.safetensors", "model.safetensors", "state.json"])
def test_a_missing_file_is_a_partial_checkpoint(tmp_path, name):
    path = save(tmp_path, 10)
    (path / name).unlink()
    with pytest.raises(FallbackRefused, match=rf"partial checkpoint .*{name}") as e:
        checkpoint.load(tmp_path)
    assert e.value.site == "checkpoint.file_missing"


def test_an_unlisted_file_is_refused(tmp_path):
    path = save(tmp_path, 10, tensors=False)
    other = save(tmp_path, 20)
    shutil.copy(other / "engram.safetensors", path / "engram.safetensors")
    with pytest.raises(CheckpointError, match=r"step-00000010/engram\.safetensors is not listed"):
        checkpoint.load(tmp_path, "step-10")
    (path / "engram.safetensors").unlink()
    (path / "notes.txt").write_text("hi")
    with pytest.raises(CheckpointError, match=r"notes\.txt is not listed"):
        checkpoint.load(tmp_path, "step-10")


@pytest.mark.parametrize("name", ["engram.safetensors", "optimizer.pt", "model.safetensors"])
def test_a_file_from_another_step_is_refused(tmp_path, name):
    """The predecessor's crash window: a sidecar of step 10 beside the weights of step 20, hashes made right."""
    old = save(tmp_path, 10)
    new = save(tmp_path, 20)
    shutil.copy(old / name, new / name)
    meta = json.loads((new / "state.json").read_text())
    data = (new / name).read_bytes()
    meta["files"][name].update(sha256=hashlib.sha256(data).hexdigest(), size=len(data))
    (new / "state.json").write_text(json.dumps(meta))
    with pytest.raises(FallbackRefused, match=rf"{name} is stamped step '?10'?, state.json says 20") as e:
        checkpoint.load(tmp_path)
    assert e.value.site == "checkpoint.step_mismatch"


def test_a_file_listed_with_another_step_is_refused_by_the_listing(tmp_path):
    """A sidecar of step 10 copied with its state.json entry: the listing refuses it before any file is read."""
    old = save(tmp_path, 10)
    new = save(tmp_path, 20)
    shutil.copy(old / "engram.safetensors", new / "engram.safetensors")
    meta = json.loads((new / "state.json").read_text())
    meta["files"]["engram.safetensors"] = json.loads((old / "state.json").read_text())["files"]["engram.safetensors"]
    (new / "state.json").write_text(json.dumps(meta))
    with pytest.raises(FallbackRefused, match=r"engram\.safetensors is listed with step 10, state.json says 20") as e:
        checkpoint.load(tmp_path)
    assert e.value.site == "checkpoint.step_mismatch"


def test_a_pointer_to_a_missing_directory_is_refused(tmp_path):
    save(tmp_path, 10, best=2.5)
    save(tmp_path, 20, prev_best=(2.5, 10))
    shutil.rmtree(tmp_path / "ckpt" / "step-00000020")
    with pytest.raises(FallbackRefused, match=r"names .*step-00000020, which does not exist") as e:
        checkpoint.load(tmp_path, "last")
    assert e.value.site == "checkpoint.file_missing"
    assert checkpoint.load(tmp_path, "best").step == 10
    with pytest.raises(CheckpointError, match="no `last` checkpoint"):
        checkpoint.load(tmp_path / "elsewhere")


def test_a_pointer_and_a_directory_that_disagree_are_refused(tmp_path):
    save(tmp_path, 10)
    ckpt = tmp_path / "ckpt"
    os.rename(ckpt / "step-00000010", ckpt / "step-00000011")
    (ckpt / "last").write_text(json.dumps({"dir": "step-00000011", "step": 11, "bpb": None}))
    with pytest.raises(FallbackRefused, match="directory name says 11") as e:
        checkpoint.load(tmp_path)
    assert e.value.site == "checkpoint.step_mismatch"
    (ckpt / "best").write_text('{"dir": "step-00000011", "step": 11, "bpb": Infinity}')
    with pytest.raises(CheckpointError, match="non-finite number Infinity"):
        checkpoint.best_bpb(tmp_path)


# --- kill -9 during a write ---

ckpt_writer_spec = importlib.util.spec_from_file_location("ckpt_writer", WRITER)
ckpt_writer = importlib.util.module_from_spec(ckpt_writer_spec)
ckpt_writer_spec.loader.exec_module(ckpt_writer)


class WriterServer:
    """tests/ckpt_writer.py in a subprocess; each `run` forks a writer this test SIGKILLs."""

    def __init__(self):
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        self.proc = subprocess.Popen(
            [sys.executable, str(WRITER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line.strip())

    def send(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def expect(self, pid: int | None, word: str, timeout: float = 60.0) -> list[str]:
        """Lines up to and including the next `<pid> <word> ...`; the fields after the word of that line last."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"writer server: no `{word}` from {pid} within {timeout} s") from None
            fields = line.split()
            if len(fields) < 2:
                continue
            if fields[1] == "saved":
                self.saved[int(fields[0])] = int(fields[2])
            if fields[1] == word and (pid is None or int(fields[0]) == pid):
                return fields

    def start(self, run: Path, point: str = "-", step: int = 0) -> int:
        self.saved: dict[int, int] = {}
        self.send(f"run {run} {point} {step}")
        return int(self.expect(None, "started")[0])

    def kill(self, pid: int) -> None:
        os.kill(pid, signal.SIGKILL)
        self.send(f"wait {pid}")
        # the writer's lines precede `reaped` in the pipe, so self.saved is complete after this
        assert self.expect(pid, "reaped")[2] == str(int(signal.SIGKILL))

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def server():
    s = WriterServer()
    yield s
    s.close()


def check_after_kill(run: Path, last: set[int]) -> int:
    """The run holds only complete checkpoints, and `last` is one of the allowed steps; return it."""
    ck = checkpoint.load(run, "last")
    assert ck.step in last, f"last is step {ck.step}, expected one of {sorted(last)}"
    for d in step_dirs(run):  # nothing half-written exists under a final name
        assert checkpoint.load(run, d).step == int(d.removeprefix("step-"))
    return ck.step


def resume_and_save(run: Path) -> int:
    """What a resumed trainer does: restore from `last`, save the next step; return that step."""
    ck = checkpoint.load(run, "last")
    step = ck.step + 1
    kwargs = ckpt_writer.save_kwargs(step, (ck.state["best_bpb"], ck.state["best_step"]))
    checkpoint.save(run, step, **kwargs)
    assert [p.name for p in (run / "ckpt").iterdir() if p.name.startswith(".tmp")] == []
    assert checkpoint.load(run, "last").step == step
    return step


# (point in the save of step 4, `last` after the kill, `best` after the kill); steps 1 and 4 are bests
KILL_POINTS = [
    ("tmp_created", 3, 1),
    ("model_written", 3, 1),
    ("engram_written", 3, 1),
    ("optimizer_written", 3, 1),
    ("state_written", 3, 1),
    ("renamed", 3, 1),  # step-00000004 is complete but uncommitted: the next save removes it
    ("last_tmp_written", 3, 1),  # likewise
    ("last_written", 4, 1),  # `best` lags one save behind; the next save completes it
    ("best_tmp_written", 4, 1),
    ("best_written", 4, 4),
    ("pruning", 4, 4),  # step-00000001 renamed aside, not yet deleted
]


@pytest.mark.parametrize("point,last,best", KILL_POINTS, ids=[p[0] for p in KILL_POINTS])
def test_kill_at_a_named_point_of_a_save(server, tmp_path, point, last, best):
    pid = server.start(tmp_path, point, 4)
    assert server.expect(pid, "paused")[2:] == [point, "4"]
    server.kill(pid)
    assert check_after_kill(tmp_path, {last}) == last
    assert checkpoint.load(tmp_path, "best").step == best
    if point == "renamed":
        assert "step-00000004" in step_dirs(tmp_path)
    if point == "pruning":
        assert step_dirs(tmp_path) == ["step-00000002", "step-00000003", "step-00000004"]
    ledger.COUNTS.clear()
    step = resume_and_save(tmp_path)
    assert step == last + 1
    assert ledger.COUNTS["checkpoint.orphan_removed"] == (1 if point in ("renamed", "last_tmp_written") else 0)
    ledger.COUNTS.clear()
    assert checkpoint.load(tmp_path, "best").step == 4
    assert pointer(tmp_path, "best") == {"dir": "step-00000004", "step": 4, "bpb": ckpt_writer.bpb(4)}
    # keep_last=2 plus best: after step 4 (best) that is 3, 4; after step 5 it is 4, 5
    assert step_dirs(tmp_path) == (
        ["step-00000003", "step-00000004"] if step == 4 else ["step-00000004", "step-00000005"]
    )


@pytest.mark.parametrize("delay", [0.05, 0.1, 0.2, 0.4])
def test_kill_at_a_random_time(server, tmp_path, delay):
    pid = server.start(tmp_path)
    server.expect(pid, "saved")
    time.sleep(delay)
    server.kill(pid)
    reported = server.saved[pid]
    step = check_after_kill(tmp_path, {reported, reported + 1})
    assert resume_and_save(tmp_path) == step + 1
    ledger.COUNTS.clear()
