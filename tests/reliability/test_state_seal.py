"""state.json is verified like every other checkpoint file, and best_bpb agrees with the best's own record."""

import json

import pytest
import torch

from dormouse import checkpoint, checkpoint_files, metrics
from dormouse.cli import main
from dormouse.errors import CheckpointError, DormouseError
from reliability.tiny import one_error_line


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


def edit_lines(path, change):
    """Rewrite metrics.jsonl with `change` applied to its list of records (dicts, or raw text lines)."""
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    change(lines)
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))


def best_eval(lines):
    return next(r for r in lines if r["kind"] == "eval" and r["step"] == 3)


SEALED = "step-00000003/state.json (sealed) says best_bpb"
METRICS_EDITS = {  # the edit, and what the refusal says of metrics.jsonl
    "best eval raised": (lambda lines: best_eval(lines).update(bpb=best_eval(lines)["bpb"] + 0.5), SEALED),
    "best eval removed": (lambda lines: lines.remove(best_eval(lines)), "bpb none at step 3, but"),
    "a lower eval added": (
        lambda lines: lines.insert(0, {**best_eval(lines), "step": 2, "bpb": 0.25}),
        "records lowest eval bpb 0.25 up to step 3",
    ),
    "a line not JSON": (lambda lines: lines.append('{"kind": "eval", "st'), "line 5 is not JSON"),
    "a bpb not a number": (lambda lines: best_eval(lines).update(bpb="1.0"), "line 4: bpb is '1.0'"),
}


@pytest.mark.parametrize("change, says", METRICS_EDITS.values(), ids=METRICS_EDITS.keys())
def test_metrics_jsonl_that_disagrees_with_the_sealed_best_is_refused_naming_it(run, capsys, change, says):
    edit_lines(run / "metrics.jsonl", change)
    edited = (run / "metrics.jsonl").read_bytes()
    for args in (["eval", str(run)], ["generate", str(run), "--prompt", "a"], ["train", "--resume", str(run)]):
        assert main([*args, "--steps", "6"] if args[0] == "train" else args) == 2
        line = one_error_line(capsys.readouterr().err)
        assert line.startswith(f"error: {run / 'metrics.jsonl'}") and line.endswith("restore it from a copy")
        assert says in line
    assert (run / "metrics.jsonl").read_bytes() == edited  # the resume refused before rewriting it


def test_the_sealed_best_and_metrics_jsonl_agree_in_a_trained_run(run, capsys):
    best = checkpoint.load(run, "best")
    (scored,) = [r for r in metrics.records(run) if r["kind"] == "eval"]
    assert (scored["step"], scored["bpb"]) == (best.state["best_step"], best.state["best_bpb"]) == (3, scored["bpb"])
    state = run / "ckpt" / "step-00000003" / checkpoint.STATE
    edit(state, lambda s: s.update(best_bpb=scored["bpb"] - 0.5))  # the other side edited: the seal names it
    assert main(["eval", str(run)]) == 2
    assert one_error_line(capsys.readouterr().err).startswith(f"error: {state} was edited")
