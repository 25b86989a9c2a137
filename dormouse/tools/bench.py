"""`dormouse bench`: time the trainer's own step; one row in benches/history.tsv, the full log in benches/logs/.

A step is `Trainer.train_step`: batch (seed, step) from the sampler, forward, backward, grad clip and
the routed optimizers' step, exactly what `dormouse train` runs (there is no second training step).
The model trains on the default corpus (or `--data`) in a temporary run directory.

Baselines (dormouse/tools/baselines.py): `--model gpt` (row model `gpt-sdpa`, a plain GPT with torch's
SDPA) or `--model fla-kda` (fla's KDAForCausalLM; CUDA and fla only, refused elsewhere) times that
model instead, at the config's sizes with block_layers · depth real layers, on random bytes;
`--baselines` times each baseline the device can run after the dormouse row, in the same process
and the same way (the others are skipped with the reason printed), one row and one log each.

The history's last columns, `heldout_bpb` and `seeds`, are `-` in a bench row: `dormouse ab --record`
fills them (dormouse/tools/ab.py) through the same `append_row`.

`--warmup W` steps run first (the first of them is `first_step_s`, the cold start with any
compilation or autotuning); then `--steps N` steps are timed one by one, with torch.cuda.synchronize() around each
on CUDA and perf_counter on both. `ms_per_step` is their median, `ms_min`/`ms_max` and `ms_iqr` their
spread, `tokens_per_s` = batch_size·seq_len / (ms_per_step / 1000) (scored bytes; persistent memory
slots are not counted as tokens).

FLOPs per step (`flops_per_step`), counted from the model, not measured:

    6 · B · S · N_block  +  6 · B · T · N_byte  +  3 · B · S · depth · block_layers · M

B = batch_size, T = seq_len, S = T + memory_slots (positions through the looped block). N_block =
depth · Σ weights of the nn.Linear modules of the looped block (a MoE expert's weights count
top_k / n_experts of the time, all of it under `experts_dense`; the router always). N_byte =
256 · d_model (the LM head, tied or not) plus the weights of every nn.Linear outside the block (the
Engram memory's W_K, W_V: it runs once, on the byte positions only); those are named in the log.
6 = 2 FLOPs per multiply-add × (forward + backward at twice the forward). M is the mixer's own forward
FLOPs per position per layer application, ×3 for forward + backward:

    kda:        H · (6·K·V + 4·C·K + 2·C·V + C·(K + V))      K = V = head_dim, C = kda_chunk_size
    attention:  H · head_dim · 2 · (S + 1)                  causal: a query sees (S + 1) / 2 keys on average

The KDA count is the chunked (WY/UT) form's matmuls per position: the two intra-chunk score matrices
(2CK each), the triangular solve (C(K+V)), the three state products (2KV each) and the intra-chunk
output (2CV). fla runs the same algorithm; the recurrent backend is counted the same, so MFU compares
backends on one scale. Not counted: lookups (embedding, Engram tables), norms, activations, gates,
the short conv, AttnRes mixes, the loss and the optimizers.

A baseline's FLOPs are the same formula with its own weights: every layer has weights of its own and
there are no memory slots, so

    6 · B · T · (N_layers + 256 · d_model)  +  3 · B · T · L · M        L = block_layers · depth

N_layers = the weights of every nn.Linear but the head; M the attention formula at S = T (gpt) or the
KDA formula with C = 64, the chunk length fla's KDA layer runs (fla-kda).

MFU = flops_per_step / (ms_per_step / 1000) / peak. The peak (`peak_tflops`, `peak_source`):

- NVIDIA H200, bf16: 680 TFLOP/s, a dense bf16 matmul measured at 8192³ on this workplace's card
  (as the bench issue states it: its log is not in benches/ yet; the datasheet's 989 dense is not
  reached);
- NVIDIA H200, fp32 with torch's default float32 matmul precision "highest": 67 TFLOP/s (H200
  datasheet, FP32 without tensor cores); with precision "high"/"medium" (TF32): 494.5 TFLOP/s (the
  datasheet's 989 TF32 is with sparsity, halved for dense);
- any other device, CPU included: a large matmul in the bench's dtype (fp32 2048³ on the CPU, 8192³
  on CUDA), measured at bench start in the same process, best of 5. The log also records this
  measured figure on the H200, beside the constant.

Peak memory: on CUDA torch.cuda.max_memory_allocated (reset before each model is built); on the CPU
resource.getrusage(RUSAGE_SELF).ru_maxrss, the whole process's peak resident set (Python, torch and
the model together, and under `--baselines` the models benched before it). `mem_source` says which.
The kernel counters (counters.ALL) over the timed steps go in the `kernels` column
(`-` for a baseline) and the log; under `--compile` they are Python side
effects that dynamo replays, breaks on or recompiles for, so the log adds torch._dynamo's counters.
On a shared CPU the 1-minute load average at start and end is recorded (`loadavg`): a loaded
machine makes every CPU figure slower.
"""

import bisect
import collections
import datetime
import gc
import hashlib
import importlib.metadata
import itertools
import json
import math
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from dormouse import counters, ledger
from dormouse.config import Config, layer_mixers
from dormouse.errors import ConfigError
from dormouse.model import fla_kernels, precision

DEFAULT_STEPS = 20
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

# (substring of torch.cuda.get_device_name(), precision) -> (TFLOP/s, where the number comes from)
PEAKS = {
    ("H200", "bf16"): (680.0, "H200 bf16 dense matmul measured at 8192^3 on this workplace's card (issue text)"),
    ("H200", "fp32"): (67.0, "H200 datasheet FP32 (no tensor cores; float32 matmul precision highest)"),
    ("H200", "tf32"): (494.5, "H200 datasheet TF32 tensor core 989 with sparsity, halved for dense"),
}
CPU_PEAK_N, CUDA_PEAK_N, PEAK_REPS = 2048, 8192, 5


@dataclass
class FlopCount:
    per_step: float  # dense + mixer
    dense: float  # the 6·(weights × positions) terms
    mixer: float  # the 3·B·S·depth·block_layers·M term
    block_weights: float  # N_block (depth included)
    byte_weights: float  # N_byte (head and every nn.Linear outside the block)
    mixer_fwd_per_position: float
    outside: list[str] = field(default_factory=list)

    def describe(self) -> str:
        lines = [
            f"flops_per_step = {self.per_step:.6g} = matmul weights {self.dense:.6g} + mixer {self.mixer:.6g}",
            f"  matmul weights touched: N_block {self.block_weights:,.0f} per position (every layer application), "
            f"N_byte {self.byte_weights:,.0f} per byte position",
            "  mixer forward FLOPs per position per layer application (a hybrid: the mean): "
            f"{self.mixer_fwd_per_position:,.0f}",
        ]
        if self.outside:
            lines.append("  nn.Linear outside the looped block, once per byte position: " + ", ".join(self.outside))
        return "\n".join(lines)


def mixer_fwd_flops(mixer: str, n_heads: int, head_dim: int, chunk: int, positions: int) -> float:
    """M: a mixer's own forward FLOPs per position per layer application (module docstring); `chunk` is the
    KDA chunk length, `positions` the sequence length attention sees."""
    H, K = n_heads, head_dim
    if mixer == "kda":
        C, V = chunk, head_dim
        return H * (6 * K * V + 4 * C * K + 2 * C * V + C * (K + V))
    return H * K * 2 * (positions + 1)


def count_flops(model: nn.Module, cfg: Config) -> FlopCount:
    """FLOPs of one training step (forward + backward) by the formula in the module docstring."""
    m, t = cfg.model, cfg.train
    block, outside, outside_names = 0.0, 0.0, []
    for name, mod in model.named_modules():
        if not isinstance(mod, nn.Linear) or name == "lm_head":
            continue
        if name.startswith("layers."):
            routed = ".experts." in f".{name}." and not m.experts_dense  # dense: every expert sees every byte
            share = m.experts_top_k / m.n_experts if routed else 1.0
            block += mod.weight.numel() * share
        else:
            outside += mod.weight.numel()
            outside_names.append(name)
    fwd, bwd, first = loop_passes(cfg)
    block_weights = fwd * block
    byte_weights = 256 * m.d_model + outside
    S, T, B = t.seq_len + m.memory_slots, t.seq_len, t.batch_size
    per_layer = [mixer_fwd_flops(kind, m.n_heads, m.head_dim, m.kda_chunk_size, S) for kind in layer_mixers(m)]
    mixer = sum(per_layer) / len(per_layer)  # a hybrid's layers differ: their mean
    # A forward is 2 FLOPs per weight and position, its backward 4 (the input's and the weight's gradients).
    # The engram's linears run in the first iteration only: backward only when it records gradients.
    dense = B * S * block * (2 * fwd + 4 * bwd) + B * T * (6 * 256 * m.d_model + outside * (2 + 4 * first))
    mixer_total = B * S * (fwd + 2 * bwd) * sum(per_layer)
    return FlopCount(dense + mixer_total, dense, mixer_total, block_weights, byte_weights, mixer, outside_names)


def loop_passes(cfg: Config) -> tuple[float, float, float]:
    """Per step, on average over the depths `--rand-depth` samples (uniform over [rand_depth_min, depth];
    the config's depth without it): loop iterations run forward, iterations run backward (the last
    rand_depth_bptt when it is set), and the share of steps whose first iteration runs backward."""
    m, t = cfg.model, cfg.train
    depths = range(t.rand_depth_min, m.depth + 1) if t.rand_depth else [m.depth]
    backward = [min(d, t.rand_depth_bptt) if t.rand_depth_bptt else d for d in depths]
    n = len(depths)
    return sum(depths) / n, sum(backward) / n, sum(b == d for b, d in zip(backward, depths, strict=True)) / n


FLA_KDA_CHUNK = 64  # the chunk length of fla's chunk_kda as fla.layers.kda calls it (its default)


def count_baseline_flops(model: nn.Module, cfg: Config, name: str) -> FlopCount:
    """FLOPs of one training step of baseline `name` (module docstring): every layer has weights of its own,
    so N_block is every nn.Linear but the head, the mixer term counts block_layers · depth layers at S = T."""
    from dormouse.tools.baselines import n_layers

    m, t = cfg.model, cfg.train
    layers = sum(
        mod.weight.numel() for n, mod in model.named_modules() if isinstance(mod, nn.Linear) and n != "lm_head"
    )
    B, T = t.batch_size, t.seq_len
    mixer = mixer_fwd_flops("attention" if name == "gpt" else "kda", m.n_heads, m.head_dim, FLA_KDA_CHUNK, T)
    byte_weights = 256 * m.d_model
    dense = 6 * B * T * (layers + byte_weights)
    mixer_total = 3 * B * T * n_layers(m) * mixer
    return FlopCount(dense + mixer_total, dense, mixer_total, layers, byte_weights, mixer)


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


# ---- device facts ----------------------------------------------------------------------------------------------


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_matmul_tflops(device: torch.device, dtype: torch.dtype, n: int, reps: int = PEAK_REPS) -> float:
    """Best of `reps` timed n×n @ n×n matmuls (after two untimed), in TFLOP/s. No RNG: constant inputs."""
    a = torch.full((n, n), 0.5, device=device, dtype=dtype)
    b = torch.full((n, n), 0.25, device=device, dtype=dtype)
    for _ in range(2):
        a @ b
    best = math.inf
    for _ in range(reps):
        _sync(device)
        start = time.perf_counter()
        a @ b
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best / 1e12


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    model = platform.processor() or platform.machine() or "unknown"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        found = re.search(r"^model name\s*:\s*(.+)$", cpuinfo.read_text(errors="replace"), re.M)
        model = found.group(1).strip() if found else model
    return f"cpu ({model}, {torch.get_num_threads()} threads)"


def device_slug(device: torch.device) -> str:
    if device.type != "cuda":
        return "cpu"
    name = torch.cuda.get_device_name(device).lower().replace("nvidia", "")
    return re.sub(r"[^a-z0-9]+", "-", name).strip("-") or "cuda"


def peak_tflops(device: torch.device, dtype: str, measured: float) -> tuple[float, str]:
    """The peak MFU is taken against, and where it comes from (module docstring)."""
    if device.type == "cuda":
        tf32 = dtype == "tf32" or (dtype == "fp32" and torch.get_float32_matmul_precision() != "highest")
        wanted = "tf32" if tf32 else dtype
        name = torch.cuda.get_device_name(device)
        for (key, prec), (value, source) in PEAKS.items():
            if key in name and prec == wanted:
                return value, f"constant: {source}"
        n = CUDA_PEAK_N
    else:
        n = CPU_PEAK_N
    return measured, f"measured this run: {dtype} matmul {n}^3 best of {PEAK_REPS}"


def peak_memory(device: torch.device) -> tuple[float, str]:
    """(GiB, source)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30, "cuda max_memory_allocated"
    import resource

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return rss * (1 if sys.platform == "darwin" else 1024) / 2**30, "cpu ru_maxrss (whole process)"


def fla_version() -> str:
    for dist in ("fla-core", "flash-linear-attention"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "-"


def repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


def git_commit(root: Path) -> str:
    """`git rev-parse --short HEAD`, plus -dirty when the tree has uncommitted changes (untracked files too).

    DORMOUSE_COMMIT, when set, is taken as is: the device tool copies the working tree but not its git
    history, so there the checkout's HEAD is not the tree's (benches/gpu_session.sh sets it from the
    `.device-commit` file written beside the tree before the call)."""
    if os.environ.get("DORMOUSE_COMMIT"):
        return os.environ["DORMOUSE_COMMIT"]

    def git(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(root), *argv], capture_output=True, text=True, check=False)

    try:
        head = git("rev-parse", "--short", "HEAD")
    except FileNotFoundError:
        return "unknown(no git)"
    if head.returncode != 0:
        return "unknown(not a git checkout)"
    dirty = git("status", "--porcelain").stdout.strip()
    return head.stdout.strip() + ("-dirty" if dirty else "")


def code_fingerprint() -> str:
    """sha256 (12 hex) of the dormouse package's sources and committed kernel pin: what computes a run.

    Two runs with one fingerprint ran the same code whatever the commit says (a commit that only adds
    logs or docs keeps it; a pin entry merged from a device call changes it), so `dormouse ab` compares
    this, not the commit, before reusing or merging runs made in other device calls."""
    package = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(p for p in package.rglob("*") if p.suffix in (".py", ".json") and p.is_file()):
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


# ---- the bench -------------------------------------------------------------------------------------------------


def _given(args, dest: str):
    return getattr(args, dest, None)


def cli(args) -> int:
    """`dormouse bench`: see the module docstring and docs/glossary.md."""
    from dormouse.config import config_from_args
    from dormouse.tools.baselines import unavailable

    cfg = config_from_args(args)
    steps = _given(args, "train.steps") or DEFAULT_STEPS
    if cfg.train.minutes:
        raise ConfigError("--minutes has no meaning for bench: it times --steps steps after --warmup")
    if args.warmup < 1:
        raise ConfigError(f"--warmup {args.warmup}: at least 1 (the first step is the cold start, never timed)")
    root = repo_root()
    if args.history is None or args.log_dir is None:
        if not (root / "benches").is_dir():
            raise ConfigError(f"{root} is not a dormouse checkout (no benches/): pass --history and --log-dir")
    history = Path(args.history) if args.history else root / "benches" / "history.tsv"
    log_dir = Path(args.log_dir) if args.log_dir else root / "benches" / "logs"
    if args.profile < 0:
        raise ConfigError(f"--profile {args.profile}: a number of steps, 0 or more")
    if args.op == "kda":
        if args.compile or args.data or args.profile:
            raise ConfigError(
                "--op kda times the KDA op alone on synthetic inputs: --compile, --data and --profile do not apply"
            )
        if args.model != "dormouse" or args.baselines:
            raise ConfigError("--op kda times the KDA op alone: --model and --baselines do not apply")
        results = [bench_kda_op(cfg, steps=steps, warmup=args.warmup, note=args.note, log_dir=log_dir)]
    else:
        if args.model != "dormouse":
            if args.baselines:
                raise ConfigError(
                    f"--baselines runs every baseline after the dormouse row: drop --model {args.model}, "
                    "or drop --baselines to bench it alone"
                )
            if args.data:
                raise ConfigError(f"--model {args.model} trains on random bytes: --data feeds dormouse's trainer only")
            why = unavailable(args.model, cfg.train.device)
            if why:
                raise ConfigError(f"--model {args.model}: {why}")
        results = bench(
            cfg,
            steps=steps,
            warmup=args.warmup,
            compiled=args.compile,
            data=args.data,
            note=args.note,
            log_dir=log_dir,
            profiled=args.profile,
            model=args.model,
            baselines=args.baselines,
        )
    for row, log_path in results:  # each row is appended as soon as its model is done
        append_row(history, row)
        print(f"bench: appended a row ({row['model']}) to {history}; log {log_path}")
        for key in ("ms_per_step", "tokens_per_s", "peak_mem_gib", "mfu", "first_step_s", "kernels"):
            print(f"  {key} = {row[key]}")
    return 0


BASELINES = ("gpt", "fla-kda")


@dataclass
class Session:
    """What every row of one `dormouse bench` shares: the config, the device facts and the log's head."""

    cfg: Config
    device: torch.device
    commit: str
    head: list[str]  # the first lines of every log of this bench
    peak: float
    peak_source: str
    steps: int
    warmup: int
    compiled: bool
    profiled: int
    note: str
    log_dir: Path
    models_before: int = 0  # models this process benched already (their memory is in the CPU's ru_maxrss)


def bench(
    cfg: Config,
    *,
    steps: int,
    warmup: int,
    compiled: bool,
    data,
    note: str,
    profiled: int = 0,
    log_dir: Path,
    model: str = "dormouse",
    baselines: bool = False,
) -> Iterator[tuple[dict[str, str], Path]]:
    """Bench `model` (dormouse, gpt or fla-kda), then with `baselines` every baseline this device can run
    (the others are skipped with the reason printed); yield (the TSV row, the log path) of each model as
    soon as it is done, its log written."""
    from dormouse.tools.baselines import unavailable

    t = cfg.train
    device = torch.device(t.device)
    commit = git_commit(repo_root())
    head = [
        f"dormouse bench {datetime.datetime.now(datetime.UTC).isoformat(timespec='seconds')}",
        "command: " + shlex.join(["dormouse", *sys.argv[1:]]),
        f"commit: {commit}",
        f"device: {device_name(device)}; torch {torch.__version__}; fla {fla_version()}; python "
        f"{platform.python_version()}; float32 matmul precision {torch.get_float32_matmul_precision()}",
        f"loadavg at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
    ]
    head.append(precision.apply(t.dtype))  # before the peak matmul and any kernel compiles
    mm_dtype = torch.bfloat16 if t.dtype == "bf16" else torch.float32
    n = CUDA_PEAK_N if device.type == "cuda" else CPU_PEAK_N
    measured = measure_matmul_tflops(device, mm_dtype, n)
    peak, peak_source = peak_tflops(device, t.dtype, measured)
    head.append(f"matmul {t.dtype} {n}^3 measured this run, best of {PEAK_REPS}: {measured:.4g} TFLOP/s")
    head.append(f"peak used for MFU: {peak:.4g} TFLOP/s ({peak_source})")
    session = Session(cfg, device, commit, head, peak, peak_source, steps, warmup, compiled, profiled, note, log_dir)
    for name in (model, *(BASELINES if baselines else ())):
        why = "" if name == "dormouse" else unavailable(name, device)
        if why:
            print(f"bench: skipping baseline {name}: {why}")
            continue
        if device.type == "cuda":  # each model's peak memory is its own
            gc.collect()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        yield _bench_dormouse(session, data) if name == "dormouse" else _bench_baseline(session, name)
        session.models_before += 1


def _time_steps(step, first: int, n: int, phase: str, device: torch.device, log: list[str]) -> list[float]:
    """Run `step(s)` for s in first … first+n−1, each timed on its own (synchronised on CUDA); the log
    gets each step's time and returned cross-entropy."""
    times = []
    for s in range(first, first + n):
        _sync(device)
        t0 = time.perf_counter()
        ce = step(s)
        _sync(device)
        times.append(time.perf_counter() - t0)
        log.append(f"step {s} {phase} ms={times[-1] * 1000:.3f} ce={ce:.6f}")
    return times


def _row(session: Session, started, model: str, arms: str, timing: dict, mem: tuple, log_path: Path, **cols) -> dict:
    """A TSV row: the session's columns, this model's and `cols` (kernels, params, loadavg)."""
    t = session.cfg.train
    mem_gib, mem_source = mem
    if session.device.type != "cuda" and session.models_before:
        mem_source += f"; includes the {session.models_before} model(s) benched before it in this process"
    row = {
        "date": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": session.commit,
        "device": device_name(session.device),
        "model": model,
        "preset": session.cfg.preset,
        "batch": str(t.batch_size),
        "seq_len": str(t.seq_len),
        "dtype": t.dtype,
        "compiled": "yes" if session.compiled else "no",
        "arms": arms,
        "peak_mem_gib": f"{mem_gib:.4f}",
        "torch": torch.__version__,
        "fla": fla_version(),
        "log": _shown_path(log_path),
        "note": session.note,
        **timing,
        "peak_source": session.peak_source,
        "mem_source": mem_source,
        **NOT_TRAINED,
        **cols,
    }
    return {k: _cell(v) for k, v in row.items()}


def _write_log(log_path: Path, log: list[str], row: dict[str, str]) -> None:
    log += ["---- row", *(f"{k}\t{v}" for k, v in row.items())]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_text("\n".join(log) + "\n")


def _bench_dormouse(session: Session, data) -> tuple[dict[str, str], Path]:
    """Time the trainer's own step; write the log; return (the TSV row, the log path)."""
    from dormouse.runs import open_corpus
    from dormouse.train.trainer import Trainer

    cfg, device, warmup, steps, profiled = session.cfg, session.device, session.warmup, session.steps, session.profiled
    t = cfg.train
    started = datetime.datetime.now(datetime.UTC)
    load_start = os.getloadavg()[0]
    log = list(session.head)
    corpus, corpus_note = open_corpus(data)
    with tempfile.TemporaryDirectory(prefix="dormouse-bench-") as tmp:
        run = Path(tmp) / "run"
        trainer = Trainer(cfg, corpus, run, corpus_note=corpus_note)
        log.append("---- trainer header")
        log.extend((run / "train.log").read_text().splitlines())
        flops = count_flops(trainer.model, cfg)
        params = trainer.model.num_params()
        if session.compiled:  # the step calls the replica (the model itself, or its DDP wrapper)
            trainer.replica = torch.compile(trainer.replica)
            log.append(
                "torch.compile: on (the kernel counters are Python side effects: under dynamo they may be "
                "replayed, break the graph or force recompiles; see the step times and the dynamo stats below)"
            )
        log.append(f"---- {warmup} warm-up step(s), then {steps} timed step(s)")
        counters.reset_all()
        ledger.COUNTS.clear()
        times = _time_steps(trainer.train_step, 0, warmup, "warmup", device, log)
        counts = {"warmup": counters.line()}
        counters.reset_all()
        times += _time_steps(trainer.train_step, warmup, steps, "timed", device, log)
        counts["timed"] = counters.line()
        fla_kernels.count_unpinned()  # fla kernel choices the pin did not make join the fallbacks line
        fallbacks = ledger.counted_summary()
        dynamo = _dynamo_stats() if session.compiled else None
        if session.compiled and not _graphs_compiled():
            raise RuntimeError(f"--compile: dynamo compiled no graph of the step, it would time eager ({dynamo})")
        mem_gib, mem_source = peak_memory(device)
        profile = _profile_steps(trainer.train_step, warmup + steps, profiled, device) if profiled else None
        del trainer
    load_end = os.getloadavg()[0]

    timing = timing_columns(times, warmup, t.batch_size * t.seq_len, flops.per_step, session.peak)
    stamp = started.strftime("%Y-%m-%d-%H%M%S")
    log_path = _free_name(Path(session.log_dir), f"{stamp}-{cfg.preset}-{device_slug(device)}", ".log")
    row = _row(
        session,
        started,
        "dormouse",
        arms(cfg),
        timing,
        (mem_gib, mem_source),
        log_path,
        kernels=counts["timed"],
        params=str(params),
        loadavg=f"{load_start:.2f}/{load_end:.2f}",
    )
    log += [
        "---- counts",
        f"kernel counters, warm-up: {counts['warmup']}",
        f"kernel counters, timed steps: {counts['timed']}",
        f"fallbacks (COUNTED ledger sites, all steps): {fallbacks}",
        *([f"torch._dynamo counters: {dynamo}"] if dynamo is not None else []),
        *([f"---- torch.profiler over {profiled} more step(s), not timed", profile] if profile else []),
        *_memory_and_flops_lines(row, timing, flops, session.peak),
        "---- config",
        json.dumps(cfg.to_dict(), sort_keys=True),
    ]
    _write_log(log_path, log, row)
    return row, log_path


def _bench_baseline(session: Session, name: str) -> tuple[dict[str, str], Path]:
    """Time baseline `name`'s step (dormouse/tools/baselines.py) as the trainer's is timed; write the log;
    return (the TSV row, the log path)."""
    from dormouse.tools.baselines import ROW_NAMES, baseline_step, n_layers

    cfg, device, warmup, steps, profiled = session.cfg, session.device, session.warmup, session.steps, session.profiled
    m, t = cfg.model, cfg.train
    started = datetime.datetime.now(datetime.UTC)
    load_start = os.getloadavg()[0]
    model_name = ROW_NAMES[name]
    layers = f"L={n_layers(m)},d={m.d_model},H={m.n_heads},K={m.head_dim},ffn={m.ffn_hidden}"
    arms_cell = f"{model_name},{layers}" + (",short_conv" if name == "fla-kda" and m.short_conv else "")
    log = list(session.head)
    log.append(f"---- baseline {model_name} ({arms_cell}): dormouse/tools/baselines.py; random bytes, stream `bench`")
    if name == "fla-kda":
        log.append(fla_kernels.pin_note())
    model, step = baseline_step(name, cfg, device, compiled=session.compiled)
    flops = count_baseline_flops(model, cfg, name)
    params = sum(p.numel() for p in model.parameters())
    log.append(f"model: {params:,} parameters, {n_layers(m)} layers; compiled: {session.compiled}")
    log.append(f"---- {warmup} warm-up step(s), then {steps} timed step(s)")
    times = _time_steps(step, 0, warmup, "warmup", device, log)
    times += _time_steps(step, warmup, steps, "timed", device, log)
    mem_gib, mem_source = peak_memory(device)
    unpinned = fla_kernels.count_unpinned() if name == "fla-kda" else None
    dynamo = _dynamo_stats() if session.compiled else None
    profile = _profile_steps(step, warmup + steps, profiled, device) if profiled else None
    del model, step
    timing = timing_columns(times, warmup, t.batch_size * t.seq_len, flops.per_step, session.peak)
    stamp = started.strftime("%Y-%m-%d-%H%M%S")
    log_path = _free_name(Path(session.log_dir), f"{stamp}-{cfg.preset}-{model_name}-{device_slug(device)}", ".log")
    row = _row(
        session,
        started,
        model_name,
        arms_cell,
        timing,
        (mem_gib, mem_source),
        log_path,
        kernels="-",
        params=str(params),
        loadavg=f"{load_start:.2f}/{os.getloadavg()[0]:.2f}",
    )
    log += [
        "---- counts",
        *([f"fla kernel choices not from the pin (new in this process): {unpinned}"] if unpinned is not None else []),
        *([f"torch._dynamo counters: {dynamo}"] if dynamo is not None else []),
        *([f"---- torch.profiler over {profiled} more step(s), not timed", profile] if profile else []),
        *_memory_and_flops_lines(row, timing, flops, session.peak),
        "---- config (a baseline takes d_model, n_heads, head_dim, block_layers, depth, ffn_hidden, norm_eps, "
        "short_conv, conv_size, seed, batch_size, seq_len, lr, weight_decay, grad_clip, dtype and device)",
        json.dumps(cfg.to_dict(), sort_keys=True),
    ]
    _write_log(log_path, log, row)
    return row, log_path


def bench_kda_op(cfg: Config, *, steps: int, warmup: int, note: str, log_dir: Path) -> tuple[dict[str, str], Path]:
    """Time one forward+backward of the KDA op alone at B=batch_size, T=seq_len, H=n_heads, K=V=head_dim of
    `cfg`, with its resolved kda_backend and dtype; the row's model is `kda-op`. FLOPs: 3·B·T·M with M
    the mixer's forward FLOPs per position (module docstring), MFU against the same peak."""
    from dormouse.tools.kda_op import op_step

    m, t = cfg.model, cfg.train
    if m.mixer != "kda":
        raise ConfigError("--op kda times the KDA mixer: drop --no-kda / --mixer attention")
    device = torch.device(t.device)
    started = datetime.datetime.now(datetime.UTC)
    load_start = os.getloadavg()[0]
    shape = (t.batch_size, t.seq_len, m.n_heads, m.head_dim)
    dtype = torch.bfloat16 if t.dtype == "bf16" else torch.float32
    precision_note = precision.apply(t.dtype)
    measured = measure_matmul_tflops(device, dtype, CUDA_PEAK_N if device.type == "cuda" else CPU_PEAK_N)
    peak, peak_source = peak_tflops(device, t.dtype, measured)
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    step = op_step(shape, dtype, device, m.kda_backend, m.kda_chunk_size)
    counters.KDA.reset()
    times = []
    for _ in range(warmup + steps):
        _sync(device)
        t0 = time.perf_counter()
        step()
        _sync(device)
        times.append(time.perf_counter() - t0)
    C, (B, T, H, K) = m.kda_chunk_size, shape
    flops = 3 * B * T * mixer_fwd_flops("kda", H, K, C, T)
    mem_gib, mem_source = peak_memory(device)
    commit = git_commit(repo_root())
    log_path = _free_name(Path(log_dir), f"{started.strftime('%Y-%m-%d-%H%M%S')}-kda-op-{device_slug(device)}", ".log")
    row = {
        "date": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": commit,
        "device": device_name(device),
        "model": "kda-op",
        "preset": cfg.preset,
        "batch": str(B),
        "seq_len": str(T),
        "dtype": t.dtype,
        "compiled": "no",
        "arms": f"kda({m.kda_backend}),H={H},K={K},C={C}",
        "peak_mem_gib": f"{mem_gib:.4f}",
        "torch": torch.__version__,
        "fla": fla_version(),
        "log": _shown_path(log_path),
        "note": note,
        **timing_columns(times, warmup, B * T, flops, peak),
        "peak_source": peak_source,
        "mem_source": mem_source,
        "kernels": f"kda={counters.KDA}",
        "params": "0",
        "loadavg": f"{load_start:.2f}/{os.getloadavg()[0]:.2f}",
        **NOT_TRAINED,
    }
    row = {k: _cell(v) for k, v in row.items()}
    log = [
        f"dormouse bench --op kda {started.isoformat(timespec='seconds')}",
        "command: " + shlex.join(["dormouse", *sys.argv[1:]]),
        f"commit: {commit}",
        f"device: {device_name(device)}; torch {torch.__version__}; fla {fla_version()}; {precision_note}",
        *([fla_kernels.pin_note()] if m.kda_backend == "fla" else []),
        f"op: kda forward+backward, backend {m.kda_backend}, B,T,H,K={shape}, {t.dtype}, chunk {C}",
        *(f"call {i} {'warmup' if i < warmup else 'timed'} ms={x * 1000:.3f}" for i, x in enumerate(times)),
        f"kernel choices not from the pin: {fla_kernels.count_unpinned() if m.kda_backend == 'fla' else '-'}",
        f"peak used for MFU: {peak:.4g} TFLOP/s ({peak_source}); matmul measured {measured:.4g} TFLOP/s",
        "---- row",
        *(f"{k}\t{v}" for k, v in row.items()),
    ]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_text("\n".join(log) + "\n")
    return row, log_path


PROFILE_ROWS = 40


def _profile_steps(step, first_step: int, n: int, device: torch.device) -> str:
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
        _sync(device)
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


def _dynamo_stats() -> str:
    """torch._dynamo's own counters (graphs, graph breaks, recompiles) as one line."""
    import torch._dynamo.utils

    counts = getattr(torch._dynamo.utils, "counters", {})
    return json.dumps({k: dict(v) for k, v in counts.items() if k in ("stats", "graph_break", "recompiles")})


def _memory_and_flops_lines(row: dict, timing: dict, flops, peak: float) -> list[str]:
    """The log's peak memory, load and FLOPs lines, the same for dormouse and the baselines."""
    return [
        f"peak memory: {row['peak_mem_gib']} GiB ({row['mem_source']})",
        f"loadavg at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
        "---- FLOPs (formula: dormouse/tools/bench.py docstring, docs/glossary.md)",
        flops.describe(),
        f"achieved {timing['achieved_tflops']} TFLOP/s at the median step; MFU {timing['mfu']} of {peak:.4g} TFLOP/s",
    ]


def _graphs_compiled() -> int:
    import torch._dynamo.utils

    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def _cell(value: str) -> str:
    """A TSV cell: tabs and newlines become spaces; an empty cell is '-'."""
    text = re.sub(r"[\t\r\n]+", " ", str(value)).strip()
    return text or "-"


def _shown_path(path: Path) -> str:
    """The log path relative to the repository when it is inside it (as committed), else absolute."""
    path = path.resolve()
    try:
        return str(path.relative_to(repo_root()))
    except ValueError:
        return str(path)


def _free_name(folder: Path, stem: str, suffix: str) -> Path:
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
