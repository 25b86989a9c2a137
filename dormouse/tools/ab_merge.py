"""One comparison from several `dormouse ab` runs of the same two arms with different seeds.

    python -m dormouse.tools.ab_merge --out DIR job1/ab.json job2/ab.json ...

A job on a GPU machine is often limited in time, so a three-seed A/B at a long budget can run as one
seed round per job (`dormouse ab --seeds 1 --seed N`). This puts the rounds back together: the paired difference,
its interval and verdict are computed over every seed (tools/ab_stats.py, as `dormouse ab` does), and
DIR gets ab.json and ab.png. Refused unless every input is the same comparison: the same code (ab.json's
`code`, not the commit), corpus, device, step rule, steps and both arms' configs apart from the seed, with
no seed twice. Under `--equal time` each job priced its arms' steps itself, so the steps may differ
between jobs: the merged `steps` then lists each seed's, in seed order. Each input's arm-A runs are its
own (trained or reused there); nothing is trained here.
"""

import argparse
import json
import sys
from pathlib import Path

from dormouse.errors import ConfigError
from dormouse.tools.ab import ARMS, EQUAL_TIME_RULE, _differences
from dormouse.tools.ab_report import depth_means, report_lines, summarise
from dormouse.tools.bench.rows import shown_path

SAME = ("code", "fingerprint", "device", "preset")


def _comparable(config: dict, priced: bool) -> dict:
    """The arm's config less what may differ between the jobs: the seed, and the steps where priced."""
    apart = {"seed", "steps"} if priced else {"seed"}
    return {**config, "train": {k: v for k, v in config["train"].items() if k not in apart}}


def merge(results: list[tuple[Path, dict]]) -> dict:
    """The merged comparison (ab.json's layout, plus `merged_from`); ConfigError when the inputs differ."""
    (first_path, first), rest = results[0], results[1:]
    for path, result in results:
        if "code" not in result:
            raise ConfigError(f"{path} has no code fingerprint (written before ab recorded one): cannot tell its code")
    # Steps priced per job (equal time) may differ; any other rule fixes them.
    priced = first.get("step_rule", "").startswith(EQUAL_TIME_RULE)
    same = (*SAME, "step_rule") if priced else (*SAME, "steps", "step_rule")
    for path, result in rest:
        for key in same:
            if result.get(key) != first.get(key):
                raise ConfigError(f"{path}: {key} differs from {first_path} ({result.get(key)} vs {first.get(key)})")
        for arm in ARMS:
            differ = _differences(
                _comparable(first["arms"][arm]["config"], priced), _comparable(result["arms"][arm]["config"], priced)
            )
            if differ:
                raise ConfigError(
                    f"{path}: arm {arm.upper()} is another config than in {first_path} ({', '.join(differ)})"
                )
    seeds = [s for _, result in results for s in result["seeds"]]
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"a seed appears twice among the inputs ({seeds}): each seed round counts once")
    runs = {arm: sorted((r for _, res in results for r in res["runs"][arm]), key=lambda r: r["seed"]) for arm in ARMS}
    per_seed, overall = summarise(runs)
    merged_steps = first["steps"]
    if priced and any(result["steps"] != merged_steps for _, result in rest):
        each = {arm: [r["steps"] for r in runs[arm]] for arm in ARMS}
        merged_steps = {arm: s[0] if len(set(s)) == 1 else s for arm, s in each.items()}
    if all("bpb_by_depth" in r for arm in ARMS for r in runs[arm]):
        overall["bpb_by_depth"] = {arm: depth_means(runs[arm]) for arm in ARMS}
    return {
        **{key: first[key] for key in ("code", "device", "preset", "data", "fingerprint", "step_rule")},
        "steps": merged_steps,
        "commit": sorted({result["commit"] for _, result in results}),
        "torch": sorted({result["torch"] for _, result in results}),
        "seeds": sorted(seeds),
        "order": [o for _, result in results for o in result["order"]],
        "reused_a": [result["reused_a"] for _, result in results],
        "arms": first["arms"],
        "runs": runs,
        "per_seed": per_seed,
        "overall": overall,
        "merged_from": [shown_path(path) for path, _ in results],
    }


def main(argv: list[str] | None = None) -> int:
    from dormouse.plots import plot_ab

    p = argparse.ArgumentParser(prog="python -m dormouse.tools.ab_merge", description=__doc__.splitlines()[0])
    p.add_argument("inputs", nargs="+", metavar="AB_JSON", help="ab.json files of the same comparison")
    p.add_argument("--out", required=True, help="new or empty folder for the merged ab.json and ab.png")
    args = p.parse_args(argv)
    out = Path(args.out)
    try:
        if len(args.inputs) < 2:
            raise ConfigError("give two or more ab.json files: one is already a comparison")
        if out.exists() and any(out.iterdir()):
            raise ConfigError(f"--out {out} is not empty")
        results = []
        for name in args.inputs:
            try:
                results.append((Path(name), json.loads(Path(name).read_text())))
            except (OSError, json.JSONDecodeError) as e:
                raise ConfigError(f"cannot read {name}: {e}") from e
        merged = merge(results)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    (out / "ab.json").write_text(json.dumps(merged, indent=2, allow_nan=False) + "\n")
    plot_ab(merged, out / "ab.png")
    for line in report_lines(merged["per_seed"], merged["overall"]):
        print(line)
    print(f"ab_merge: {out / 'ab.json'}, {out / 'ab.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
