"""Re-time fla's pinned kernel choices at the shapes of one training step (docs/performance.md, Next).

fla's autotune keys name the head and block sizes but not the batch or the sequence length, so the pin
in dormouse/model/fla_configs/ holds, per kernel, the configuration Triton found fastest at whatever
shape first ran it (mostly `small` at B 10). At B 64 the grid is 6.4x larger and another configuration
may be faster. This runs one eager training step with the named kernels autotuned again by Triton at
the step's own shapes (the pin bypassed for them only; the others stay pinned), then prints per kernel
and key every candidate's time, the pinned one's, the fastest, and how many times a step launches it.

    python benches/fla_tune_probe.py --data .gpu-data/ts-val --batch 64 --kernels chunk_kda_bwd_kernel_intra,...
        [--write-pin DIR]   # the pin there (else a copy of the committed one) with the fastest choices

A bench with FLA_CONFIG_DIR=DIR FLA_CACHE_MODE=fuzzy then runs the step on the new choices (dormouse
leaves fla's variables alone when the user sets them). Changing a pinned choice changes the kernel's
reduction order: the losses of a run change in their last bits, as any pin change does.
"""

import argparse
import collections
import json
import shutil
import tempfile
from pathlib import Path

import torch

from dormouse import config
from dormouse.model import fla_kernels
from dormouse.runs import open_corpus
from dormouse.train.trainer import Trainer


def patch_autotuners(targets: set[str], found: dict, launches: collections.Counter) -> None:
    """Make fla's CachedAutotuner skip the pin (and Triton's disk cache of timings) for `targets`, record
    each newly tuned (kernel, key)'s timings in `found`, and count every launch in `launches`."""
    from fla.ops.utils.cache import CachedAutotuner

    check, run = CachedAutotuner.should_check_fla_cache, CachedAutotuner.run

    def should_check(self, key):
        return self.kernel_name not in targets and check(self, key)

    def counted_run(self, *args, **kwargs):
        launches[self.kernel_name] += 1
        if self.kernel_name not in targets:
            return run(self, *args, **kwargs)
        self.cache_results = False  # Triton's disk cache would return an old choice without timing it
        before = set(self.cache)
        out = run(self, *args, **kwargs)
        for key in set(self.cache) - before:
            found[self.kernel_name, key] = dict(self.configs_timings)
        return out

    CachedAutotuner.should_check_fla_cache, CachedAutotuner.run = should_check, counted_run


def ms(timing) -> float:
    """Triton's bench result for one config: a float, or [median, p20, p80]."""
    return float(timing[0] if isinstance(timing, (list, tuple)) else timing)


def describe(cfg) -> str:
    entry = fla_kernels.config_entry(cfg) if not isinstance(cfg, dict) else cfg
    kw = ",".join(f"{k}={v}" for k, v in sorted(entry["kwargs"].items()))
    return f"{kw + ' ' if kw else ''}w{entry['num_warps']} s{entry['num_stages']}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--preset", default="small")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--kernels", required=True, help="comma-separated fla kernel names to re-tune")
    ap.add_argument("--write-pin", type=Path, help="write the pin with the fastest choices here")
    args = ap.parse_args()
    targets = set(args.kernels.split(","))
    overrides = {"train": {"device": "cuda", "dtype": "bf16", "batch_size": args.batch, "seq_len": args.seq_len}}
    cfg = config.resolve(config.build(args.preset, overrides))
    corpus, _ = open_corpus(args.data)
    fla_kernels.chunk_kda()  # the pin's environment set and fla imported before the patch
    found, launches = {}, collections.Counter()
    patch_autotuners(targets, found, launches)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(cfg, corpus, Path(tmp) / "run")
        trainer.train_step(0)  # the named kernels autotune here
        launches.clear()
        trainer.train_step(1)  # counted: launches of one step
    from fla.ops.utils.cache import AutotuneKey, load_cached_config

    fastest = {}
    saved = 0.0
    for (kernel, key), timings in sorted(found.items(), key=lambda kv: kv[0][0]):
        pinned = load_cached_config(kernel, AutotuneKey(key))
        pinned_ms = next((ms(t) for c, t in timings.items() if pinned and fla_kernels._same_config(c, pinned)), None)
        best = min(timings, key=lambda c: ms(timings[c]))
        fastest[kernel, key] = best
        print(f"== {kernel} key {list(key)[:8]}: {len(timings)} candidates, {launches[kernel]} launches a step")
        for c, t in sorted(timings.items(), key=lambda ct: ms(ct[1])):
            mark = " <- pinned" if pinned and fla_kernels._same_config(c, pinned) else ""
            print(f"   {ms(t) * 1e3:9.1f} us  {describe(c)}{mark}")
        if pinned_ms is None:
            print(f"   pinned {describe(pinned) if pinned else 'none'}: not among the timed candidates")
            continue
        gain = (pinned_ms - ms(timings[best])) * launches[kernel] / max(1, sum(k == kernel for k, _ in found))
        saved += gain
        best_us = ms(timings[best]) * 1e3
        print(f"   fastest {describe(best)}: {pinned_ms * 1e3:.1f} -> {best_us:.1f} us, ~{gain:.3f} ms a step")
    print(f"all re-tuned kernels: ~{saved:.2f} ms a step predicted from isolated timings")
    if args.write_pin:
        write_pin(args.write_pin, fastest)


def write_pin(folder: Path, fastest: dict) -> None:
    """Each (kernel, key) in `fastest` set to its choice in the pin at `folder` (a copy of the committed pin
    of this GPU when `folder` does not exist yet, so that probes of several kernel groups add up)."""
    from fla.ops.utils.cache import AutotuneKey

    source = fla_kernels.CONFIG_ROOT / fla_kernels.gpu_dir_name(torch.cuda.get_device_name())
    if not folder.exists():
        shutil.copytree(source, folder)
    for (kernel, key), cfg in fastest.items():
        path = folder / f"{kernel}.json"
        data = json.loads(path.read_text())
        data["autotune_entries"][AutotuneKey.key_hash(key)] = {
            "autotune_key": AutotuneKey.normalize_autotune_key(key),
            "config": fla_kernels.config_entry(cfg),
        }
        path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"pin with the fastest choices written to {folder}")


if __name__ == "__main__":
    main()
