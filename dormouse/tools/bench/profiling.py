"""`dormouse bench --profile N`: torch.profiler's tables of N more steps, and on CUDA where the device
sat idle and what the host ran meanwhile, as lines for the bench's log."""

import bisect
import collections
import itertools
import time

import torch

from dormouse.tools.bench.device import sync

PROFILE_ROWS = 40


def profile_steps(step, first_step: int, n: int, device: torch.device) -> str:
    """torch.profiler's tables of `n` further training steps `step(s)` (after the timed ones, which it never
    slows), the ops sorted by their own device time (CPU time on the CPU): one per op, then one per op and
    input shapes, which tells which call of a generic kernel (a cast, a strided copy) costs what. Kernels
    replayed from a CUDA graph have no op to group under: profile the eager step for the second table.
    On CUDA three first lines say how much of the steps' wall time the device was busy (`busy_line`),
    what the host ran while it idled (`idle_line`) and where its longest waits were (`gaps_line`)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities, record_shapes=True) as prof:
        started = time.perf_counter()
        for s in range(first_step, first_step + n):
            step(s)
        sync(device)
        wall_us = (time.perf_counter() - started) * 1e6
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    by_op = prof.key_averages().table(sort_by=sort, row_limit=PROFILE_ROWS)
    by_shape = prof.key_averages(group_by_input_shape=True).table(sort_by=sort, row_limit=PROFILE_ROWS)
    tables = f"{by_op}\n---- the same steps by op and input shapes\n{by_shape}"
    if device.type != "cuda":
        return tables
    # Kernels, copies and memsets; not the user annotations (an optimizer's range) that span kernels.
    device = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    annotation = {id(e) for e in device if getattr(e, "is_user_annotation", False)}
    kernels = [(e.name, e.time_range.start, e.time_range.end) for e in device if id(e) not in annotation]
    phases = [(e.name, e.time_range.start, e.time_range.end) for e in device if id(e) in annotation]
    spans = [(start, end) for _, start, end in kernels]
    host = [(e.name, e.time_range.start, e.time_range.end) for e in prof.events() if e.device_type == DeviceType.CPU]
    lines = [busy_line(spans, n, wall_us), idle_line(spans, host, n), gaps_line(spans, host)]
    return "\n".join([*lines, *phase_lines(kernels, phases, n), tables])


def phase_lines(
    kernels: list[tuple[str, float, float]], phases: list[tuple[str, float, float]], steps: int, top: int = 12
) -> list[str]:
    """The kernels' device time by the trainer's phase (the named ranges `dormouse.*` as the device ran
    them), ms per step, and for each phase its `top` kernels by summed time: what a phase's time is
    made of (the update's optimizers, say), which the whole step's tables mix with the replay's. A
    kernel belongs to the innermost phase its start falls in; kernels in none go under "(no phase)"."""
    by_phase: dict[str, dict[str, list[float]]] = collections.defaultdict(lambda: collections.defaultdict(list))
    for name, start, end in kernels:
        inside = [(p_end - p_start, phase) for phase, p_start, p_end in phases if p_start <= start < p_end]
        by_phase[min(inside)[1] if inside else "(no phase)"][name].append(end - start)
    per = 1e-3 / steps
    total = {phase: sum(map(sum, names.values())) for phase, names in by_phase.items()}
    order = sorted(total, key=total.get, reverse=True)
    lines = ["device time by phase (ms per step): " + ", ".join(f"{p} {total[p] * per:.2f}" for p in order)]
    for phase in order:
        names = sorted(by_phase[phase].items(), key=lambda item: -sum(item[1]))[:top]
        parts = [f"{name[:60]} {sum(t) * per:.3f} ({len(t) / steps:g}x)" for name, t in names]
        lines.append(f"  {phase}: " + "; ".join(parts))
    return lines


def _busy_intervals(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of `(start, end)` spans as sorted disjoint intervals."""
    merged: list[tuple[float, float]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def busy_line(spans: list[tuple[float, float]], steps: int, wall_us: float) -> str:
    """Per step: the time the device ran anything (the union of its kernels' `(start, end)` spans, µs),
    their summed durations (more than the union where kernels overlap) and the wall time, in ms. Wall time
    minus busy time is what the device sat idle: launches, host work, syncs."""
    union = sum(end - start for start, end in _busy_intervals(spans))
    summed = sum(end - start for start, end in spans)
    per = 1e-3 / steps
    return (
        f"device busy {union * per:.2f} ms per step (union of its kernels; {summed * per:.2f} ms summed) "
        f"of {wall_us * per:.2f} ms wall per step under the profiler"
    )


def idle_line(
    spans: list[tuple[float, float]],
    host: list[tuple[str, float, float]],
    steps: int,
    top: int = 8,
    min_gap_us: float = 10.0,
) -> str:
    """Per step, in ms: the device's idle time between its first and last kernel, in gaps of at least
    `min_gap_us` between busy intervals, and the `top` host events `(name, start, end)` (µs) by their
    overlap with those gaps: what the host ran while the device waited. Nested events (an op and the ops
    it calls, a launch inside an op) each count their own overlap."""
    gaps = _gaps(_busy_intervals(spans), min_gap_us)
    overlap: dict[str, float] = collections.defaultdict(float)
    for per_gap in _overlaps(gaps, host):
        for name, t in per_gap.items():
            overlap[name] += t
    per = 1e-3 / steps
    idle = sum(b - a for a, b in gaps) * per
    during = ", ".join(f"{name} {t * per:.2f}" for t, name in _most(overlap, top)) or "none recorded"
    return (
        f"device idle {idle:.2f} ms per step in {len(gaps) / steps:.0f} gaps of >= {min_gap_us:g} us; host events "
        f"overlapping them (ms per step): {during}"
    )


def _gaps(busy: list[tuple[float, float]], min_gap_us: float) -> list[tuple[float, float]]:
    return [(a[1], b[0]) for a, b in itertools.pairwise(busy) if b[0] - a[1] >= min_gap_us]


def _overlaps(gaps: list[tuple[float, float]], host: list[tuple[str, float, float]]) -> list[dict[str, float]]:
    """Per gap, each host event name's overlap with it (µs)."""
    starts = [g[0] for g in gaps]
    per_gap: list[dict[str, float]] = [collections.defaultdict(float) for _ in gaps]
    for name, start, end in host:
        i = max(bisect.bisect_right(starts, start) - 1, 0)
        while i < len(gaps) and gaps[i][0] < end:
            per_gap[i][name] += max(0.0, min(end, gaps[i][1]) - max(start, gaps[i][0]))
            i += 1
    return per_gap


def _most(overlap: dict[str, float], top: int) -> list[tuple[float, str]]:
    """The `top` host events by overlap, as (µs, name), largest first."""
    return sorted(((t, n) for n, t in overlap.items() if t > 0), reverse=True)[:top]


def gaps_line(spans: list[tuple[float, float]], host: list[tuple[str, float, float]], top: int = 12) -> str:
    """The `top` longest idle gaps of the profiled steps, in time order, each with its length and the
    five host events overlapping it most (µs; the trainer's phases are named ranges, `dormouse.*`):
    where in the step the device waits, and on what."""
    gaps = _gaps(_busy_intervals(spans), 0.0)
    per_gap = _overlaps(gaps, host)
    longest = sorted(sorted(range(len(gaps)), key=lambda i: gaps[i][0] - gaps[i][1])[:top])
    parts = []
    for i in longest:
        names = ", ".join(f"{n} {t:.0f}" for t, n in _most(per_gap[i], 5))
        parts.append(f"{gaps[i][1] - gaps[i][0]:.0f} [{names}]")
    return f"longest idle gaps in time order (us, host events overlapping most): {'; '.join(parts) or 'none'}"
