"""One writer per run directory: a second is refused naming the holder; a dead holder's lock is reported."""

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

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
