"""One writer per run directory: a second is refused naming the holder; a dead holder's lock is reported."""

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from dormouse import run_lock
from dormouse.cli import main
from reliability.tiny import one_error_line, tiny_flags

ROOT = Path(__file__).resolve().parents[2]
HOLDER = "import sys, time; from dormouse import run_lock\nwith run_lock.held(sys.argv[1], 'train'):\n"
HOLDER += "    print('held', flush=True); time.sleep(600)\n"


def test_a_finished_run_leaves_no_lock(trained):
    assert not (trained / run_lock.LOCK).exists()
    assert (trained / "config.json").is_file()


def test_a_second_train_on_a_held_run_is_refused_naming_the_holder(run, capsys):
    metrics = (run / "metrics.jsonl").read_bytes()
    with run_lock.held(run, "train"):
        holder = json.loads((run / run_lock.LOCK).read_text())
        assert holder == {"host": socket.gethostname(), "pid": os.getpid(), "command": "train"}
        assert main(["train", "--resume", str(run), "--steps", "6"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"is being written by `dormouse train` (pid {os.getpid()} on host {socket.gethostname()})" in line
    assert (run / "metrics.jsonl").read_bytes() == metrics  # the refused writer wrote nothing
    assert not (run / run_lock.LOCK).exists()


def test_two_trains_into_one_new_directory(corpus, tmp_path, capsys):
    out = tmp_path / "new"
    out.mkdir()
    with run_lock.held(out, "train"):
        assert main(["train", *tiny_flags(corpus.root), "--out", str(out), "--steps", "3"]) == 2
        assert sorted(p.name for p in out.iterdir()) == [run_lock.LOCK]  # no config.json, no metrics
    assert "is being written by `dormouse train`" in one_error_line(capsys.readouterr().err)


def test_a_lock_left_by_a_killed_writer_is_reported_never_taken(run, capsys):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(run)], stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout.readline().strip() == "held"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    lock = run / run_lock.LOCK
    left = lock.read_text()
    assert json.loads(left)["pid"] == proc.pid
    for args in (["train", "--resume", str(run), "--steps", "6"], ["generate", str(run), "--prompt", "a", "--record"]):
        assert main(args) == 2
        line = one_error_line(capsys.readouterr().err)
        assert f"stale lock {lock}: left by `dormouse train` (pid {proc.pid}" in line
        assert "is no longer running" in line and f"rm {lock}" in line
        assert lock.read_text() == left  # reported, not stolen
    lock.unlink()
    assert main(["train", "--resume", str(run), "--steps", "4"]) == 0
    assert not lock.exists()


def contents(folder: Path) -> dict:
    """Every file under `folder` and its bytes: what a refused writer must leave as it found it."""
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def writers(run: Path, corpus_root: Path, tmp: Path) -> dict[str, list[str]]:
    """Every command that writes into `run` other than `train` on it: its argv."""
    history = str(run / "history.tsv")
    tiny = tiny_flags(corpus_root)
    return {
        "generate --record": ["generate", str(run), "--prompt", "a", "--max-bytes", "2", "--record"],
        "generate --out": ["generate", str(run), "--prompt", "a", "--max-bytes", "2", "--out", str(run / "a.txt")],
        "inspect --plot": ["inspect", str(run), "--plot"],
        "bench --history": ["bench", *tiny, "--steps", "1", "--warmup", "1", "--history", history],
        "train --record --history": ["train", *tiny, "--steps", "1", "--out", str(tmp / "new"), "--record"]
        + ["--history", history],
        "ab --record --history": ["ab", "--a", "", "--b", "--lr 0.01", "--seeds", "1", *tiny, "--steps", "1"]
        + ["--out", str(tmp / "ab"), "--record", "--history", history],
    }


@pytest.mark.parametrize(
    "command",
    [
        "generate --record",
        "generate --out",
        "inspect --plot",
        "bench --history",
        "train --record --history",
        "ab --record --history",
    ],
)
def test_every_writer_of_a_held_run_is_refused_naming_the_holder(run, corpus, tmp_path, capsys, command):
    argv = writers(run, corpus.root, tmp_path)[command]
    before = contents(run)
    with run_lock.held(run, "train"):
        assert main(argv) == 2
        assert contents(run).keys() - before.keys() == {Path(run_lock.LOCK)}
    line = one_error_line(capsys.readouterr().err)
    assert line == (
        f"error: {run} is being written by `dormouse train` (pid {os.getpid()} on host {socket.gethostname()}): "
        "one writer per run directory; wait for it to finish or stop it"
    )
    assert contents(run) == before  # nothing written, nothing removed
    assert not (tmp_path / "ab").exists()


def test_a_second_ab_into_a_held_folder_is_refused_naming_the_holder(corpus, tmp_path, capsys):
    out = tmp_path / "ab"
    out.mkdir()
    argv = ["ab", "--a", "", "--b", "--lr 0.01", "--seeds", "1", *tiny_flags(corpus.root), "--steps", "1"]
    with run_lock.held(out, "ab"):
        assert main([*argv, "--out", str(out)]) == 2
        assert [p.name for p in out.iterdir()] == [run_lock.LOCK]
    line = one_error_line(capsys.readouterr().err)
    assert line == (
        f"error: {out} is being written by `dormouse ab` (pid {os.getpid()} on host {socket.gethostname()}): "
        "one writer per run directory; wait for it to finish or stop it"
    )


def test_an_arm_run_is_held_while_ab_trains_it(corpus, tmp_path, monkeypatch, capsys):
    from dormouse.train.trainer import Trainer

    refusals = []
    run_loop = Trainer.run_loop

    def resume_meanwhile(trainer):  # a user's `train --resume` of the arm's run while `ab` trains it
        refusals.append((main(["train", "--resume", str(trainer.run), "--steps", "6"]), capsys.readouterr().err))
        return run_loop(trainer)

    monkeypatch.setattr(Trainer, "run_loop", resume_meanwhile)
    out = tmp_path / "ab"
    argv = ["ab", "--a", "", "--b", "--lr 0.01", "--seeds", "1", *tiny_flags(corpus.root), "--steps", "3"]
    assert main([*argv, "--out", str(out)]) == 0
    assert [code for code, _ in refusals] == [2, 2]  # arm A's run and arm B's
    holder = f"is being written by `dormouse ab` (pid {os.getpid()} on host {socket.gethostname()})"
    assert all(holder in one_error_line(err) for _, err in refusals)
    assert not list(out.rglob(run_lock.LOCK))  # released when each run is done
