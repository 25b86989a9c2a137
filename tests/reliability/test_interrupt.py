"""A second Ctrl-C stops at once and says which steps are lost; exit 130."""

import os
import signal

from dormouse import checkpoint
from dormouse.cli import main
from dormouse.train.trainer import Trainer


def test_a_second_ctrl_c_names_the_steps_lost(run, monkeypatch, capsys):
    step = Trainer.train_step

    def twice_at_step_5(self, i):  # inside train_step(5): steps 4 and 5 are done, 3 is saved
        ce = step(self, i)
        if i == 5:
            os.kill(os.getpid(), signal.SIGINT)  # the first: stop at the next boundary
            os.kill(os.getpid(), signal.SIGINT)  # the second: stop now
        return ce

    monkeypatch.setattr(Trainer, "train_step", twice_at_step_5)
    assert main(["train", "--resume", str(run), "--steps", "12", "--ckpt-every", "3"]) == 130
    note = f"interrupted again: steps 4-5 not saved; last checkpoint step 3; --resume {run} goes on"
    assert note in capsys.readouterr().out
    assert note in (run / "train.log").read_text()
    assert checkpoint.last_step(run) == 3
    monkeypatch.undo()
    assert main(["train", "--resume", str(run), "--steps", "6"]) == 0  # the lock went with the process's exit
