"""A history row: the columns every bench, `ab --record`, `train --record` and `generate --record` row
has, the cells they share, and appending a row under a TSV's header.

The history's last columns, `heldout_bpb` and `seeds`, are `-` in a bench row: `dormouse ab --record`
fills them (dormouse/tools/ab.py) through the same `append_row`. `tokens_per_s` = batch_size·seq_len /
(ms_per_step / 1000) (scored bytes; persistent memory slots are not counted as tokens).
"""

import os
import re
import statistics
from pathlib import Path

from dormouse.config import Config
from dormouse.errors import ConfigError
from dormouse.tools.bench.provenance import repo_root

COMMITTED = repo_root() / "evidence" / "history.tsv"  # the checkout's measured rows: `ab` prices from them
RECORD_FILE = "history.tsv"  # a run's (or a comparison's) own history, in its folder: where --record appends
REQUIRED_COLUMNS = (
    "date commit device model preset batch seq_len dtype compiled arms ms_per_step tokens_per_s "
    "peak_mem_gib mfu first_step_s torch fla log note"
).split()
COLUMNS = (
    *REQUIRED_COLUMNS,
    "warmup",
    "steps",
    "ms_min",
    "ms_max",
    "ms_iqr",
    "flops_per_step",
    "achieved_tflops",
    "peak_tflops",
    "peak_source",
    "mem_source",
    "kernels",
    "params",
    "loadavg",
    "heldout_bpb",
    "seeds",
)
# Columns added after rows were committed: a history whose header lacks only these gets them once, appended
# to the header, its old rows '-' there (append_row). A bench row gives them '-' (it trains nothing).
ADDED_COLUMNS = ("heldout_bpb", "seeds")
NOT_TRAINED = dict.fromkeys(ADDED_COLUMNS, "-")


def arms(cfg: Config) -> str:
    """The active arms and the resolved KDA backend: `kda(chunked)`, `attention,experts=4/top2,attn_res`, ..."""
    m = cfg.model
    out = [f"kda({m.kda_backend})" if m.mixer == "kda" else "attention"]
    if m.attention_layers:
        out.append(f"attention_layers={m.attention_layers.replace(',', '-')}")
    if m.n_experts > 1:
        # the dense dispatch runs every expert on every byte: n_experts/top_k times the sparse one's FFN FLOPs
        out.append(f"experts={m.n_experts}/top{m.experts_top_k}" + ("/dense" if m.experts_dense else ""))
    if m.attn_res:
        out.append("attn_res")
    if m.persistent_memory != "disabled":
        out.append(f"memory={m.persistent_memory}:{m.memory_slots}")
    if m.engram:  # orders joined by '-', × hash heads, @ insertion layers, +conv: engram=2-3-4x2@0+conv
        orders, layers = m.engram_orders.replace(",", "-"), m.engram_layers.replace(",", "-")
        out.append(f"engram={orders}x{m.engram_heads}@{layers}" + ("+conv" if m.engram_conv else ""))
    t = cfg.train  # the loop's arms change the cost of a step: a row of one must not price the other
    if t.rand_depth:
        out.append(
            f"rand_depth={t.rand_depth_min}-{m.depth}" + (f"/bptt{t.rand_depth_bptt}" if t.rand_depth_bptt else "")
        )
    if m.mor:
        out.append(f"mor={m.mor_capacity:g}")
    if m.dspark_weight:  # the auxiliary heads cost compute too (their FLOPs are not counted)
        out.append(f"dspark={m.dspark_k}/{m.dspark_stride}" + ("" if m.dspark_detach else "+trunk"))
    if m.jepa_weight:
        out.append(f"jepa={m.jepa_spans}x{m.jepa_span}")
    if m.dropout:  # its masks cost a random draw and a multiply per place
        out.append(f"dropout={m.dropout:g}")
    if m.drop_path:
        out.append(f"drop_path={m.drop_path:g}")
    if t.byte_noise:  # a draw per input byte
        out.append(
            f"byte_noise={t.byte_noise:g}" + ("" if t.byte_noise_source == "uniform" else f"/{t.byte_noise_source}")
        )
    if t.ema_decay:  # the average's update after each step
        out.append(f"ema={t.ema_decay:g}")
    if t.cuda_graph:  # not an arm, but a row of a replayed step must not price the eager one
        out.append("cuda_graph" if t.graph_update else "cuda_graph(eager_update)")
    return ",".join(out)


def timing_columns(
    times: list[float], warmup: int, positions: int, flops: float | None, peak: float | None
) -> dict[str, str]:
    """The row's timing columns from per-step wall times (seconds, warm-up first): median and spread of the
    timed steps in ms, positions (B·T) per second, achieved TFLOP/s and MFU against `peak`. A `flops` or
    `peak` of None (not counted, not measured: `dormouse ab --record`) leaves the cells that need it '-'."""
    timed = [x * 1000 for x in times[warmup:]]
    ms = statistics.median(timed)
    q = statistics.quantiles(timed, n=4, method="inclusive") if len(timed) > 1 else [ms, ms, ms]
    achieved = None if flops is None else flops / (ms / 1000) / 1e12
    return {
        "ms_per_step": f"{ms:.4f}",
        "tokens_per_s": f"{positions / (ms / 1000):.6g}",
        "mfu": "-" if achieved is None or peak is None else f"{achieved / peak:.4g}",
        "first_step_s": f"{times[0]:.4f}",
        "warmup": str(warmup),
        "steps": str(len(timed)),
        "ms_min": f"{min(timed):.4f}",
        "ms_max": f"{max(timed):.4f}",
        "ms_iqr": f"{q[2] - q[0]:.4f}",
        "flops_per_step": "-" if flops is None else f"{flops:.6g}",
        "achieved_tflops": "-" if achieved is None else f"{achieved:.4g}",
        "peak_tflops": "-" if peak is None else f"{peak:.4g}",
    }


def cell(value: str) -> str:
    """A TSV cell: tabs and newlines become spaces; an empty cell is '-'."""
    text = re.sub(r"[\t\r\n]+", " ", str(value)).strip()
    return text or "-"


def shown_path(path: Path) -> str:
    """The log path relative to the repository when it is inside it (as committed), else absolute."""
    path = path.resolve()
    try:
        return str(path.relative_to(repo_root()))
    except ValueError:
        return str(path)


def free_name(folder: Path, stem: str, suffix: str) -> Path:
    path, i = folder / f"{stem}{suffix}", 2
    while path.exists():
        path, i = folder / f"{stem}-{i}{suffix}", i + 1
    return path


def history_header(history: Path) -> list[str] | None:
    """The columns of an existing history (None when the file is new or empty), refusing a header this code
    cannot append under: any column it does not know, or a known one missing other than ADDED_COLUMNS."""
    history = Path(history)
    if not (history.exists() and history.stat().st_size):
        return None
    with open(history, encoding="utf-8") as f:
        header = f.readline().rstrip("\r\n").split("\t")
    missing = [c for c in COLUMNS if c not in header and c not in ADDED_COLUMNS]
    unknown = sorted(set(header) - set(COLUMNS))
    if missing or unknown or len(header) != len(set(header)):
        raise ConfigError(
            f"{history} has columns that differ from this bench's: missing {missing}, unknown {unknown}; "
            "migrate the file (add the columns with '-' in old rows) before appending"
        )
    return header


def append_row(history: Path, row: dict[str, str]) -> None:
    """Append `row` (a cell for every column of COLUMNS) under the file's header (written with COLUMNS when
    the file is new). A header with other columns is refused, never silently realigned; one that lacks
    only ADDED_COLUMNS is rewritten once first, those columns appended and '-' in every old row."""
    history = Path(history)
    if set(row) != set(COLUMNS):
        raise ValueError(f"a history row needs exactly the columns {COLUMNS}: got {sorted(row)}")
    header = history_header(history)
    lines = []
    if header is None:
        history.parent.mkdir(parents=True, exist_ok=True)
        header = list(COLUMNS)
        lines = ["\t".join(header)]
    elif len(header) < len(COLUMNS):
        added = [c for c in COLUMNS if c not in header]
        old = history.read_text(encoding="utf-8").splitlines()
        rows = [line + "\t-" * len(added) for line in old[1:] if line]
        header += added
        tmp = history.with_name(history.name + ".migrating")
        tmp.write_text("\n".join(["\t".join(header), *rows]) + "\n", encoding="utf-8")
        os.replace(tmp, history)  # one rename: a reader sees the old file or the migrated one
    lines.append("\t".join(row[c] for c in header))
    with open(history, "a", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
