"""The byte data pipeline: prepare → shards → sampler, the default corpus, and every refusal."""

import gzip
import hashlib
import json
import os
import random
import re
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from dormouse import ledger
from dormouse.data import default_corpus as dc
from dormouse.data import prepare as prepare_mod
from dormouse.data import sampler as sampler_mod
from dormouse.data.prepare import prepare
from dormouse.data.sampler import (
    Sampler,
    byte_cdf,
    count_heldout_batches,
    count_heldout_targets,
    heldout_windows,
    inverse_cdf,
)
from dormouse.data.shards import inspect_corpus, load_corpus
from dormouse.errors import ConfigError, DataError

SHAKESPEARE = Path("/work/shared/data/tinyshakespeare.txt")
NANOGPT_N, NANOGPT_TRAIN, NANOGPT_HELDOUT = 1_115_394, 1_003_854, 111_540


def random_bytes(n: int, seed: int = 0) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def write_tree(root: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


def split_bytes(out: Path, split: str) -> bytes:
    manifest = json.loads((out / "manifest.json").read_text())
    return b"".join((out / s["path"]).read_bytes() for s in manifest["shards"] if s["split"] == split)


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def outs(tmp_path: Path) -> Path:
    """An empty parent for corpora: a refused prepare must leave it empty (no temp leftovers)."""
    folder = tmp_path / "outs"
    folder.mkdir()
    return folder


def tail_corpus(tmp_path: Path, data: bytes, tail: float, shard_bytes: int):
    tmp_path.mkdir(parents=True, exist_ok=True)
    src = tmp_path / "doc.bin"
    src.write_bytes(data)
    prepare([src], tmp_path / "c", heldout_tail=tail, shard_bytes=shard_bytes)
    return load_corpus(tmp_path / "c")


# ---- prepare: the splits -------------------------------------------------------------------------


@pytest.mark.skipif(not SHAKESPEARE.exists(), reason="tinyshakespeare.txt is not on this machine")
def test_tinyshakespeare_tail_split_is_nanogpts(outs):
    manifest = prepare([SHAKESPEARE], outs / "ts", heldout_tail=0.1)
    assert manifest["totals"] == {"train": NANOGPT_TRAIN, "heldout": NANOGPT_HELDOUT}
    data = SHAKESPEARE.read_bytes()
    assert split_bytes(outs / "ts", "train") == data[: int(len(data) * 0.9)]
    text = inspect_corpus(outs / "ts")
    assert f"train bytes: {NANOGPT_TRAIN}\n" in text and f"heldout bytes: {NANOGPT_HELDOUT}\n" in text


@pytest.mark.parametrize("gz", [False, True])
def test_tail_split_arithmetic_on_a_file_of_shakespeares_size(tmp_path, outs, gz):
    data = random_bytes(NANOGPT_N)
    src = tmp_path / ("s.bin.gz" if gz else "s.bin")
    src.write_bytes(gzip.compress(data, compresslevel=1) if gz else data)
    manifest = prepare([src], outs / "c", heldout_tail=0.1, shard_bytes=300_000)
    assert manifest["totals"] == {"train": NANOGPT_TRAIN, "heldout": NANOGPT_HELDOUT}
    assert split_bytes(outs / "c", "train") == data[:NANOGPT_TRAIN]
    assert split_bytes(outs / "c", "heldout") == data[NANOGPT_TRAIN:]
    assert [s["size"] for s in manifest["shards"]] == [300_000, 300_000, 300_000, 103_854, 111_540]
    assert manifest["sources"] == [{"name": src.name, "size": NANOGPT_N, "sha256": hashlib.sha256(data).hexdigest()}]
    assert manifest["heldout"] == {"mode": "tail", "fraction": 0.1}


@pytest.mark.parametrize("gz", [False, True])
def test_validation_tail_is_a_tuning_corpus_without_the_heldout_tail(tmp_path, outs, gz):
    # Of tinyshakespeare's size: c = int(n * 0.9) = 1,003,854 bytes are the tail split's train part;
    # the tuning corpus trains on int(c * 0.9) = 903,468 of them and validates on the next 100,386.
    # The held-out tail (the last 111,540 bytes) is not in it at all.
    data = random_bytes(NANOGPT_N)
    src = tmp_path / ("s.bin.gz" if gz else "s.bin")
    src.write_bytes(gzip.compress(data, compresslevel=1) if gz else data)
    manifest = prepare([src], outs / "c", heldout_tail=0.1, validation_tail=0.1, shard_bytes=300_000)
    assert manifest["totals"] == {"train": 903_468, "heldout": 100_386}
    assert split_bytes(outs / "c", "train") == data[:903_468]
    assert split_bytes(outs / "c", "heldout") == data[903_468:NANOGPT_TRAIN]
    assert manifest["heldout"] == {"mode": "tail-validation", "fraction": 0.1, "validation": 0.1}
    assert "validation fraction: 0.1" in inspect_corpus(outs / "c")


def test_validation_tail_needs_a_tail_split(tmp_path, outs):
    src = tmp_path / "s.bin"
    src.write_bytes(random_bytes(1000))
    with pytest.raises(DataError, match="give heldout_tail too"):
        prepare([src], outs / "c", validation_tail=0.1)
    assert not (outs / "c").exists()


def test_folders_are_recursive_sorted_and_gz_is_decompressed(tmp_path, outs):
    tree = write_tree(
        tmp_path / "src",
        {"b.txt": b"BBBB", "a/z.txt": b"zz", "a/y/x.txt": b"xxx", "c.txt.gz": gzip.compress(b"decompressed!")},
    )
    extra = tmp_path / "solo.txt"
    extra.write_bytes(b"solo")
    manifest = prepare([tree, extra], outs / "c", heldout_fraction=0.2)
    names = [s["name"] for s in manifest["sources"]]
    assert names == ["solo.txt", "src/a/y/x.txt", "src/a/z.txt", "src/b.txt", "src/c.txt.gz"]
    content = {"solo.txt": b"solo", "src/a/y/x.txt": b"xxx", "src/a/z.txt": b"zz", "src/b.txt": b"BBBB"}
    content["src/c.txt.gz"] = b"decompressed!"
    for s in manifest["sources"]:
        assert s["size"] == len(content[s["name"]]) and s["sha256"] == hashlib.sha256(content[s["name"]]).hexdigest()
    held = manifest["heldout"]["documents"]
    assert len(held) == 1  # max(1, round(0.2 * 5))
    assert split_bytes(outs / "c", "heldout") == content[held[0]]
    assert split_bytes(outs / "c", "train") == b"".join(content[n] for n in names if n not in held)
    for s in manifest["shards"]:
        data = (outs / "c" / s["path"]).read_bytes()
        assert s["size"] == len(data) > 0 and s["sha256"] == hashlib.sha256(data).hexdigest()
    lines = "".join(f"{s['path']} {s['sha256']}\n" for s in manifest["shards"]).encode()
    assert manifest["fingerprint"] == hashlib.sha256(lines).hexdigest() == load_corpus(outs / "c").fingerprint
    assert json.loads((outs / "c" / "manifest.json").read_text()) == manifest
    assert [p.name for p in outs.iterdir()] == ["c"]  # no temp sibling left behind


def test_document_split_is_disjoint_deterministic_and_stable_when_files_are_added(tmp_path, outs):
    files = {f"d{i:02d}.txt": random_bytes(50 + i, seed=i) for i in range(20)}
    tree = write_tree(tmp_path / "t", files)
    m1 = prepare([tree], outs / "a", heldout_fraction=0.2)
    assert prepare([tree], outs / "b", heldout_fraction=0.2) == m1  # a pure function of the inputs
    held = set(m1["heldout"]["documents"])
    assert len(held) == 4
    train = {s["name"] for s in m1["sources"]} - held
    assert held and train and not held & train
    assert m1["totals"] == {
        "heldout": sum(len(files[n[2:]]) for n in held),
        "train": sum(len(files[n[2:]]) for n in train),
    }

    write_tree(tree, {f"new{i}.txt": random_bytes(30, seed=100 + i) for i in range(10)})
    m2 = prepare([tree], outs / "c", heldout_fraction=0.2)
    held2 = set(m2["heldout"]["documents"]) & {s["name"] for s in m1["sources"]}
    # the ranking of the old documents is unchanged, so the old held-out set and the new one
    # (restricted to old documents) are prefixes of one order: one contains the other
    assert held2 <= held or held <= held2


def test_shards_never_exceed_shard_bytes_and_are_never_empty(tmp_path, outs):
    data = random_bytes(1000)
    src = tmp_path / "d.bin"
    src.write_bytes(data)
    manifest = prepare([src], outs / "c", heldout_tail=0.3, shard_bytes=64)
    sizes = {split: [s["size"] for s in manifest["shards"] if s["split"] == split] for split in ("train", "heldout")}
    assert sizes["train"] == [64] * 10 + [60] and sizes["heldout"] == [64] * 4 + [44]
    assert split_bytes(outs / "c", "train") + split_bytes(outs / "c", "heldout") == data


def test_an_existing_empty_out_folder_is_used(tmp_path, outs):
    src = write_tree(tmp_path / "t", {"a": b"aaaa", "b": b"bbbb", "c": b"cccc"})
    (outs / "c").mkdir()
    prepare([src], outs / "c")
    assert load_corpus(outs / "c").split_size("heldout") == 4


# ---- prepare: refusals (each names the path; nothing written, nothing lost) ---------------------


def refused(outs: Path, inputs, match: str, **kw) -> DataError:
    with pytest.raises(DataError) as e:
        prepare(inputs, outs / "c", **kw)
    assert re.search(match, str(e.value)), str(e.value)
    assert list(outs.iterdir()) == [], "a refused prepare left files behind"
    return e.value


def test_refuses_a_missing_input(tmp_path, outs):
    good = write_tree(tmp_path / "t", {"a": b"a", "b": b"b"})
    refused(outs, [good, tmp_path / "nope.txt"], f"{tmp_path / 'nope.txt'} does not exist")


def can_read(path: Path) -> bool:
    try:
        path.read_bytes()
    except PermissionError:
        return False
    return True


def test_refuses_an_unreadable_file_and_folder(tmp_path, outs):
    tree = write_tree(tmp_path / "t", {"a": b"a", "b": b"b", "sub/c": b"c"})
    (tree / "b").chmod(0)
    if can_read(tree / "b"):
        pytest.skip("this user reads a mode-000 file anyway (root): simulated in the next two tests")
    try:
        refused(outs, [tree], f"cannot read input {tree / 'b'}")
    finally:
        (tree / "b").chmod(0o644)
    (tree / "sub").chmod(0)
    try:
        refused(outs, [tree], f"cannot read input folder {tree / 'sub'}")
    finally:
        (tree / "sub").chmod(0o755)


def test_refuses_an_unreadable_file_found_mid_write(tmp_path, outs, monkeypatch):
    tree = write_tree(tmp_path / "t", {"a": b"a" * 100, "b": b"b" * 100, "c": b"c" * 100})
    real = prepare_mod._open_document

    def open_document(doc):
        if doc.path.name == "c":  # the last document: a and b are already in the shards
            raise PermissionError(13, "Permission denied", str(doc.path))
        return real(doc)

    monkeypatch.setattr(prepare_mod, "_open_document", open_document)
    refused(outs, [tree], f"cannot read input {tree / 'c'}: Permission denied")


def test_refuses_an_unreadable_folder_instead_of_skipping_it(tmp_path, outs, monkeypatch):
    tree = write_tree(tmp_path / "t", {"a": b"a", "sub/b": b"b"})
    real = os.walk

    def walk(top, onerror=None, **kw):  # what os.walk does when it cannot list a folder
        onerror(PermissionError(13, "Permission denied", str(tree / "sub")))
        return real(top, onerror=onerror, **kw)

    monkeypatch.setattr(prepare_mod.os, "walk", walk)
    refused(outs, [tree], f"cannot read input folder {tree / 'sub'}: Permission denied")


def test_refuses_a_corrupt_gz(tmp_path, outs):
    tree = write_tree(tmp_path / "t", {"a.txt": b"a", "b.gz": b"not gzip at all"})
    refused(outs, [tree], f"input {tree / 'b.gz'} is not a valid .gz file")


def test_refuses_an_empty_corpus(tmp_path, outs):
    tree = write_tree(tmp_path / "t", {"a": b"", "b": b"", "c": b""})
    refused(outs, [tree], f"corpus is empty.*{tree / 'a'}")
    (tmp_path / "hollow" / "sub").mkdir(parents=True)
    refused(outs, [tmp_path / "hollow"], f"input folder {tmp_path / 'hollow'} holds no files")


def test_refuses_an_empty_heldout_split(tmp_path, outs):
    names = ["a", "b", "c"]
    first = min(names, key=lambda n: hashlib.sha256(f"t/{n}".encode()).hexdigest())  # the held-out one
    tree = write_tree(tmp_path / "t", {n: b"" if n == first else b"data" for n in names})
    refused(outs, [tree], f"held-out split would be empty.*t/{first}")


def test_refuses_an_empty_train_split(tmp_path, outs):
    one = write_tree(tmp_path / "t", {"only.txt": b"some bytes"})
    refused(outs, [one / "only.txt"], f"one document \\({one / 'only.txt'}\\).*--heldout-tail")
    two = write_tree(tmp_path / "u", {"a": b"a", "b": b"b"})
    refused(outs, [two], f"0.9 of 2 documents .*{two / 'a'}.*train split would be empty", heldout_fraction=0.9)
    tiny = write_tree(tmp_path / "v", {"x": b"x"})
    refused(outs, [tiny / "x"], f"train split would be empty.*{tiny / 'x'}", heldout_tail=0.5)


def test_refuses_tail_over_several_documents(tmp_path, outs):
    tree = write_tree(tmp_path / "t", {"a": b"aa", "b": b"bb"})
    refused(outs, [tree], f"heldout_tail splits one file.*{tree / 'a'}", heldout_tail=0.1)


def test_refuses_two_documents_with_one_name(tmp_path, outs):
    write_tree(tmp_path, {"x/a.txt": b"1", "y/a.txt": b"2"})
    refused(outs, [tmp_path / "x/a.txt", tmp_path / "y/a.txt"], f"'a.txt': {tmp_path / 'x/a.txt'}")


@pytest.mark.parametrize("bad", [0.0, 1.0, -0.1, 1.5, float("nan")])
def test_refuses_bad_fractions(tmp_path, outs, bad):
    src = write_tree(tmp_path / "t", {"a": b"aaaa", "b": b"bbbb"})
    refused(outs, [src], f"heldout_fraction must be in \\(0, 1\\).*{outs / 'c'}", heldout_fraction=bad)
    refused(outs, [src / "a"], "heldout_tail must be in \\(0, 1\\)", heldout_tail=bad)


def test_never_overwrites_an_existing_corpus(tmp_path, outs):
    a = write_tree(tmp_path / "a", {"1": b"one", "2": b"two", "3": b"three"})
    b = write_tree(tmp_path / "b", {"1": b"uno", "2": b"dos", "3": b"tres"})
    prepare([a], outs / "c")
    before = snapshot(outs / "c")
    with pytest.raises(DataError, match=f"{outs / 'c'} already exists and is not empty"):
        prepare([b], outs / "c")
    assert snapshot(outs / "c") == before
    assert [p.name for p in outs.iterdir()] == ["c"]


# ---- load: refusals ------------------------------------------------------------------------------


@pytest.fixture
def small_corpus(tmp_path) -> Path:
    src = tmp_path / "d.bin"
    src.write_bytes(random_bytes(300))
    prepare([src], tmp_path / "c", heldout_tail=0.2, shard_bytes=100)
    return tmp_path / "c"


def damage_missing(p: Path):
    p.unlink()


def damage_empty(p: Path):
    p.write_bytes(b"")


def damage_longer(p: Path):
    p.write_bytes(p.read_bytes() + b"\0")


def damage_one_byte(p: Path):
    data = bytearray(p.read_bytes())
    data[17] ^= 0x01
    p.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage, site",
    [
        (damage_missing, "data.shard_unstatable"),
        (damage_empty, "data.shard_empty"),
        (damage_longer, "data.shard_size_mismatch"),
        (damage_one_byte, "data.shard_hash_mismatch"),
    ],
)
def test_load_refuses_a_damaged_shard_naming_it(small_corpus, damage, site):
    shard = small_corpus / "train-00001.bin"
    damage(shard)
    with pytest.raises(ledger.FallbackRefused) as e:
        load_corpus(small_corpus)
    assert e.value.site == site and str(shard) in str(e.value)
    assert ledger.SITES[site].kind is ledger.Kind.LOUD


def test_load_refuses_a_folder_without_manifest(tmp_path):
    with pytest.raises(DataError, match=f"{tmp_path / 'manifest.json'} does not exist"):
        load_corpus(tmp_path)


def test_inspect_reports_key_value_lines(small_corpus):
    fields = dict(line.split(": ", 1) for line in inspect_corpus(small_corpus).splitlines())
    assert fields["train bytes"] == "240" and fields["heldout bytes"] == "60"
    assert fields["shards"] == "4" and fields["heldout mode"] == "tail" and fields["sources"] == "1"
    assert fields["fingerprint"] == load_corpus(small_corpus).fingerprint


# ---- reading and sampling ------------------------------------------------------------------------


def test_read_treats_shards_as_one_stream(tmp_path):
    data = random_bytes(120)
    corpus = tail_corpus(tmp_path, data, 0.25, shard_bytes=7)
    train = np.frombuffer(data[:90], np.uint8)
    for offset in range(0, 91):
        for length in range(0, 91 - offset, 5):
            assert np.array_equal(corpus.read("train", offset, length), train[offset : offset + length])
    for offset, length in [(85, 6), (90, 1), (-1, 2), (0, 91)]:
        with pytest.raises(DataError, match="outside the train split \\(90 bytes\\)"):
            corpus.read("train", offset, length)
    with pytest.raises(DataError, match="unknown split 'test'"):
        corpus.read("test", 0, 1)


def test_batches_are_shifted_windows_of_the_raw_bytes_across_shards(tmp_path):
    data = random_bytes(4000)
    corpus = tail_corpus(tmp_path, data, 0.25, shard_bytes=37)
    sampler = Sampler(corpus, batch_size=8, seq_len=16)
    x, y = sampler.batch(seed=3, step=5)
    assert x.shape == y.shape == (8, 16) and x.dtype == y.dtype == torch.int64
    raw = torch.tensor(list(data[:3000]))
    for row, off in enumerate(sampler.offsets(3, 5).tolist()):
        assert torch.equal(x[row], raw[off : off + 16]) and torch.equal(y[row], raw[off + 1 : off + 17])
    assert torch.equal(x[:, 1:], y[:, :-1])
    xh, yh = sampler.batch(seed=3, step=5, split="heldout")
    raw_h = torch.tensor(list(data[3000:]))
    for row, off in enumerate(sampler.offsets(3, 5, "heldout").tolist()):
        assert torch.equal(xh[row], raw_h[off : off + 16]) and torch.equal(yh[row], raw_h[off + 1 : off + 17])


def test_a_batch_is_cut_and_widened_in_numpy_not_by_torch_ops(tmp_path):
    # torch's copies of the batch sat in 1.4-5.9 ms idle gaps a step on the H200 (most likely its thread
    # pool, which takes ops of >= 32768 elements, waking after the host's wait for the GPU): the windows
    # become int64 inputs and targets in numpy, and torch copies nothing (it draws the offsets).
    sampler = Sampler(tail_corpus(tmp_path, random_bytes(4000), 0.25, shard_bytes=37), batch_size=8, seq_len=16)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        sampler.batch(seed=3, step=5)
    ops = {e.key for e in prof.key_averages()}
    assert not ops & {"aten::to", "aten::_to_copy", "aten::copy_", "aten::clone", "aten::contiguous"}, ops


def test_offsets_cover_every_window_start_uniformly(tmp_path):
    corpus = tail_corpus(tmp_path, random_bytes(80), 0.5, shard_bytes=16)  # train: 40 bytes
    sampler = Sampler(corpus, batch_size=8, seq_len=16)
    seen = torch.cat([sampler.offsets(0, step) for step in range(200)])
    assert seen.min() == 0 and seen.max() == 40 - 17  # the last full window is reachable
    assert torch.bincount(seen).min() > 30  # 1600 draws over 24 starts: ~67 each


def test_batches_are_a_pure_function_of_seed_and_step(tmp_path):
    corpus = tail_corpus(tmp_path, random_bytes(5000), 0.1, shard_bytes=1000)
    sampler = Sampler(corpus, batch_size=4, seq_len=32)
    torch.manual_seed(1)
    np.random.seed(1)
    random.seed(1)
    state = torch.get_rng_state()
    first = sampler.batch(7, 11)
    assert torch.equal(torch.get_rng_state(), state), "the sampler advanced the global torch RNG"
    torch.manual_seed(999)
    np.random.seed(999)
    random.seed(999)
    again = Sampler(corpus, batch_size=4, seq_len=32).batch(7, 11)
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert not torch.equal(sampler.batch(7, 12)[0], first[0])
    assert not torch.equal(sampler.batch(8, 11)[0], first[0])


def test_byte_noise_replaces_inputs_at_its_rate_the_same_on_every_rank(tmp_path):
    corpus = tail_corpus(tmp_path, random_bytes(20000), 0.1, shard_bytes=4000)
    clean, noisy = Sampler(corpus, 64, 64), Sampler(corpus, 64, 64, byte_noise=0.1)
    changed, replaced = 0, []
    for step in range(20):
        (x0, y0), (x1, y1) = clean.batch(3, step), noisy.batch(3, step)
        assert torch.equal(y1, y0)  # the targets are the text's bytes
        hit = x1 != x0
        changed += int(hit.sum())
        replaced.append(x1[hit])
        halves = [noisy.batch(3, step, rank=r, world_size=2)[0] for r in (0, 1)]
        assert torch.equal(torch.cat(halves), x1)  # rank r's rows of the one-process batch
    # 20 x 4096 inputs, each changed with probability 0.1 x 255/256 (a replacement may draw the same byte)
    rate = changed / (20 * 64 * 64)
    assert abs(rate - 0.1 * 255 / 256) < 0.005  # ~5 standard deviations (0.00105)
    counts = torch.bincount(torch.cat(replaced), minlength=256)
    assert len(counts) == 256 and counts.min() > 5 and counts.max() < 75  # uniform: ~32 per byte
    assert torch.equal(noisy.batch(3, 7)[0], Sampler(corpus, 64, 64, byte_noise=0.1).batch(3, 7)[0])
    with pytest.raises(ConfigError, match="byte_noise must be in \\[0, 1\\)"):
        Sampler(corpus, 64, 64, byte_noise=1.0)


def test_the_inverse_cdf_of_a_hand_counted_text():
    counts = torch.zeros(256, dtype=torch.float64)
    counts[97], counts[98] = 3, 1  # "aaab": cdf 0 up to 96, 0.75 at 97, 1 from 98 on
    cdf = counts.cumsum(0) / 4
    u = torch.tensor([0.0, 0.5, 0.7499, 0.75, 0.9999], dtype=torch.float64)
    assert inverse_cdf(cdf, u).tolist() == [97, 97, 97, 98, 98]


def test_byte_counts_are_the_training_splits_in_any_chunking(tmp_path, monkeypatch):
    corpus = tail_corpus(tmp_path, random_bytes(20000), 0.1, shard_bytes=4000)
    train = corpus.read("train", 0, corpus.split_size("train"))
    expected = np.cumsum(np.bincount(train, minlength=256)) / len(train)
    monkeypatch.setattr(sampler_mod, "HISTOGRAM_CHUNK", 999)  # 19 chunks, across shard boundaries
    cdf = byte_cdf(corpus)
    assert cdf.dtype == torch.float64 and cdf[-1] == 1.0
    assert np.allclose(cdf.numpy(), expected, rtol=0, atol=1e-15)


def test_unigram_byte_noise_draws_replacements_at_the_texts_byte_frequencies(tmp_path):
    # a text of 75 % 'a', 20 % 'b', 5 % 'c'; inputs of byte 255 (never in it) show every replacement
    gen = torch.Generator().manual_seed(0)
    text = torch.multinomial(torch.tensor([0.75, 0.20, 0.05]), 20000, replacement=True, generator=gen) + 97
    corpus = tail_corpus(tmp_path, bytes(text.tolist()), 0.1, shard_bytes=4000)
    train = np.bincount(corpus.read("train", 0, corpus.split_size("train")), minlength=256)[97:100]
    freq = train / train.sum()
    noisy = Sampler(corpus, 64, 64, byte_noise=0.5, noise_source="unigram")
    out = noisy._noised(torch.full((64, 64), 255), 3, 5, range(64))
    replaced = out[out != 255]
    assert abs(len(replaced) - 2048) < 160  # 4096 draws at 0.5: standard deviation 32
    assert set(replaced.unique().tolist()) <= {97, 98, 99}
    counts = torch.bincount(replaced - 97, minlength=3).numpy()
    expected = freq * len(replaced)
    sd = np.sqrt(len(replaced) * freq * (1 - freq))
    assert (np.abs(counts - expected) < 5 * sd).all()  # ~20, 18, 10 for a, b, c
    # the ranks' rows are the one-process batch's; the mask is uniform noise's own draw
    assert torch.equal(torch.cat([noisy.batch(3, 5, rank=r, world_size=2)[0] for r in (0, 1)]), noisy.batch(3, 5)[0])
    uniform = Sampler(corpus, 64, 64, byte_noise=0.5)._noised(torch.full((64, 64), 255), 3, 5, range(64))
    # unigram never draws 255, so out != 255 is the mask itself; uniform changes the same places (but
    # where it drew 255, 1 in 256)
    assert not ((uniform != 255) & (out == 255)).any() and ((out != 255) & (uniform == 255)).sum() < 30
    with pytest.raises(ConfigError, match="noise_source must be one of"):
        Sampler(corpus, 64, 64, byte_noise=0.5, noise_source="zipf")


def test_sampler_refuses_a_split_shorter_than_a_window(tmp_path):
    corpus = tail_corpus(tmp_path, random_bytes(100), 0.1, shard_bytes=30)  # 90 train, 10 held out
    with pytest.raises(DataError, match="train split .* has 90 bytes, fewer than seq_len \\+ 1 = 91"):
        Sampler(corpus, batch_size=2, seq_len=90)
    sampler = Sampler(corpus, batch_size=2, seq_len=89)
    with pytest.raises(DataError, match="heldout split .* has 10 bytes, fewer than seq_len \\+ 1 = 90"):
        sampler.batch(0, 0, split="heldout")


@pytest.mark.parametrize("max_bytes", [None, 1, 100, 10**9])
def test_heldout_windows_score_every_byte_after_the_first_once(tmp_path, max_bytes):
    data = random_bytes(2000)
    corpus = tail_corpus(tmp_path, data, 0.25, shard_bytes=37)  # held out: 500 bytes over 14 shards
    heldout = torch.tensor(list(data[1500:]))
    scored = min(499, max_bytes or 499)
    assert count_heldout_targets(corpus, max_bytes) == scored
    batches = list(heldout_windows(corpus, seq_len=16, batch_size=4, max_bytes=max_bytes))
    full, rest = divmod(scored, 16)
    shapes = [tuple(x.shape) for x, _ in batches]
    assert shapes == [(min(4, full - i), 16) for i in range(0, full, 4)] + ([(1, rest)] if rest else [])
    assert count_heldout_batches(corpus, 16, 4, max_bytes) == len(batches)
    for x, y in batches:
        assert x.dtype == y.dtype == torch.int64 and x.shape == y.shape
    inputs = torch.cat([x.flatten() for x, _ in batches])
    targets = torch.cat([y.flatten() for _, y in batches])
    assert torch.equal(targets, heldout[1 : 1 + scored])  # each scored byte exactly once, in order
    assert torch.equal(inputs, heldout[:scored])  # each target's input is the byte before it


def test_heldout_windows_refuse_nothing_to_score(tmp_path):
    corpus = tail_corpus(tmp_path, random_bytes(100), 0.01, shard_bytes=100)  # 1 byte held out
    with pytest.raises(DataError, match="heldout split .* has 1 bytes: nothing to score"):
        list(heldout_windows(corpus, 16, 4))
    with pytest.raises(DataError, match="max_bytes must be a positive integer, got 0"):
        count_heldout_targets(tail_corpus(tmp_path / "x", random_bytes(100), 0.5, 100), 0)


# ---- the default corpus ----------------------------------------------------------------------------


@pytest.fixture
def fake_stdlib(tmp_path, monkeypatch) -> Path:
    files = {f"mod{i}.py": random_bytes(200 + i, seed=i) for i in range(12)}
    files |= {"pkg/__init__.py": b"", "pkg/sub.py": b"x = 1\n", "README.txt": b"not python"}
    files |= {"site-packages/third.py": b"third party", "pkg/dist-packages/debian.py": b"distro"}
    root = write_tree(tmp_path / "stdlib", files)
    monkeypatch.setattr(dc, "stdlib_dir", lambda: root)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return root


def test_default_corpus_is_the_stdlib_sources_prepared_once(fake_stdlib, tmp_path, monkeypatch):
    path = dc.default_corpus_dir()
    assert path.parent == tmp_path / "cache" / "dormouse" / "default-corpus"
    assert path.name.startswith(f"py{dc.platform.python_version()}-")
    manifest = load_corpus(path).manifest
    names = [s["name"] for s in manifest["sources"]]
    assert names == sorted([f"mod{i}.py" for i in range(12)] + ["pkg/__init__.py", "pkg/sub.py"])
    assert manifest["heldout"]["mode"] == "document" and len(manifest["heldout"]["documents"]) == 1

    def no_prepare(*a, **kw):
        raise AssertionError("the cached corpus was prepared again")

    monkeypatch.setattr(dc, "write_corpus", no_prepare)
    assert dc.default_corpus_dir() == path
    line = dc.describe_default_corpus()
    assert re.fullmatch(
        rf"default corpus: Python {re.escape(dc.platform.python_version())} stdlib sources, 14 files, "
        rf"{manifest['totals']['train']} bytes train / {manifest['totals']['heldout']} bytes held-out, "
        rf"fingerprint {manifest['fingerprint'][:12]}",
        line,
    )


def test_default_corpus_key_follows_the_file_list(fake_stdlib):
    first = dc.default_corpus_dir()
    (fake_stdlib / "added.py").write_bytes(b"y = 2\n")
    second = dc.default_corpus_dir()
    assert second != first and "added.py" in {s["name"] for s in load_corpus(second).manifest["sources"]}


def test_default_corpus_loser_of_a_prepare_race_uses_the_winner(fake_stdlib, monkeypatch):
    real = dc.write_corpus

    def racing(docs, out, **kw):
        final = out.parent / out.name[1:].rsplit(".", 1)[0]
        real(docs, final, **kw)  # another process finishes first
        return real(docs, out, **kw)

    monkeypatch.setattr(dc, "write_corpus", racing)
    path = dc.default_corpus_dir()
    assert load_corpus(path).split_size("train") > 0
    assert [p.name for p in path.parent.iterdir()] == [path.name], "the loser's copy was left behind"


def test_default_corpus_reports_progress_while_it_prepares(fake_stdlib, monkeypatch, capsys):
    (fake_stdlib / "big.py").write_bytes(b"x" * (2 * 2**20 - sum(p.stat().st_size for p in fake_stdlib.rglob("*.py"))))
    real = dc.write_corpus

    def slow(docs, out, **kw):  # half the sources' bytes sit in the temporary folder a while
        tmp = out.parent / f".{out.name}.tmp-1"
        tmp.mkdir()
        (tmp / "train-00000.bin").write_bytes(b"x" * 2**20)
        time.sleep(0.5)
        shutil.rmtree(tmp)
        return real(docs, out, **kw)

    monkeypatch.setattr(dc, "write_corpus", slow)
    monkeypatch.setattr(dc, "PROGRESS_EVERY", 0.05)
    path = dc.default_corpus_dir()
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == f"default corpus: preparing 15 stdlib files (2.0 MiB) once, into {path}"
    assert "default corpus: 1.0 MiB of 2.0 MiB written (0 s)" in lines[1:-1]
    took = re.fullmatch(r"default corpus: prepared in (\d+\.\d) s", lines[-1])
    assert took and float(took[1]) >= 0.5
    dc.default_corpus_dir()
    assert capsys.readouterr().err == "", "a cached corpus reports nothing"


def test_default_corpus_cache_defaults_to_home(fake_stdlib, tmp_path, monkeypatch):
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert dc.default_corpus_dir().parent == tmp_path / "home" / ".cache" / "dormouse" / "default-corpus"
