"""Which fla kernel choices a card reads (fla_pin.kernel_source), on the CPU with made-up card names:
its own committed pin; else a pin of the same compute capability, through its user cache; else its user
cache; else Triton times every kernel once and the user cache keeps the choices at exit."""

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from dormouse import ledger
from dormouse.ops.fla import pin as fla_pin
from dormouse.ops.fla.pin import BORROWED, CONFIG_ROOT, kernel_source

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benches"))
from merge_fla_pin import pinned_config  # noqa: E402  fla's lookup: exact, else the first fuzzy match

H200 = CONFIG_ROOT / "NVIDIA_H200"  # the committed pin the fake cards of capability 9.0 borrow
PINS = {"NVIDIA_H200": (9, 0)}


def entry(key: list, block: int) -> dict:
    return {"autotune_key": key, "config": {"kwargs": {"BT": block}, "num_warps": 4, "num_stages": 2, "num_ctas": 1}}


def written(key: list, block: int) -> dict:
    """`entry` as store_new_choices writes it (fla_pin.config_entry: a triton.Config's every field)."""
    e = entry(key, block)
    return {**e, "config": {**e["config"], "maxnreg": None, "ir_override": None}}


def applied(source) -> tuple[dict, list, int]:
    """(the environment fla would see, the exit hooks registered, fla.borrowed_pin's count) after `_apply`."""
    env, hooks, before = {}, [], ledger.COUNTS[BORROWED]
    fla_pin._apply(source, env, lambda fn, *args: hooks.append((fn, args)))
    return env, hooks, ledger.COUNTS[BORROWED] - before


def test_every_committed_pin_has_its_cards_capability():
    assert set(fla_pin.PIN_CAPABILITY) == {p.name for p in CONFIG_ROOT.iterdir() if p.is_dir()}


def test_a_card_with_its_own_pin_reads_it_through_its_user_cache(tmp_path):
    """The pin first, then what this card timed beyond it (a kernel or dtype the pin lacks): kept, not borrowed."""
    cache = tmp_path / ".cache/dormouse/kernels/NVIDIA_H200"
    kernel = "l2norm_fwd_kernel"
    cache.mkdir(parents=True)
    (cache / f"{kernel}.json").write_text(
        json.dumps({"kernel_name": kernel, "autotune_entries": {"own": entry([7], 8)}})
    )
    source = kernel_source("NVIDIA H200", (9, 0), {"HOME": str(tmp_path)}, PINS)
    assert (source.rule, source.read, source.store, source.pin) == ("pin", cache, cache, H200)
    assert (
        source.note
        == f"fla kernel configs: pinned from {H200} through {cache}, which keeps what this card times beyond the pin"
    )
    env, hooks, borrowed = applied(source)
    assert env == {"FLA_CONFIG_DIR": str(cache), "FLA_CACHE_MODE": "fuzzy"} and borrowed == 0
    assert hooks == [(fla_pin.store_new_choices, (cache,))]
    pinned = json.loads((H200 / f"{kernel}.json").read_text())["autotune_entries"]
    assert list(json.loads((cache / f"{kernel}.json").read_text())["autotune_entries"]) == [*pinned, "own"]


def test_a_card_of_the_same_capability_borrows_the_pin_through_its_user_cache(tmp_path):
    home = {"HOME": str(tmp_path)}
    cache = tmp_path / ".cache/dormouse/kernels/Fake_GPU_X9"
    # The cache holds this card's own choices from an earlier run: one where the pin's entry was refused
    # and Triton timed another (same key), one the pin lacks.
    kernel = "chunk_kda_bwd_kernel_wy_dqkg_fused"
    pinned = json.loads((H200 / f"{kernel}.json").read_text())["autotune_entries"]
    refused = next(iter(pinned))
    own = {refused: entry(pinned[refused]["autotune_key"], 999), "own": entry([1, "own"], 16)}
    cache.mkdir(parents=True)
    (cache / f"{kernel}.json").write_text(json.dumps({"kernel_name": kernel, "autotune_entries": own}))

    source = kernel_source("Fake GPU X9", (9, 0), home, {**PINS, "Fake_GPU_A": (8, 0)})
    assert (source.rule, source.read, source.store, source.pin) == ("borrowed", cache, cache, H200)
    assert "\n" not in source.note
    assert f"no pin for Fake GPU X9; borrowed from NVIDIA_H200 (same compute capability 9.0) through {cache}" in (
        source.note
    )
    env, hooks, borrowed = applied(source)
    assert env == {"FLA_CONFIG_DIR": str(cache), "FLA_CACHE_MODE": "fuzzy"} and borrowed == 1
    assert hooks == [(fla_pin.store_new_choices, (cache,))]  # what this card times lands in its cache
    assert sorted(p.name for p in cache.glob("*.json")) == sorted(p.name for p in H200.glob("*.json"))
    merged = json.loads((cache / f"{kernel}.json").read_text())["autotune_entries"]
    assert list(merged) == [*pinned, "own"]  # the pin's first, in its order: fla's fuzzy lookup takes the first
    assert merged[refused]["config"]["kwargs"] == {"BT": 999}  # timed on this card: kept
    other = "l2norm_fwd_kernel.json"
    assert json.loads((cache / other).read_text()) == json.loads((H200 / other).read_text())
    assert applied(source)[2] == 1  # a second process merges again: nothing changes, counted again
    assert json.loads((cache / f"{kernel}.json").read_text())["autotune_entries"] == merged


def test_the_nearest_pin_of_a_capability_shares_the_longest_name_start():
    pins = {"NVIDIA_H200": (9, 0), "NVIDIA_H100_80GB_HBM3": (9, 0), "NVIDIA_A100_SXM4_80GB": (8, 0)}
    assert fla_pin.nearest_pin("NVIDIA H100 PCIe", (9, 0), pins) == "NVIDIA_H100_80GB_HBM3"
    assert fla_pin.nearest_pin("NVIDIA GH200 480GB", (9, 0), pins) == "NVIDIA_H100_80GB_HBM3"  # a tie: by name
    assert fla_pin.nearest_pin("NVIDIA A100-PCIE-40GB", (8, 0), pins) == "NVIDIA_A100_SXM4_80GB"
    assert fla_pin.nearest_pin("NVIDIA H200", (8, 9), pins) is None  # a name alone borrows nothing


def test_another_capability_reads_its_user_cache_else_autotunes_once_into_it(tmp_path):
    home = {"HOME": str(tmp_path)}
    cache = tmp_path / ".cache/dormouse/kernels/Fake_GPU_Y8"
    source = kernel_source("Fake GPU Y8", (8, 9), home, PINS)
    assert (source.rule, source.read, source.store, source.pin) == ("autotune", cache, cache, None)
    assert "\n" not in source.note and "Triton times each fla kernel on its first use, which may take minutes" in (
        source.note
    )
    assert f"the choices are written to {cache} at exit" in source.note and "`dormouse tune`" in source.note
    env, hooks, borrowed = applied(source)
    assert env == {"FLA_CONFIG_DIR": str(cache), "FLA_CACHE_MODE": "fuzzy"} and borrowed == 0
    assert hooks == [(fla_pin.store_new_choices, (cache,))] and not cache.exists()

    cache.mkdir(parents=True)
    (cache / fla_pin.UNPINNED_FILE).write_text("[]")  # a report, not a choice
    assert kernel_source("Fake GPU Y8", (8, 9), home, PINS).rule == "autotune"
    (cache / "k.json").write_text(json.dumps({"kernel_name": "k", "autotune_entries": {"h": entry([1], 32)}}))
    source = kernel_source("Fake GPU Y8", (8, 9), home, PINS)
    assert (source.rule, source.read, source.store) == ("cache", cache, cache)
    assert applied(source)[1] == [(fla_pin.store_new_choices, (cache,))]


def test_the_user_cache_is_under_xdg_cache_home_when_it_is_absolute(tmp_path):
    env = {"HOME": str(tmp_path / "home"), "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    assert kernel_source("Fake GPU Y8", (8, 9), env, PINS).store == tmp_path / "xdg/dormouse/kernels/Fake_GPU_Y8"
    assert kernel_source("Fake GPU X9", (9, 0), env, PINS).store == tmp_path / "xdg/dormouse/kernels/Fake_GPU_X9"
    env["XDG_CACHE_HOME"] = "relative/cache"  # the XDG spec: a relative path is ignored
    assert (
        kernel_source("Fake GPU Y8", (8, 9), env, PINS).store == tmp_path / "home/.cache/dormouse/kernels/Fake_GPU_Y8"
    )


@pytest.mark.parametrize("card", [("NVIDIA H200", (9, 0)), ("Fake GPU X9", (9, 0)), ("Fake GPU Y8", (8, 9))])
@pytest.mark.parametrize("variable", ["FLA_CONFIG_DIR", "FLA_CACHE_MODE"])
def test_flas_variables_set_by_the_user_win(tmp_path, card, variable):
    user = {"HOME": str(tmp_path), variable: "strict" if variable == "FLA_CACHE_MODE" else "/mine"}
    source = kernel_source(*card, user, PINS)
    assert (source.rule, source.read, source.store) == ("user", None, None) and "(set by the user)" in source.note
    env, hooks, borrowed = applied(source)
    assert (env, hooks, borrowed) == ({}, [], 0) and not (tmp_path / ".cache").exists()


def test_no_cuda_device_reads_and_keeps_nothing(tmp_path):
    source = kernel_source(None, None, {"HOME": str(tmp_path)}, PINS)
    assert source.rule == "none" and applied(source) == ({}, [], 0)


def test_the_header_line_and_the_ledger_on_a_card_that_borrows(tmp_path, monkeypatch):
    # Through pin_note, as the trainer's header calls it: torch says a card of capability 9.0 with no pin of its own.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200 NVL")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    for name in ("FLA_CONFIG_DIR", "FLA_CACHE_MODE", "FLA_TILELANG", "FLA_FLASH_KDA", fla_pin.DUMP_ENV):
        monkeypatch.setenv(name, "")  # recorded, so that the undo removes what pin_note sets
        monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    hooks = []
    monkeypatch.setattr(fla_pin, "atexit", SimpleNamespace(register=lambda fn, *args: hooks.append((fn, args))))
    monkeypatch.setattr(fla_pin, "_note", None)
    monkeypatch.setattr(ledger, "COUNTS", ledger.COUNTS.copy())
    ledger.COUNTS.clear()

    note = fla_pin.pin_note()
    cache = tmp_path / "dormouse/kernels/NVIDIA_H200_NVL"
    assert note.startswith("fla kernel configs: no pin for NVIDIA H200 NVL; borrowed from NVIDIA_H200 (same compute")
    assert "\n" not in note and fla_pin.pin_note() is note  # once a process
    assert ledger.counted_summary() == "1(fla.borrowed_pin:1)"
    assert hooks == [(fla_pin.store_new_choices, (cache,))]
    assert fla_pin.os.environ["FLA_CONFIG_DIR"] == str(cache)


def test_choices_the_files_did_not_make_are_appended_to_the_user_cache_once(tmp_path, monkeypatch):
    """The exit hook on a borrowed pin: a kernel the pin covers (its config found) is not written again;
    a key it lacks, timed by Triton, is added after the entries already there; a second call adds nothing."""
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "k.json").write_text(json.dumps({"kernel_name": "k", "autotune_entries": {"h64": entry([64], 32)}}))

    class AutotuneKey(tuple):  # fla's: built from the autotuner's key tuple, hashed, listed
        key_hash = staticmethod(lambda key: f"h{key[0]}")
        normalize_autotune_key = staticmethod(list)

    def lookup(kernel, key):  # fla's exact lookup in the folder it reads (read once a process, as fla does)
        entries = json.loads((cache / f"{kernel}.json").read_text())["autotune_entries"] if kernel == "k" else {}
        found = entries.get(AutotuneKey.key_hash(key))
        return found and found["config"]

    cached = {"k": json.loads((cache / "k.json").read_text())["autotune_entries"]}
    monkeypatch.setitem(
        sys.modules, "fla.ops.utils.cache", SimpleNamespace(AutotuneKey=AutotuneKey, load_cached_config=lookup)
    )
    monkeypatch.setitem(sys.modules, "triton", SimpleNamespace(__version__="3.6.0"))
    config = lambda block: SimpleNamespace(kwargs={"BT": block}, num_warps=4, num_stages=2)  # noqa: E731
    tuners = [
        ("k", SimpleNamespace(cache={(64,): config(32), (128,): config(16)})),
        ("j", SimpleNamespace(cache={(8,): config(8)})),
    ]
    monkeypatch.setattr(fla_pin, "_autotuners", lambda: iter(tuners))
    monkeypatch.setattr(fla_pin, "_stored", set())

    assert fla_pin.store_new_choices(cache) == {"k.json": 1, "j.json": 1}
    k = json.loads((cache / "k.json").read_text())
    assert list(k["autotune_entries"]) == ["h64", "h128"] and k["triton_version"] == "3.6.0"
    assert k["autotune_entries"]["h128"] == written([128], 16) and k["autotune_entries"]["h64"] == cached["k"]["h64"]
    assert json.loads((cache / "j.json").read_text())["autotune_entries"] == {"h8": written([8], 8)}
    assert fla_pin.store_new_choices(cache) == {}  # fla still reads the files as they were: already added
    assert sorted(p.name for p in cache.iterdir()) == ["j.json", "k.json"]  # no partial file left


def test_a_damaged_user_cache_file_is_named(tmp_path):
    (tmp_path / "l2norm_fwd_kernel.json").write_text("{")
    with pytest.raises(fla_pin.DormouseError, match="l2norm_fwd_kernel.json is not a file of fla kernel choices"):
        fla_pin.merge_pin(H200, tmp_path)


def test_key_classes_are_flas_fuzzy_match():
    c = fla_pin.key_class
    assert (
        c([64, 8, False, "torch.bfloat16"])
        == c([128, 4.0, False, "torch.bfloat16"])
        == c((1, 2, False, "torch.bfloat16"))
    )
    assert c([64, 8, False, "torch.bfloat16"]) != c([64, 8, True, "torch.bfloat16"])  # a bool is not a number
    assert c([64, 8, False, "torch.bfloat16"]) != c([64, 8, False, "torch.float32"])
    assert c([64, 8]) != c([64, 8, 8]) and c([1, None]) != c([1, 1])
    assert c([{"a": 1}]) == c([{"a": 2}]) != c([{"b": 1}])


def test_a_pinned_card_takes_what_its_pin_lacks_from_its_kin_and_nothing_else(tmp_path):
    kin, cache = tmp_path / "kin", tmp_path / "cache"
    kin.mkdir(), cache.mkdir()
    bf16, fp32 = [64, 8, False, "torch.bfloat16"], [64, 8, False, "torch.float32"]
    own = {"a": entry(bf16, 16)}
    stale = {"s": {**entry([1, 2, False, "torch.bfloat16"], 99), fla_pin.BORROWED_FIELD: "OLD"}}  # own class now
    (cache / "k.json").write_text(json.dumps({"kernel_name": "k", "autotune_entries": {**own, **stale}}))
    from_kin = {
        "b": entry([128, 4, False, "torch.bfloat16"], 32),  # the class of own's "a": not taken
        "c": entry(fp32, 64),
        "d": entry([64, 8, True, "torch.bfloat16"], 8),
    }
    (kin / "k.json").write_text(
        json.dumps({"kernel_name": "k", "triton_version": "3.6.0", "autotune_entries": from_kin})
    )
    (kin / "j.json").write_text(json.dumps({"kernel_name": "j", "autotune_entries": {"e": entry([7], 4)}}))

    classes = fla_pin.fill_from_kin(kin, cache)
    mark = {fla_pin.BORROWED_FIELD: "kin"}
    k = json.loads((cache / "k.json").read_text())["autotune_entries"]
    assert k == {"a": own["a"], "c": {**from_kin["c"], **mark}, "d": {**from_kin["d"], **mark}}
    assert json.loads((cache / "j.json").read_text())["autotune_entries"] == {"e": {**entry([7], 4), **mark}}
    assert classes == {
        "k": {fla_pin.key_class(fp32), fla_pin.key_class(from_kin["d"]["autotune_key"])},
        "j": {fla_pin.key_class([7])},
    }
    assert pinned_config(k, "-", [4096, 2, False, "torch.bfloat16"]) == own["a"]["config"]  # this card's own, as before
    assert pinned_config(k, "-", [32, 8, False, "torch.float32"])["kwargs"] == {"BT": 64}  # was: autotune
    before = {p.name: p.stat().st_mtime_ns for p in cache.iterdir()}
    assert fla_pin.fill_from_kin(kin, cache) == classes  # a second process: the same, nothing rewritten
    assert {p.name: p.stat().st_mtime_ns for p in cache.iterdir()} == before


def test_the_committed_pins_fill_each_others_gaps_without_moving_a_lookup(tmp_path, monkeypatch):
    """The H100's pin through its user cache, filled from the H200's: every key the H100's own entries
    answer (its pin's keys) is answered by the same entry; the fp32 kernels its runs never timed come from
    the H200's pin, marked."""
    h100 = CONFIG_ROOT / "NVIDIA_H100_80GB_HBM3"
    source = kernel_source("NVIDIA H100 80GB HBM3", (9, 0), {"HOME": str(tmp_path)})
    assert (source.rule, source.pin, source.fill) == ("pin", h100, H200)
    assert source.note.endswith(
        "; what the pin lacks comes from NVIDIA_H200's (same compute capability 9.0) [ledger: fla.borrowed_entry]"
    )
    monkeypatch.setattr(fla_pin, "_borrowed", {})
    applied(source)
    assert fla_pin._borrowed["causal_conv1d_fwd_kernel"]  # what count_borrowed looks for
    for own_file in h100.glob("*.json"):
        own = json.loads(own_file.read_text())["autotune_entries"]
        filled = json.loads((source.store / own_file.name).read_text())["autotune_entries"]
        for h, e in own.items():
            assert pinned_config(filled, h, e["autotune_key"]) == e["config"]
            assert pinned_config(filled, "-", e["autotune_key"]) == pinned_config(own, "-", e["autotune_key"])
    conv = json.loads((source.store / "causal_conv1d_fwd_kernel.json").read_text())["autotune_entries"]
    assert conv and all(e[fla_pin.BORROWED_FIELD] == "NVIDIA_H200" for e in conv.values())
    assert not (h100 / "causal_conv1d_fwd_kernel.json").exists()


def test_choices_from_a_borrowed_entry_are_counted_once_and_never_dumped(tmp_path, monkeypatch):
    borrowed_key, own = [64, "torch.float32"], [64, "torch.bfloat16"]
    found = {  # fla's fuzzy lookup: a key of an entry's class finds that entry
        fla_pin.key_class(borrowed_key): {"kwargs": {"BT": 8}, "num_warps": 4, "num_stages": 2},
        fla_pin.key_class(own): {"kwargs": {"BT": 16}, "num_warps": 4, "num_stages": 2},
    }

    class AutotuneKey(tuple):
        key_hash = staticmethod(lambda key: "h" + "-".join(map(str, key)))
        normalize_autotune_key = staticmethod(list)

    lookup = lambda kernel, key: found.get(fla_pin.key_class(key))  # noqa: E731
    monkeypatch.setitem(
        sys.modules, "fla.ops.utils.cache", SimpleNamespace(AutotuneKey=AutotuneKey, load_cached_config=lookup)
    )
    monkeypatch.setitem(sys.modules, "triton", SimpleNamespace(__version__="3.6.0"))
    config = lambda block: SimpleNamespace(kwargs={"BT": block}, num_warps=4, num_stages=2)  # noqa: E731
    tuner = SimpleNamespace(
        cache={tuple(borrowed_key): config(8), (128, "torch.float32"): config(32), tuple(own): config(16)}
    )
    monkeypatch.setattr(fla_pin, "_autotuners", lambda: iter([("k", tuner)]))
    monkeypatch.setattr(fla_pin, "_borrowed", {"k": {fla_pin.key_class(borrowed_key)}})
    monkeypatch.setattr(fla_pin, "_counted_borrowed", set())
    before = ledger.COUNTS[fla_pin.BORROWED_ENTRY]

    # (64, fp32): the borrowed entry's config ran; (128, fp32): the entry found, but Triton chose another
    # (fla.unpinned's); the bf16 key: this card's own entry.
    assert list(fla_pin.borrowed_choices()) == [("k", tuple(borrowed_key))]
    assert fla_pin.count_borrowed() == 1 and fla_pin.count_borrowed() == 0
    assert ledger.COUNTS[fla_pin.BORROWED_ENTRY] - before == 1
    fla_pin.dump_choices(tmp_path)
    dumped = json.loads((tmp_path / "k.json").read_text())["autotune_entries"]
    assert sorted(e["autotune_key"] for e in dumped.values()) == [[64, "torch.bfloat16"], [128, "torch.float32"]]
