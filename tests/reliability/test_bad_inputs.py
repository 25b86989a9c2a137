"""Every bad input a user can give ends in one `error:` line and exit 2, and loses nothing."""

import errno
import json
import os
import shutil

import pytest

from dormouse import checkpoint
from dormouse.cli import main
from dormouse.data import prepare as prepare_module
from dormouse.data.shards import load_corpus
from dormouse.errors import CheckpointError
from reliability.tiny import one_error_line, tiny_flags


def no_space(path):
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))


def half_then_full(real):
    """A safetensors writer that writes half a file, then finds the disk full."""

    def write(tensors, filename, metadata=None):
        real(tensors, filename, metadata=metadata)
        size = os.path.getsize(filename)
        with open(filename, "r+b") as f:
            f.truncate(size // 2)
        raise no_space(filename)

    return write


def test_disk_full_while_saving_keeps_the_last_checkpoint(run, monkeypatch, capsys):
    monkeypatch.setattr(checkpoint, "save_file", half_then_full(checkpoint.save_file))
    assert main(["train", "--resume", str(run), "--steps", "6"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "checkpoint step 6 not saved (No space left on device: " in line
    assert "the last checkpoint, step 3, is intact" in line and "--keep-last" in line
    assert checkpoint.load(run, "last").step == 3  # loads, verified
    assert not [p for p in (run / "ckpt").iterdir() if p.name.startswith(".tmp")]
    monkeypatch.undo()
    # With space again (and fewer checkpoints kept) the run goes on from step 3.
    assert main(["train", "--resume", str(run), "--steps", "6", "--keep-last", "1"]) == 0
    assert checkpoint.last_step(run) == 6


def test_disk_full_in_a_direct_save_is_a_checkpoint_error(tmp_path, monkeypatch):
    def full(path, text):
        raise no_space(path)

    monkeypatch.setattr(checkpoint, "_write_durable", full)
    state = {"run_id": "r", "best_bpb": None, "best_step": None, "sampler": {}, "stress": {}, "extra": {}}
    with pytest.raises(CheckpointError, match=r"checkpoint step 1 not saved \(No space left on device"):
        checkpoint.save(tmp_path, 1, model_state={}, optimizer_state={}, state=state)
    assert list((tmp_path / "ckpt").iterdir()) == []


@pytest.mark.parametrize("where", ["manifest", "shard"])
def test_disk_full_in_prepare_leaves_nothing_under_out(tmp_path, monkeypatch, capsys, where):
    source = tmp_path / "text.txt"
    source.write_bytes(b"abcdefgh" * 4096)
    if where == "manifest":
        monkeypatch.setattr(prepare_module, "_write_synced", lambda path, data: (_ for _ in ()).throw(no_space(path)))
    else:
        real = prepare_module._ShardWriter.write

        def write(self, data):
            real(self, data[: len(data) // 2])
            raise no_space(self.root)

        monkeypatch.setattr(prepare_module._ShardWriter, "write", write)
    out = tmp_path / "corpus"
    assert main(["prepare", str(source), "--out", str(out), "--heldout-tail", "0.1"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"preparing {out} failed (No space left on device" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["text.txt"]  # no corpus, no temporary folder


def test_out_that_is_a_file_or_under_a_file_or_under_proc(corpus, tmp_path, capsys):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    for out, cause in (
        (a_file, "is an existing file, not a directory"),
        (a_file / "run", "cannot create the run directory (Not a directory)"),
        ("/proc/dormouse-run", "cannot create the run directory"),
    ):
        assert main(["train", *tiny_flags(corpus.root), "--out", str(out), "--steps", "1"]) == 2
        assert cause in one_error_line(capsys.readouterr().err)
    assert a_file.read_text() == "x"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only directory")
def test_out_that_is_not_writable(corpus, tmp_path, capsys):
    parent = tmp_path / "ro"
    parent.mkdir(mode=0o555)
    assert main(["train", *tiny_flags(corpus.root), "--out", str(parent / "run"), "--steps", "1"]) == 2
    assert "Permission denied" in one_error_line(capsys.readouterr().err)


@pytest.mark.parametrize("damage", ["empty config.json", "config.json a list", "missing run.json", "run.json bad"])
def test_damaged_run_files(run, capsys, damage):
    if damage == "empty config.json":
        (run / "config.json").write_text("")
    elif damage == "config.json a list":
        (run / "config.json").write_text("[]")
    elif damage == "missing run.json":
        (run / "run.json").unlink()
    else:
        (run / "run.json").write_text(json.dumps({"run_id": "x", "corpus": 3, "fingerprint": "f"}))
    name = "run.json" if "run.json" in damage else "config.json"
    for args in (["eval", str(run)], ["train", "--resume", str(run), "--steps", "6"]):
        assert main(args) == 2, args
        assert f"{run / name}" in one_error_line(capsys.readouterr().err)
    assert checkpoint.load(run, "last").step == 3


MANIFEST_DAMAGE = {
    "shard size a string": lambda m: m["shards"][0].update(size=str(m["shards"][0]["size"])),
    "sha256 a number": lambda m: m["shards"][0].update(sha256=7),
    "shards an object": lambda m: m.update(shards={}),
    "totals a list": lambda m: m.update(totals=[1, 2]),
    "fingerprint a number": lambda m: m.update(fingerprint=12),
    "heldout a string": lambda m: m.update(heldout="tail"),
}


@pytest.mark.parametrize("damage", MANIFEST_DAMAGE.values(), ids=MANIFEST_DAMAGE.keys())
def test_a_manifest_with_wrong_types(corpus, tmp_path, capsys, damage):
    root = shutil.copytree(corpus.root, tmp_path / "corpus")
    manifest = json.loads((root / "manifest.json").read_text())
    damage(manifest)
    (root / "manifest.json").write_text(json.dumps(manifest))
    assert main(["inspect", str(root)]) == 2
    assert f"{root / 'manifest.json'}" in one_error_line(capsys.readouterr().err)
    with pytest.raises(Exception) as e:
        load_corpus(root)
    assert type(e.value).__name__ == "DataError"


@pytest.mark.parametrize("temperature", ["nan", "inf", "-inf", "-0.5"])
def test_generate_refuses_a_temperature_that_is_not_a_finite_number_at_least_0(run, capsys, temperature):
    assert main(["generate", str(run), "--prompt", "ab", "--max-bytes", "2", f"--temperature={temperature}"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "--temperature must be a finite number >= 0" in line
    assert line.endswith(f"got {float(temperature)}")


def test_disk_full_while_logging_is_one_line_and_the_checkpoint_loads(run, monkeypatch, capsys):
    from dormouse.train import metrics

    def full(path, record):
        raise no_space(path)

    monkeypatch.setattr(metrics, "append_jsonl", full)
    assert main(["train", "--resume", str(run), "--steps", "6"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line == f"error: No space left on device: {run / 'metrics.jsonl'}; free space and run again"
    assert checkpoint.load(run, "last").step == 3
    assert not (run / ".lock").exists()


def test_prepare_into_a_place_that_cannot_hold_a_corpus(tmp_path, capsys):
    source = tmp_path / "text.txt"
    source.write_bytes(b"abcdefgh" * 64)
    for out, cause in (
        ("/proc/dormouse-corpus", "No such file or directory"),
        (source / "corpus", "File exists"),
    ):
        assert main(["prepare", str(source), "--out", str(out), "--heldout-tail", "0.1"]) == 2
        line = one_error_line(capsys.readouterr().err)
        assert line.startswith(f"error: preparing {out} failed ({cause}") and f"nothing was written under {out}" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["text.txt"]


def test_generate_refuses_an_out_it_cannot_write_before_generating(run, tmp_path, monkeypatch, capsys):
    from dormouse.decode import generate

    monkeypatch.setattr(generate, "generate", lambda *a, **k: pytest.fail("generated before --out was checked"))
    kept = tmp_path / "kept.txt"
    kept.write_text("x")
    for out, cause in ((tmp_path, "Is a directory"), (kept / "x", "Not a directory"), ("/proc/out", "No such file")):
        assert main(["generate", str(run), "--prompt", "a", "--out", str(out)]) == 2
        assert one_error_line(capsys.readouterr().err).startswith(f"error: --out {out}: cannot write it ({cause}")
    assert kept.read_text() == "x"


@pytest.mark.parametrize("removed", ["train", "train.device", "model.d_model"])
def test_a_config_json_with_a_field_removed_is_refused_naming_it(run, capsys, removed):
    config = json.loads((run / "config.json").read_text())
    section, _, key = removed.partition(".")
    del (config[section] if key else config)[key or section]
    (run / "config.json").write_text(json.dumps(config))
    for args in (["eval", str(run)], ["train", "--resume", str(run), "--steps", "6"]):
        assert main(args) == 2, args
        line = one_error_line(capsys.readouterr().err)
        assert line.startswith(f"error: {removed} is None in {run / 'config.json'}, but checkpoint ") and line.endswith(
            f"restore {removed}"
        )
    assert checkpoint.last_step(run) == 3 and not (run / ".lock").exists()


def test_a_metrics_jsonl_that_is_not_text(run, capsys):
    with open(run / "metrics.jsonl", "ab") as f:
        f.write(b"\xff\xfe\n")
    for args in (["eval", str(run)], ["train", "--resume", str(run), "--steps", "6"], ["inspect", str(run)]):
        assert main(args) == 2, args
        line = one_error_line(capsys.readouterr().err)
        assert line.startswith(f"error: {run / 'metrics.jsonl'} is not UTF-8 text (")
