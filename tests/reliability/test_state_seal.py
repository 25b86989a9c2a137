"""state.json is verified like every other checkpoint file, and best_bpb agrees with the best's own record."""

import json

import pytest
import torch

from dormouse import checkpoint, checkpoint_files
from dormouse.errors import CheckpointError, DormouseError


def save(run, step, best_bpb, best_step, is_best):
    state = {"run_id": "seal", "best_bpb": best_bpb, "best_step": best_step, "sampler": {"next_step": step}}
    state.update(stress={"window": [1.0, 2.0]}, extra={})
    weights = {"w": torch.full((4, 4), float(step))}
    return checkpoint.save(run, step, model_state=weights, optimizer_state={}, state=state, is_best=is_best)


def edit(path, change):
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data, indent=1))


EDITS = {
    "best_bpb lowered": lambda s: s.update(best_bpb=1.0),
    "run_id changed": lambda s: s.update(run_id="other"),
    "stress window value": lambda s: s["stress"]["window"].__setitem__(0, 9.0),
    "sampler position": lambda s: s["sampler"].update(next_step=0),
}


@pytest.mark.parametrize("change", EDITS.values(), ids=EDITS.keys())
def test_a_hand_edited_state_json_is_refused_naming_it(tmp_path, change):
    save(tmp_path, 1, 3.0, 1, True)
    path = save(tmp_path, 2, 3.0, 1, False)
    edit(path / checkpoint.STATE, change)
    with pytest.raises(DormouseError, match=rf"{path / 'state.json'} was edited"):
        checkpoint.load(tmp_path, "last")
    with pytest.raises(DormouseError, match="was edited"):  # and no later save builds on it
        save(tmp_path, 3, 3.0, 1, False)


def test_a_lowered_best_pointer_is_refused_and_cannot_block_a_new_best(tmp_path):
    save(tmp_path, 1, 3.0, 1, True)
    edit(tmp_path / "ckpt" / "best", lambda p: p.update(bpb=0.5))
    with pytest.raises(CheckpointError, match="the pointer was edited"):
        checkpoint.load(tmp_path, "best")
    with pytest.raises(CheckpointError, match="the pointer was edited"):
        save(tmp_path, 2, 2.0, 2, True)


def test_a_best_bpb_that_is_not_the_best_checkpoints_record_is_refused(tmp_path):
    save(tmp_path, 1, 3.0, 1, True)
    with pytest.raises(CheckpointError, match="a best is the score its own checkpoint recorded"):
        save(tmp_path, 2, 2.0, 1, False)  # claims step 1 scored 2.0; step 1 recorded 3.0
    assert checkpoint.last_step(tmp_path) == 1
    path = save(tmp_path, 2, 3.0, 1, False)
    assert checkpoint.load(tmp_path, "last").state["best_bpb"] == 3.0
    # A checkpoint whose best_bpb disagrees with the best directory's record, the seal made right by hand.
    state = json.loads((path / checkpoint.STATE).read_text())
    state["best_bpb"] = 2.0
    (path / checkpoint.STATE).write_text(json.dumps(state))
    reseal(path, state)
    with pytest.raises(CheckpointError, match=r"best_bpb 2\.0 at step 1, but .*step-00000001/state\.json"):
        checkpoint.load(tmp_path, "last")


def reseal(path, state):
    """Rewrite the model file with the seal of `state` and fix its hash: an edit made consistent on purpose."""
    from safetensors.torch import load_file, save_file

    model = path / checkpoint.MODEL
    tensors = load_file(model)
    seal = checkpoint_files.state_seal(state)
    save_file(tensors, str(model), metadata={"step": str(state["step"]), "kind": "model", "state": seal})
    state["files"][checkpoint.MODEL].update(sha256=checkpoint_files.sha256(model), size=model.stat().st_size)
    (path / checkpoint.STATE).write_text(json.dumps(state))
