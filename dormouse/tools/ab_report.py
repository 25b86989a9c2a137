"""What a `dormouse ab` comparison reports: per-seed rows and the overall difference from its runs, the
lines it prints, and the history rows `--record` appends (docs/ab-protocol.md, Recording)."""

import datetime
import statistics
from pathlib import Path

from dormouse.config import Config
from dormouse.tools.ab_stats import paired_difference
from dormouse.tools.bench.device import fla_version
from dormouse.tools.bench.rows import cell, shown_path, timing_columns
from dormouse.tools.history import setting


def steps_text(steps: dict[str, int | list[int]] | int) -> str:
    """'N' when both arms train N steps, else 'A n, B m' (ab.json's `steps`: an int, or one per arm; an
    arm's is a list, one per seed, where merged jobs priced it apart: 'B 4182/4296')."""
    if isinstance(steps, int):
        return str(steps)
    text = {arm: "/".join(map(str, n)) if isinstance(n, list) else str(n) for arm, n in steps.items()}
    return text["a"] if steps["a"] == steps["b"] else f"A {text['a']}, B {text['b']}"


def depth_means(runs: list[dict]) -> dict[str, float]:
    """{"d": mean over the arm's seeds of bpb_by_depth[d]}."""
    return {d: statistics.fmean(r["bpb_by_depth"][d] for r in runs) for d in runs[0]["bpb_by_depth"]}


def _lowest_text(row: dict) -> str:
    """'; lowest eval A 2.0944@1500, B …' (comparisons written before it was kept: nothing)."""
    if "a_lowest" not in row:
        return ""
    (a_step, a_bpb), (b_step, b_bpb) = row["a_lowest"], row["b_lowest"]
    return f"; lowest eval A {a_bpb:.4f}@{a_step}, B {b_bpb:.4f}@{b_step}"


def depth_text(means: dict[str, float]) -> str:
    return " ".join(f"{d}:{bpb:.4f}" for d, bpb in means.items())


def lowest_eval(curve: list[list]) -> list:
    """[step, bpb] of a run's lowest eval: where an overfitting run was best. Reported beside the score,
    never the score (the protocol scores the final model: choosing the step by the curve would be a
    choice made on the held-out data)."""
    return list(min(curve, key=lambda point: point[1]))


def summarise(runs: dict[str, list[dict]]) -> tuple[list[dict], dict]:
    """Per-seed rows and the overall comparison from each arm's runs (in seed order)."""
    per_seed = [
        {
            "seed": a["seed"],
            "a_bpb": a["bpb"],
            "b_bpb": b["bpb"],
            "diff": b["bpb"] - a["bpb"],
            "a_ms_per_step": a["ms_per_step"],
            "b_ms_per_step": b["ms_per_step"],
            "a_lowest": lowest_eval(a["curve"]),
            "b_lowest": lowest_eval(b["curve"]),
        }
        for a, b in zip(runs["a"], runs["b"], strict=True)
    ]
    diff = paired_difference([r["bpb"] for r in runs["a"]], [r["bpb"] for r in runs["b"]])
    overall = {
        "a_bpb_mean": statistics.fmean(r["bpb"] for r in runs["a"]),
        "b_bpb_mean": statistics.fmean(r["bpb"] for r in runs["b"]),
        "diff_mean": diff.mean,
        "diff_sd": diff.sd,
        "dof": diff.n - 1,
        "t": diff.t,
        "ci95": list(diff.ci95) if diff.ci95 else None,
        # every training step of the arm, all seeds: one median, not a mean of per-seed medians
        "a_ms_per_step": statistics.median(ms for r in runs["a"] for ms in r["step_ms"]),
        "b_ms_per_step": statistics.median(ms for r in runs["b"] for ms in r["step_ms"]),
        "verdict": diff.verdict,
    }
    return per_seed, overall


def history_rows(result: dict, cfgs: dict[str, Config], out: Path, started: datetime.datetime) -> list[dict]:
    """`--record`: one history row per arm (bench's columns; docs/ab-protocol.md, Recording). The cells
    pricing matches are history.setting's of the arm's resolved config, so a recorded row prices that arm."""
    overall, steps = result["overall"], result["steps"]
    ci = overall["ci95"]
    interval = f"[{ci[0]:+.4f}, {ci[1]:+.4f}]" if ci else "[no interval]"
    rows = []
    for arm in result["arms"]:  # A, then B
        cfg, runs = cfgs[arm], result["runs"][arm]
        t = cfg.train
        flags = result["arms"][arm]["flags"]
        note = (
            f"ab {shown_path(out)} arm {arm.upper()}: {flags if flags.strip() else '(the shared config)'}; "
            f"{steps_text(steps)} steps per run; Δ(B−A) = {overall['diff_mean']:+.4f} {interval} {overall['verdict']}"
        )
        if "bpb_by_depth" in overall:
            note += f"; depth bpb {depth_text(overall['bpb_by_depth'][arm])}"
        step_s = [ms / 1000 for r in runs for ms in r["step_ms"]]  # every step of every seed, cold ones too
        row = {
            "date": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "commit": result["commit"],
            "model": "dormouse",
            **setting(cfg),  # device, preset, batch, seq_len, dtype, arms, params
            "compiled": "no",
            **timing_columns(step_s, 0, t.batch_size * t.seq_len, None, None),
            "first_step_s": "-",  # every run has its own cold first step: in the median, not a column
            "peak_mem_gib": "-",
            "torch": result["torch"],
            "fla": fla_version(),
            "log": shown_path(out / "ab.json"),
            "note": note,
            "peak_source": "-",
            "mem_source": "-",
            "kernels": "-",
            "loadavg": f"{runs[0]['loadavg'][0]:.2f}/{runs[-1]['loadavg'][1]:.2f}",
            "heldout_bpb": f"{overall[f'{arm}_bpb_mean']:.6f}",
            "seeds": str(len(runs)),
        }
        rows.append({k: cell(v) for k, v in row.items()})
    return rows


def report_lines(per_seed: list[dict], overall: dict) -> list[str]:
    lines = [
        f"seed {r['seed']}: A {r['a_bpb']:.4f} bpb, B {r['b_bpb']:.4f} bpb, B-A {r['diff']:+.4f}; "
        f"ms/step A {r['a_ms_per_step']:.4g}, B {r['b_ms_per_step']:.4g}{_lowest_text(r)}"
        for r in per_seed
    ]
    ci = overall["ci95"]
    interval = (
        f"95% CI [{ci[0]:+.4f}, {ci[1]:+.4f}] (Student t {overall['t']:.4g}, {overall['dof']} dof)"
        if ci
        else "95% CI unknown (one seed)"
    )
    lines += [
        f"overall: A {overall['a_bpb_mean']:.4f} bpb, B {overall['b_bpb_mean']:.4f} bpb (means over seeds); "
        f"B-A {overall['diff_mean']:+.4f}, {interval}",
        f"ms/step (median of every training step): A {overall['a_ms_per_step']:.4g}, B {overall['b_ms_per_step']:.4g}",
        f"verdict: {overall['verdict']}",
    ]
    if "bpb_by_depth" in overall:
        by_depth = overall["bpb_by_depth"]
        lines.append(
            "held-out bpb by loop depth (depth:bpb, means over seeds): "
            f"A {depth_text(by_depth['a'])}; B {depth_text(by_depth['b'])}"
        )
    return lines
