"""`--cuda-graph`: the training step's forward and backward captured once as a CUDA graph and replayed.

Why: on the H200 the `small` step is bound by the host, not the GPU (docs/performance.md: ~20 ms of GPU
work under ~120 ms of Python, fla's wrappers and ~900 launches). A replay launches the whole forward
and backward at once.

What is captured: the replica's forward and backward at the run's fixed (batch, seq_len), under the
run's autocast, writing every dense parameter's gradient into the graph's own memory: one graph per
loop depth, each captured the first time a step runs at its depth (`--rand-depth` draws the depth per
step; a fixed depth has one graph). The first graph's gradient buffers are the ones the update reads
(its own graph captured their addresses): a step replayed from another depth's graph copies its
gradients into them.
What stays eager, around each replay:
- copying the batch (and JEPA's span starts) into the graph's static inputs;
- dropout's seed: the captured masks come from one CUDA generator registered with the graph
  (`CUDAGraph.register_generator_state`), reseeded before each replay with the step's dropout seed
  (model/dropout.py's `step_seed`); a replay reads the seed and an offset of 0, as a fresh generator
  seeded so would, so the masks are the eager step's bit for bit;
- each engram table's row lookup (no host sync: `table_rows`; hashed while the GPU runs the step
  before: `prefetch`): the captured forward reads the looked-up rows from a static leaf tensor instead
  of the table (`Engram.captured_rows`), and after the replay the table's sparse gradient is built from
  that leaf's gradient as `nn.Embedding(sparse=True)`'s backward builds it (one gradient row per
  lookup), coalesced by a plan made with the hash (sparse.py's RowPlan: no host sync); the tables'
  row-wise optimizer needs data-dependent sizes, which a graph cannot hold;
- the update: the clip's dense part and NesterovSinkhorn's step are a second graph of their own
  (train/graphed_update.py); the engram tables' clip, AdamW and SparseRowAdam stay eager.
Python side effects of the forward (the kernel-path counters, the fallback ledger's counts) run once,
at capture; each replay adds what the captured step counted, so the eval line counts every step.

A path a graph cannot hold is refused by config validation (config.py's `_check_cuda_graph` and
`resolve`), never replaced.
The warm-up before the capture runs the forward and backward three times on the first batch (fla
autotunes and compiles there, not inside the capture) and leaves no trace: gradients and counters are
reset to what they were.
"""

import torch
from torch.profiler import record_function

from dormouse import counters, ledger
from dormouse.model.engram import global_rows
from dormouse.model.model import DormouseLM, Output
from dormouse.train.sparse import RowPlan

WARMUP_RUNS = 3  # PyTorch's recipe for whole-network capture warms up on a side stream this many times


class CountSnapshot:
    """The kernel-path counters and ledger counts at one moment; `since` gives what happened after it."""

    def __init__(self):
        self.counts = counters.snapshot()
        self.ledger = dict(ledger.COUNTS)

    def restore(self) -> None:
        counters.restore(self.counts)
        ledger.COUNTS.clear()
        ledger.COUNTS.update(self.ledger)

    def since(self) -> "CountDelta":
        now = CountSnapshot()
        delta = {
            name: tuple(b - a for a, b in zip(self.counts[name], now.counts[name], strict=True)) for name in now.counts
        }
        return CountDelta(delta, {k: v - self.ledger.get(k, 0) for k, v in now.ledger.items()})


class CountDelta:
    """What one captured step counted; `replay` adds it once more."""

    def __init__(self, counts: dict[str, tuple[int, int]], ledger_counts: dict[str, int]):
        self.counts, self.ledger = counts, {k: v for k, v in ledger_counts.items() if v}

    def replay(self) -> None:
        counters.add(self.counts)
        for name, n in self.ledger.items():
            ledger.COUNTS[name] += n


def table_rows(model: DormouseLM, x: torch.Tensor) -> dict[int, torch.Tensor]:
    """Each memory's table rows for the bytes x ({insertion layer: [B, T, arms]}). x is the trainer's
    batch, bytes by construction (the sampler's uint8 windows): the keys skip the range check, whose host
    sync before each replay would make the host wait for the previous update to finish before it could
    queue the step (3-4 ms of idle device a step at B 64)."""
    return {j: global_rows(m.keys(x, bytes_checked=True), m.rows) for j, m in model.memories()}


def look_up_rows_(
    model: DormouseLM, x: torch.Tensor, rows: dict[int, torch.Tensor], looked_up: dict[int, torch.Tensor] | None = None
) -> dict[int, torch.Tensor]:
    """Each memory's table rows for the bytes x, copied into `rows` ({insertion layer: [B, T, arms, dim]},
    what `Engram.captured_rows` hands the forward); returns the row indices ({layer: [B, T, arms]}):
    `looked_up` when given (`table_rows(model, x)`, hashed ahead: GraphedStep.prefetch), else hashed here."""
    with torch.no_grad():
        looked_up = table_rows(model, x) if looked_up is None else looked_up
        for j, m in model.memories():
            # gathered straight into the static rows: nn.Embedding's gather, without its tensor and a copy
            idx = looked_up[j].reshape(-1)
            torch.index_select(m.table.weight, 0, idx, out=rows[j].detach().view(idx.shape[0], m.dim))
    return looked_up


def row_plans(looked_up: dict[int, torch.Tensor]) -> dict[int, RowPlan]:
    """How to coalesce each table's gradient of the lookups `looked_up` ({insertion layer: [B, T, arms]})."""
    return {j: RowPlan(rows) for j, rows in looked_up.items()}


def set_table_grads_(model: DormouseLM, rows: dict[int, torch.Tensor], plans: dict[int, RowPlan]) -> None:
    """Each table's gradient from its looked-up rows' gradient: nn.Embedding(sparse=True)'s (one gradient
    row per lookup) coalesced by the lookups' plan (`row_plans`), with no host sync when it was made ahead."""
    for j, m in model.memories():
        m.table.weight.grad = plans[j].coalesce(rows[j].grad.reshape(-1, m.dim), m.table.weight.shape[0])


class _Capture:
    """One loop depth's captured step: its graph, the Output the graph refills, what it counted, and the
    gradient buffers it writes (dense parameters', and each memory's looked-up rows')."""

    def __init__(self, graph, out: Output, counts: CountDelta, grads: dict, row_grads: dict):
        self.graph, self.out, self.counts, self.grads, self.row_grads = graph, out, counts, grads, row_grads


class GraphedStep:
    """Forward + backward of one training step, captured per loop depth at its first call and replayed after.

    `forward(x, y, jepa_starts, dropout_gen, depth)` runs the replica and returns its Output (called at
    warm-up and capture only); `dropout_gen` is the registered generator, or None when the step draws no
    masks (dropout and drop_path off). A call (with the step's dropout seed when masks are drawn, and its
    depth) returns that depth's captured Output, whose loss, ce and aux tensors the replay has refilled,
    with every parameter's `.grad` set: dense ones to the first graph's gradient buffers, each engram
    table's to its sparse gradient of this batch.
    """

    def __init__(self, model: DormouseLM, forward, device: torch.device, dropout: bool = False):
        if device.type != "cuda":
            raise ValueError(f"a CUDA graph needs a CUDA device, got {device}")
        self.model, self.forward, self.device = model, forward, device
        self.dropout_gen = torch.Generator(device=device) if dropout else None
        self.captures: dict[int, _Capture] = {}  # loop depth -> its graph
        self.static: dict[str, torch.Tensor | None] = {}
        self.rows: dict[int, torch.Tensor] = {}  # insertion layer -> [B, T, arms, dim] leaf the graphs read
        self.grads: dict[torch.nn.Parameter, torch.Tensor] = {}  # the first graph's: what the update reads
        self.replays = 0
        self.next_rows: tuple | None = None  # (a later batch, its table rows, their RowPlans): prefetch
        self.staged: tuple | None = None  # (the next batch, its RowPlans), its inputs filled: stage

    def __call__(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        jepa_starts: torch.Tensor | None,
        dropout_seed: int | None = None,
        *,
        depth: int,
    ) -> Output:
        if (dropout_seed is None) != (self.dropout_gen is None):
            raise ValueError(f"dropout is {'on' if self.dropout_gen else 'off'} in this graph; got seed {dropout_seed}")
        if not self.static:
            self._make_static(x, y, jepa_starts)
        with record_function("dormouse.look_up"):
            staged, self.staged = self.staged, None
            plans = staged[1] if staged is not None and staged[0] is x else self._fill(x, y, jepa_starts)
        if depth not in self.captures:  # the capture leaves this batch's inputs in place: replayed as they are
            self.captures[depth] = self._capture(depth)
            self.grads = self.grads or self.captures[depth].grads
        c = self.captures[depth]
        if self.dropout_gen is not None:  # the replay reads this seed, at offset 0
            self.dropout_gen.manual_seed(dropout_seed)
        with record_function("dormouse.replay"):
            c.graph.replay()
        self.replays += 1
        c.counts.replay()
        if c.grads is not self.grads:  # another depth's graph: its gradients into the buffers the update reads
            torch._foreach_copy_(list(self.grads.values()), [c.grads[p] for p in self.grads])
        for p, g in self.grads.items():  # the optimizers' zero_grad(set_to_none) dropped the references
            p.grad = g
        for j, rows in self.rows.items():
            rows.grad = c.row_grads[j]
        set_table_grads_(self.model, self.rows, plans)
        return c.out

    def stage(self, x: torch.Tensor, y: torch.Tensor, jepa_starts: torch.Tensor | None) -> None:
        """Fill the next step's inputs and look up its rows now, queued behind this step's update (the
        look-up reads the updated tables) and before the host waits for this step's check: the GPU then
        goes from the update to those copies and gathers without waiting for the host to launch them
        (~0.4 ms of idle device a step at B 64 on an H200). A call with another batch than
        the staged one fills its own."""
        if self.static:
            self.staged = (x, self._fill(x, y, jepa_starts))

    def prefetch(self, x: torch.Tensor) -> None:
        """Hash a later step's batch x into its table rows now, while the GPU runs this step (the keys read
        the bytes only), and plan their gradients' coalescing: that step's look-up then only gathers the
        rows (the hash is ~10 small kernels launched one by one: ~0.2 ms of idle device a step at B 64 on
        the H200), and its update coalesces without waiting for the GPU (sparse.py's RowPlan)."""
        looked_up = table_rows(self.model, x)
        self.next_rows = (x, looked_up, row_plans(looked_up))

    def _make_static(self, x, y, jepa_starts) -> None:
        """The graphs' inputs, shaped by the first batch: the batch, JEPA's starts, each memory's rows."""
        starts = None if jepa_starts is None else jepa_starts.clone()
        self.static = {"x": x.clone(), "y": y.clone(), "jepa_starts": starts}
        for j, m in self.model.memories():
            if not m.table.sparse:
                raise ValueError("a captured step builds the engram tables' sparse gradients; this table is dense")
            shape = (*x.shape, m.arms, m.dim)
            self.rows[j] = torch.zeros(shape, device=self.device, dtype=m.table.weight.dtype, requires_grad=True)

    def _fill(self, x, y, jepa_starts) -> dict[int, RowPlan]:
        """Copy this step's inputs into the static tensors and look up its engram rows into theirs;
        returns the plans of the rows each memory looked up (made ahead by `prefetch`, else now)."""
        if x.shape != self.static["x"].shape:
            raise ValueError(
                f"a captured step takes batches of shape {tuple(self.static['x'].shape)}, got {tuple(x.shape)}"
            )
        self.static["x"].copy_(x)
        self.static["y"].copy_(y)
        if jepa_starts is not None:
            self.static["jepa_starts"].copy_(jepa_starts)
        if self.next_rows is not None and self.next_rows[0] is x:
            _, ahead, plans = self.next_rows
            look_up_rows_(self.model, x, self.rows, ahead)
            return plans
        return row_plans(look_up_rows_(self.model, x, self.rows))

    def _capture(self, depth: int) -> _Capture:
        """Warm up and capture the step at `depth` on the batch in the static inputs."""
        before = CountSnapshot()
        params = list(self.model.parameters())
        self._set_rows(True)
        try:
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for _ in range(WARMUP_RUNS):
                    self._clear_grads(params)
                    self._forward_backward(depth)
            torch.cuda.current_stream(self.device).wait_stream(side)
            self._clear_grads(params)
            before.restore()
            graph = torch.cuda.CUDAGraph()
            if self.dropout_gen is not None:
                graph.register_generator_state(self.dropout_gen)
            with torch.cuda.graph(graph):
                out = self._forward_backward(depth)
            counts = before.since()
            before.restore()
        finally:
            self._set_rows(False)
        grads = {p: p.grad for p in params if p.grad is not None}
        if self.grads and grads.keys() != self.grads.keys():
            raise ValueError(f"the step at depth {depth} gives gradients to other parameters than the first graph's")
        return _Capture(graph, out, counts, grads, {j: rows.grad for j, rows in self.rows.items()})

    def _forward_backward(self, depth: int) -> Output:
        s = self.static
        out = self.forward(s["x"], s["y"], s["jepa_starts"], self.dropout_gen, depth)
        out.loss.backward()
        return out

    def _set_rows(self, on: bool) -> None:
        for j, m in self.model.memories():
            m.captured_rows = self.rows[j] if on else None

    def _clear_grads(self, params) -> None:
        for p in params:
            p.grad = None
        for rows in self.rows.values():
            rows.grad = None
