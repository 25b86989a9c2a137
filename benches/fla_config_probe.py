"""Time fla kernel configurations outside fla's own autotune lists, inside a real `dormouse bench` step.

    python benches/fla_config_probe.py --kernels chunk_kda_bwd_kernel_wy_dqkg_fused --kwargs '{"BK": 64, "BV": 64}' \
        --warps 4,8 --stages 2,3,4 --out $OUT/probe --apply dormouse/ops/fla/configs/NVIDIA_H200 \
        -- --preset small --batch-size 64 --seq-len 512 --dtype bf16 --cuda-graph --no-precompile ...

fla leaves some configurations out of a kernel's list (on Hopper, num_warps 8 for several KDA kernels).
For each named kernel the candidates are its own list and more warp and stage counts (`candidates`);
the pin's lookup is turned off for that kernel only, so the bench's first step has Triton time every
candidate on the step's own arguments (the other kernels keep reading the pin), and the timed steps
run the fastest. Writes, under --out:
- progress.jsonl: each config as it is timed, then its ms (a config that kills the process is last);
- <kernel>.json: each candidate's median ms, the config the card's pin holds for that key and its ms,
  and the choice;
- choices/<kernel>.json: the choices in fla's file format.
With `--apply dormouse/ops/fla/configs/<card>`, each choice whose slowest timing round beats the pinned
config's fastest (`beats`), or whose key the pin lacks, goes in that pin (merge_fla_pin.py `replace`),
and the probe prints what it put there.
"""

import argparse
import json
import sys
from pathlib import Path


def candidates(configs, warps, stages, kwargs=None):
    """The kernel's own `configs`, then each of its block-size kwargs sets (or only those in `kwargs`)
    with every count of `warps` and `stages` not already listed. fla's lists leave some pairs out on
    purpose (on Hopper: BK 32 with 4 warps in chunk_kda_bwd_kernel_wy_dqkg_fused), so a kwargs set keeps
    to the warp counts fla lists for it, plus counts fla lists for none."""
    import triton

    def block(kw: dict) -> str:
        return json.dumps(kw, sort_keys=True)

    listed: dict[str, set[int]] = {}
    for c in configs:
        listed.setdefault(block(c.kwargs), set()).add(c.num_warps)
    known = {c.num_warps for c in configs}
    seen = {(block(c.kwargs), c.num_warps, c.num_stages) for c in configs}
    out = list(configs)
    for kw in [block(k) for k in kwargs] if kwargs else sorted(listed):
        for w in warps:
            if w in known and w not in listed.get(kw, known):
                continue
            for s in stages:
                if (kw, w, s) not in seen:
                    seen.add((kw, w, s))
                    out.append(triton.Config(json.loads(kw), num_warps=w, num_stages=s))
    return out


def beats(chosen_ms: list[float] | None, pinned_ms: list[float] | None) -> bool:
    """Whether a probed config's timing rounds all beat the pinned config's: its slowest against the
    pinned one's fastest, so the rounds' spread cannot make a winner."""
    return bool(chosen_ms) and bool(pinned_ms) and max(chosen_ms) < min(pinned_ms)


def won_entries(choices: dict, keys: list[dict]) -> dict:
    """The entries of `choices` (fla's file format) to put in the pin, from the probe's report `keys`
    (autotune_key, chosen, chosen_ms, pinned, pinned_ms): where the pin has no config for the key, or
    another one that the chosen config `beats`."""
    from dormouse.ops.fla.pin import same_config

    won = [
        k["autotune_key"]
        for k in keys
        if k["pinned"] is None or (not same_config(k["chosen"], k["pinned"]) and beats(k["chosen_ms"], k["pinned_ms"]))
    ]
    return {h: e for h, e in choices["autotune_entries"].items() if e["autotune_key"] in won}


def logged(bench, kernel: str, path: Path):
    """`bench` (an autotuner's timing of one config) writing each config to `path` before it runs and its
    time after: a config that kills the process (an illegal memory access) is the last line left open."""
    from dormouse.ops.fla.pin import config_entry

    def timed(*args, config, **kwargs):
        with open(path, "a") as f:
            f.write(json.dumps({"kernel": kernel, "config": config_entry(config)}) + "\n")
        ms = bench(*args, config=config, **kwargs)
        with open(path, "a") as f:
            f.write(json.dumps({"kernel": kernel, "ms": ms}) + "\n")
        return ms

    return timed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernels", required=True, help="fla kernel names, comma-separated")
    parser.add_argument("--warps", default="2,4,8")
    parser.add_argument("--stages", default="1,2,3,4")
    parser.add_argument(
        "--kwargs", action="append", type=json.loads, help='a block-size set to try, as JSON: {"BK": 64, "BV": 64}'
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--apply", type=Path, metavar="PIN_DIR", help="put the winners in this pin folder")
    parser.add_argument("bench", nargs=argparse.REMAINDER, help="-- then `dormouse bench` flags")
    args = parser.parse_args()
    bench_argv = args.bench[1:] if args.bench[:1] == ["--"] else args.bench

    from dormouse.ops.fla import kernels as fla_kernels
    from dormouse.ops.fla import pin

    pin.pin_note()
    fla_kernels.chunk_kda()  # imports fla's KDA modules, so their autotuners exist
    from fla.ops.utils.cache import AutotuneKey, load_cached_config

    names = args.kernels.split(",")
    tuners = {name: tuner for name, tuner in pin._autotuners() if name in names}
    if missing := sorted(set(names) - set(tuners)):
        sys.exit(f"no fla autotuner named {', '.join(missing)}")
    warps, stages = [int(x) for x in args.warps.split(",")], [int(x) for x in args.stages.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    for name, tuner in tuners.items():
        tuner.configs = candidates(tuner.configs, warps, stages, args.kwargs)
        tuner.maybe_load_cached_config = lambda **_: None  # this kernel's choice is timed, not read
        tuner._bench = logged(tuner._bench, name, args.out / "progress.jsonl")

    from dormouse.cli import main as dormouse_main

    status = dormouse_main(["bench", *bench_argv])
    pin.dump_choices(args.out / "choices", kernels=set(names))
    reports = {}
    for name, tuner in tuners.items():
        timings = getattr(tuner, "configs_timings", None) or {}
        keys = []
        for key, chosen in tuner.cache.items():
            pinned = load_cached_config(name, AutotuneKey(key))
            matches = (ms for c, ms in timings.items() if pin.same_config(pin.config_entry(c), pinned))
            pinned_ms = next(matches, None) if pinned is not None else None
            keys.append(
                {
                    "autotune_key": AutotuneKey.normalize_autotune_key(key),
                    "chosen": pin.config_entry(chosen),
                    "chosen_ms": timings.get(chosen),
                    "pinned": pinned,
                    "pinned_ms": pinned_ms,
                }
            )
        rows = sorted(
            ({"config": pin.config_entry(c), "ms": ms} for c, ms in timings.items()), key=lambda r: r["ms"][0]
        )
        (args.out / f"{name}.json").write_text(json.dumps({"kernel": name, "keys": keys, "timings": rows}, indent=1))
        for k in keys:
            print(f"{name}: chosen {k['chosen']} {k['chosen_ms']} ms; pinned {k['pinned']} {k['pinned_ms']} ms")
        reports[name] = keys
    if args.apply:
        apply(args.out, reports, args.apply)
    return status


def apply(out: Path, reports: dict[str, list[dict]], pin_dir: Path) -> None:
    """Write each kernel's winning choices (`won_entries`) under out/won and replace them into `pin_dir`."""
    from merge_fla_pin import replace

    won = out / "won"
    won.mkdir(exist_ok=True)
    for name, keys in reports.items():
        path = out / "choices" / f"{name}.json"
        choices = json.loads(path.read_text()) if path.exists() else {"autotune_entries": {}}
        if entries := won_entries(choices, keys):
            (won / path.name).write_text(json.dumps({**choices, "autotune_entries": entries}, indent=1))
    changed = replace(won, pin_dir)
    for file, n in changed.items():
        print(f"{pin_dir / file}: {n} probed config(s) put in the pin")
    if not changed:
        print(f"{pin_dir}: unchanged, no probed config beats the pinned one")


if __name__ == "__main__":
    raise SystemExit(main())
