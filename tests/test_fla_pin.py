"""The kernel pin's bookkeeping on the CPU: fla and Triton exist only on the GPU machine, so stand-ins
hold an autotuner's choices and answer fla's config lookup the way fla does."""

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from dormouse.ops.fla import kernels as fla_kernels
from dormouse.ops.fla import pin as fla_pin

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benches"))
from fla_config_probe import apply as apply_probe  # noqa: E402
from fla_config_probe import beats, candidates, logged, won_entries  # noqa: E402
from merge_fla_pin import merge, replace  # noqa: E402


def config(block: int) -> SimpleNamespace:
    return SimpleNamespace(kwargs={"BT": block}, num_warps=4, num_stages=2)


def entry(block: int) -> dict:
    return {"kwargs": {"BT": block}, "num_warps": 4, "num_stages": 2, "num_ctas": 1}


def test_dump_names_each_unpinned_choice_with_what_the_pin_had(tmp_path, monkeypatch):
    pin = {("k", (64,)): entry(32)}  # the pin has key (64,), with another config than the kernel ran

    class AutotuneKey(tuple):  # fla's key: built from the autotuner's key tuple, hashed, listed
        key_hash = staticmethod(lambda key: f"h{key[0]}")
        normalize_autotune_key = staticmethod(list)

    cache = SimpleNamespace(AutotuneKey=AutotuneKey, load_cached_config=lambda kernel, key: pin.get((kernel, key)))
    monkeypatch.setitem(sys.modules, "fla.ops.utils.cache", cache)
    monkeypatch.setitem(sys.modules, "triton", SimpleNamespace(__version__="3.6.0"))
    tuner = SimpleNamespace(cache={(64,): config(64), (128,): config(16)})
    monkeypatch.setattr(fla_pin, "_autotuners", lambda: iter([("k", tuner)]))
    monkeypatch.setattr(fla_pin, "_counted", {})

    assert fla_pin.count_unpinned() == 2  # 64: not the pin's config; 128: no entry
    fla_pin.dump_choices(tmp_path)

    unpinned = json.loads((tmp_path / fla_pin.UNPINNED_FILE).read_text())
    assert [(u["autotune_key"], u["chosen"]["kwargs"], u["pinned"]) for u in unpinned] == [
        ([128], {"BT": 16}, None),
        ([64], {"BT": 64}, entry(32)),
    ]
    chosen = json.loads((tmp_path / "k.json").read_text())["autotune_entries"]
    assert {h: e["config"]["kwargs"]["BT"] for h, e in chosen.items()} == {"h64": 64, "h128": 16}
    # The merge reads kernel files only: unpinned.json is a report, not a kernel named "unpinned".
    (tmp_path / "pin").mkdir()
    assert merge(tmp_path, tmp_path / "pin") == {"k.json": 2}
    # Named kernels only (the config probe's): another kernel's choices and the report are not written.
    assert fla_pin.dump_choices(tmp_path / "only", kernels={"other"}) == []
    assert fla_pin.dump_choices(tmp_path / "only", kernels={"k"}) == [str(tmp_path / "only" / "k.json")]


def test_triton_autotuners_in_fla_become_pin_reading_ones(monkeypatch):
    class Autotuner:  # Triton's
        def __init__(self, name):
            self.base_fn, self.cache = SimpleNamespace(__name__=name), {}

    class CachedAutotuner(Autotuner):  # fla's: Triton's plus the pin lookup
        pass

    plain, cached = Autotuner("layer_norm_fwd_kernel"), CachedAutotuner("chunk_kda_fwd")
    cached.kernel_name = "chunk_kda_fwd"
    wrapped = SimpleNamespace(fn=Autotuner("layer_norm_bwd_kernel"))  # @triton.heuristics over @autotune
    monkeypatch.setitem(sys.modules, "triton", SimpleNamespace())
    monkeypatch.setitem(sys.modules, "triton.runtime.autotuner", SimpleNamespace(Autotuner=Autotuner))
    monkeypatch.setitem(sys.modules, "fla.ops.utils.cache", SimpleNamespace(CachedAutotuner=CachedAutotuner))
    module = SimpleNamespace(a=plain, b=cached, c=wrapped, d=3)
    monkeypatch.setitem(sys.modules, "fla.modules.norm.layernorm", module)

    assert fla_pin.pin_plain_autotuners() == 2
    assert [type(t) for t in (plain, cached, wrapped.fn)] == [CachedAutotuner] * 3
    assert (plain.kernel_name, wrapped.fn.kernel_name) == ("layer_norm_fwd_kernel", "layer_norm_bwd_kernel")
    assert fla_pin.pin_plain_autotuners() == 0  # once is enough


def test_no_gpu_test_or_bench_imports_fla_before_the_pin_is_set():
    # fla reads FLA_CACHE_MODE and FLA_CONFIG_DIR once, when first imported: a test that imported it
    # itself would run with the pin off (every kernel autotuned by timing, minutes per kernel). An
    # import inside a function runs after the module's fla_kernels call has set the pin.
    root = Path(__file__).resolve().parents[1]
    offenders = [
        str(path.relative_to(root))
        for path in [*root.glob("tests/gpu/*.py"), *root.glob("benches/*.py")]
        for line in path.read_text().splitlines()
        if line.startswith(("import fla", "from fla")) or 'importorskip("fla' in line  # module level
    ]
    assert offenders == [], "import fla through dormouse.ops.fla.kernels: " + ", ".join(offenders)


def test_merge_adds_only_choices_the_pin_did_not_make_and_appends_them(tmp_path):
    def file(entries: dict) -> dict:
        return {"kernel_name": "k", "triton_version": "3.6.0", "autotune_entries": entries}

    def at(key: list, block: int) -> dict:
        return {"autotune_key": key, "config": entry(block)}

    (tmp_path / "pin").mkdir()
    (tmp_path / "dump").mkdir()
    pinned = {"p64": at([64, True, "bf16"], 32), "p8": at([8, "fp32"], 16)}
    (tmp_path / "pin" / "k.json").write_text(json.dumps(file(pinned)))
    dumped = {
        "p64": at([64, True, "bf16"], 128),  # pinned already: never re-decided
        "d128": at([128, True, "bf16"], 32),  # the fuzzy match's config: the pin made it, not added
        "d256": at([256, True, "bf16"], 64),  # the fuzzy match's config refused, Triton timed another
        "d9": at([9, False, "bf16"], 16),  # no entry matches (a bool differs): Triton timed it
    }
    (tmp_path / "dump" / "k.json").write_text(json.dumps(file(dumped)))
    assert merge(tmp_path / "dump", tmp_path / "pin") == {"k.json": 2}
    merged = json.loads((tmp_path / "pin" / "k.json").read_text())["autotune_entries"]
    assert list(merged) == ["p64", "p8", "d256", "d9"]  # appended: earlier fuzzy matches stay first
    assert merged["p64"]["config"] == entry(32)


def test_the_probe_logs_each_config_before_it_runs_so_a_crash_names_it(tmp_path):
    def bench(*args, config, **kwargs):
        if config.num_warps == 8:
            raise RuntimeError("illegal memory access")
        return [0.5]

    timed, path = logged(bench, "k", tmp_path / "progress.jsonl"), tmp_path / "progress.jsonl"
    assert timed(config=SimpleNamespace(kwargs={"BK": 64}, num_warps=4, num_stages=2)) == [0.5]
    with pytest.raises(RuntimeError):
        timed(config=SimpleNamespace(kwargs={"BK": 64}, num_warps=8, num_stages=2))
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [(x.get("config", {}).get("num_warps"), x.get("ms")) for x in lines] == [(4, None), (None, [0.5]), (8, None)]


def test_replace_re_decides_the_entry_the_lookup_takes_where_it_stands(tmp_path):
    def at(key: list, block: int) -> dict:
        return {"autotune_key": key, "config": entry(block)}

    for folder in ("pin", "probe"):
        (tmp_path / folder).mkdir()
    pinned = {"p64": at([64, True, "bf16"], 32), "p8": at([8, "fp32"], 16)}
    (tmp_path / "pin" / "k.json").write_text(json.dumps({"kernel_name": "k", "autotune_entries": pinned}))
    probed = {
        "d128": at([128, True, "bf16"], 64),  # fuzzy-matches p64: p64's config is replaced, p64's key kept
        "d9": at([9, False, "bf16"], 16),  # nothing matches: appended
    }
    (tmp_path / "probe" / "k.json").write_text(json.dumps({"kernel_name": "k", "autotune_entries": probed}))
    assert replace(tmp_path / "probe", tmp_path / "pin") == {"k.json": 2}
    got = json.loads((tmp_path / "pin" / "k.json").read_text())["autotune_entries"]
    assert list(got) == ["p64", "p8", "d9"]
    assert (got["p64"], got["p8"], got["d9"]) == (at([64, True, "bf16"], 64), pinned["p8"], probed["d9"])


def test_kernels_import_without_running_the_packages_re_export_inits(tmp_path, monkeypatch):
    """fla's package __init__s import every layer, model and op (most of a warm start's seconds on the
    H200); the shells skip them, the submodules import as usual, and completing runs them after all."""
    pkg = tmp_path / "fakefla"
    (pkg / "ops" / "kda").mkdir(parents=True)
    (tmp_path / "fakefla_log.py").write_text("inits = []\n")  # outside the package: records each __init__
    (pkg / "__init__.py").write_text(
        "import fakefla_log\nfakefla_log.inits.append('fakefla')\nfrom fakefla.ops import OPS\n"
    )
    (pkg / "ops" / "__init__.py").write_text("import fakefla_log\nfakefla_log.inits.append('ops')\nOPS = ['all ops']\n")
    (pkg / "ops" / "kda" / "__init__.py").write_text(
        "from fakefla import __version__\nchunk_kda = 'kda ' + __version__\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(fla_kernels.importlib.metadata, "version", lambda dist: {"fakefla-core": "9.9"}[dist])
    names = ("fakefla", "fakefla.ops")
    try:
        fla_kernels.shell_packages(names, version_of={"fakefla": "fakefla-core"})
        import fakefla.ops.kda
        import fakefla_log

        assert fakefla.ops.kda.chunk_kda == "kda 9.9" and fakefla_log.inits == []
        fla_kernels.complete_packages(names)  # fakefla's __init__ imports a name of fakefla.ops's: that runs first
        fla_kernels.complete_packages(names)  # once only
        assert fakefla_log.inits == ["ops", "fakefla"] and fakefla.OPS == ["all ops"]
        assert sys.modules["fakefla.ops.kda"] is fakefla.ops.kda  # the submodule imported before is kept
    finally:
        for name in [n for n in sys.modules if n.startswith("fakefla")]:
            del sys.modules[name]


def test_a_missing_package_or_distribution_is_an_import_error(tmp_path, monkeypatch):
    (tmp_path / "fakefla2").mkdir()
    (tmp_path / "fakefla2" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ImportError, match="No package named 'no_such_fla_pkg'"):
        fla_kernels.shell_packages(("no_such_fla_pkg",), version_of={})
    with pytest.raises(ImportError, match="'no-such-dist' is not installed"):
        fla_kernels.shell_packages(("fakefla2",), version_of={"fakefla2": "no-such-dist"})
    assert "fakefla2" not in sys.modules  # nothing half-registered


def test_flas_optional_backends_stay_off_unless_the_user_turns_one_on(monkeypatch):
    # fla would dispatch its KDA kernels to TileLang or FlashKDA whenever those packages import.
    monkeypatch.setenv("FLA_TILELANG", "")  # recorded, so that the undo removes what the call sets
    monkeypatch.delenv("FLA_TILELANG")
    monkeypatch.setenv("FLA_FLASH_KDA", "1")
    note = fla_pin._backend_environment()
    assert os.environ["FLA_TILELANG"] == "0" and os.environ["FLA_FLASH_KDA"] == "1"
    assert note == "fla backends: FLA_TILELANG=0, FLA_FLASH_KDA=1 (set by the user)"


def test_the_probe_adds_warp_and_stage_counts_but_no_pair_fla_left_out():
    triton = pytest.importorskip("triton")
    # fla's list: BK 32 only with 2 warps, BK 64 with 2 and 4 (as chunk_kda_bwd_kernel_wy_dqkg_fused on Hopper)
    own = [triton.Config({"BK": bk}, num_warps=w, num_stages=2) for bk, w in ((32, 2), (64, 2), (64, 4))]

    def shown(configs):
        return [(c.kwargs["BK"], c.num_warps, c.num_stages) for c in configs]

    got = shown(candidates(own, warps=[4, 8], stages=[2, 3]))
    assert got == [(32, 2, 2), (64, 2, 2), (64, 4, 2), (32, 8, 2), (32, 8, 3), (64, 4, 3), (64, 8, 2), (64, 8, 3)]
    assert shown(candidates(own, warps=[8], stages=[3], kwargs=[{"BK": 64}]))[3:] == [(64, 8, 3)]


def test_the_probe_applies_only_a_config_whose_slowest_round_beats_the_pins_fastest(tmp_path):
    def cfg(warps: int) -> dict:
        return {"kwargs": {"BK": 64}, "num_warps": warps, "num_stages": 2, "num_ctas": 1}

    def report(key: int, chosen: dict, chosen_ms, pinned, pinned_ms) -> dict:
        dtype = "fp32" if pinned is None else "bf16"  # fla's lookup matches numbers fuzzily, dtypes exactly
        return {
            "autotune_key": [key, dtype],
            "chosen": chosen,
            "chosen_ms": chosen_ms,
            "pinned": pinned,
            "pinned_ms": pinned_ms,
        }

    keys = [
        report(1, cfg(8), [0.40, 0.39, 0.41], cfg(4), [0.54, 0.53, 0.55]),  # every round faster: applied
        report(2, cfg(8), [0.40, 0.39, 0.56], cfg(4), [0.54, 0.53, 0.55]),  # one round slower: kept
        report(3, cfg(4), [0.54], cfg(4), [0.54]),  # the pinned config won: nothing to change
        report(4, cfg(8), [0.40], None, None),  # a key the pin lacks: added
    ]
    choices = {f"h{k['autotune_key'][0]}": {"autotune_key": k["autotune_key"], "config": k["chosen"]} for k in keys}
    (tmp_path / "choices").mkdir()
    (tmp_path / "choices" / "k.json").write_text(json.dumps({"kernel_name": "k", "autotune_entries": choices}))
    pin_dir = tmp_path / "pin"
    pin_dir.mkdir()
    pinned = {f"h{n}": {"autotune_key": [n, "bf16"], "config": cfg(4)} for n in (1, 2, 3)}
    (pin_dir / "k.json").write_text(json.dumps({"kernel_name": "k", "autotune_entries": pinned}))

    assert beats([0.40, 0.41], [0.42]) and not beats([0.40, 0.43], [0.42]) and not beats([0.4], None)
    assert sorted(won_entries({"autotune_entries": choices}, keys)) == ["h1", "h4"]
    apply_probe(tmp_path, {"k": keys}, pin_dir)
    got = {
        h: e["config"]["num_warps"] for h, e in json.loads((pin_dir / "k.json").read_text())["autotune_entries"].items()
    }
    assert got == {"h1": 8, "h2": 4, "h3": 4, "h4": 8}
