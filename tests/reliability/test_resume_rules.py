"""Resume: what may change is recorded and kept; what may not is refused against the checkpoint's own config."""

import json

import pytest

from dormouse.cli import build_parser, main
from dormouse.config_flags import resume_config
from dormouse.errors import ConfigError
from dormouse.runs import run_config
from reliability.tiny import one_error_line


def metrics(run, kind):
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == kind]


def test_an_extended_budget_and_cadence_are_recorded_and_kept(run, capsys):
    assert main(["train", "--resume", str(run), "--steps", "6", "--eval-every", "2", "--keep-last", "1"]) == 0
    saved = json.loads((run / "config.json").read_text())["train"]
    assert (saved["steps"], saved["eval_every"], saved["keep_last"]) == (6, 2, 1)
    changed = {"train.steps": [3, 6], "train.eval_every": [3, 2], "train.keep_last": [3, 1]}
    assert metrics(run, "resume") == [{"kind": "resume", "step": 3, "changed": changed}]
    assert [e["step"] for e in metrics(run, "eval")] == [3, 4, 6]  # the new cadence
    assert sorted(p.name for p in (run / "ckpt").iterdir() if p.name.startswith("step-"))[-1] == "step-00000006"
    # A later plain --resume goes on with the extended budget: the run is done at 6.
    plain = resume_config(run_config(run), build_parser().parse_args(["train", "--resume", str(run)]))
    assert plain.train.steps == 6 and plain.train.eval_every == 2
    capsys.readouterr()
    assert main(["train", "--resume", str(run)]) == 0
    said, result = capsys.readouterr().out.strip().splitlines()
    assert said == f"{run} is at step 6 and --steps is 6: nothing left to train"
    assert result.startswith("result: best held-out ") and result.endswith(" bpb at step 6")  # the run's result


def test_resume_with_fewer_steps_than_done_says_so_and_writes_nothing(run, capsys):
    before = {name: (run / name).read_bytes() for name in ("config.json", "metrics.jsonl", "train.log")}
    assert main(["train", "--resume", str(run), "--steps", "2"]) == 0
    said, result = capsys.readouterr().out.strip().splitlines()
    assert said == f"{run} is at step 3 and --steps is 2: nothing left to train"
    assert result.startswith("result: best held-out ") and result.endswith(" bpb at step 3")
    assert {name: (run / name).read_bytes() for name in before} == before


@pytest.mark.parametrize("flag,value", [("--lr", "0.5"), ("--d-model", "64"), ("--seed", "7"), ("--engram", None)])
def test_a_flag_that_may_not_change_on_resume_is_refused_by_name(run, flag, value):
    args = build_parser().parse_args(["train", "--resume", str(run), flag, *([value] if value else [])])
    with pytest.raises(ConfigError, match=rf"^{flag} cannot change on --resume: only --steps, --minutes, "):
        resume_config(run_config(run), args)


@pytest.mark.parametrize(
    "section,key,value", [("model", "d_model", 64), ("model", "depth", 1), ("train", "lr", 0.5), ("train", "seed", 7)]
)
def test_an_edited_config_json_is_refused_by_eval_generate_and_resume(run, capsys, section, key, value):
    path = run / "config.json"
    cfg = json.loads(path.read_text())
    was = cfg[section][key]
    cfg[section][key] = value
    path.write_text(json.dumps(cfg))
    for args in (
        ["eval", str(run)],
        ["generate", str(run), "--prompt", "ab", "--max-bytes", "2"],
        ["train", "--resume", str(run), "--steps", "6"],
    ):
        assert main(args) == 2, args
        line = one_error_line(capsys.readouterr().err)
        assert f"{section}.{key} is {value!r} in " in line and f"was trained with {was!r}" in line, line
    assert metrics(run, "resume") == []
