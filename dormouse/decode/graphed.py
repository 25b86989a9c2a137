"""Decoding from one CUDA graph (`dormouse generate --cuda-graph`): `model.step` captured once, replayed
per byte.

A decode step of `small` on the H200 took 26 ms per byte, as on a 2-core CPU: about 1,030 small torch ops
per byte, each launched from Python (docs/known-issues.md). Replaying them from a graph launches once.
`model.step` is a pure function of (byte, cache) to (logits, cache); the graph reads the byte and every
tensor of the cache from static buffers and, after the logits, copies the new cache's tensors into the
same buffers, so each replay advances the state in place. That needs a state whose tensors keep their
shapes from byte to byte: attention's KV cache grows (refused), and so do data-dependent paths: the
sparse experts' dispatch and MoR's routing (refused), CALM-lite's early exit (refused). The first byte
runs eagerly (a one-byte prompt starts from an empty state whose tensors do not exist yet); the graph is
captured from the state after it. Sampling stays outside the graph, from the same (seed, position)
streams, so the bytes are plain decoding's (tests/gpu/test_graphed_decode.py compares them bit for bit).
"""

import dataclasses
from collections.abc import Iterator

import torch

from dormouse.config import data_shaped_arms, layer_mixers
from dormouse.decode.decoder import Decoder
from dormouse.errors import DormouseError


def cache_tensors(obj) -> list[torch.Tensor]:
    """Every tensor inside a decode cache (dataclasses, lists, tuples, dicts by key), in a fixed order."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if dataclasses.is_dataclass(obj):
        return [t for f in dataclasses.fields(obj) for t in cache_tensors(getattr(obj, f.name))]
    if isinstance(obj, list | tuple):
        return [t for x in obj for t in cache_tensors(x)]
    if isinstance(obj, dict):
        return [t for k in sorted(obj) for t in cache_tensors(obj[k])]
    return []


def with_tensors(obj, tensors: Iterator[torch.Tensor]):
    """`obj` with its tensors (in `cache_tensors` order) taken from `tensors`; everything else kept."""
    if isinstance(obj, torch.Tensor):
        return next(tensors)
    if dataclasses.is_dataclass(obj):
        return dataclasses.replace(
            obj, **{f.name: with_tensors(getattr(obj, f.name), tensors) for f in dataclasses.fields(obj)}
        )
    if isinstance(obj, list | tuple):
        return type(obj)(with_tensors(x, tensors) for x in obj)
    if isinstance(obj, dict):
        return {k: with_tensors(obj[k], tensors) for k in sorted(obj)}
    return obj


def check_capturable(model, exit_threshold: float) -> None:
    """Refuse what a captured decode step cannot hold, naming it."""
    m = model.cfg
    reasons = []
    if "attention" in layer_mixers(m):
        reasons.append("attention layers (their KV cache grows by a position per byte)")
    reasons += data_shaped_arms(m).values()
    if exit_threshold < 1:
        reasons.append("--exit-threshold (CALM-lite exits on the logits' values)")
    if reasons:
        raise DormouseError("--cuda-graph decoding cannot capture " + "; ".join(reasons))


def check_device(device: torch.device) -> None:
    if device.type != "cuda":
        raise DormouseError(f"--cuda-graph decodes on CUDA; this model is on {device}")


def capture(run):
    """(graph, the outputs of `run(True)` as captured): `run(False)` twice on a side stream first (its
    kernels chosen and compiled before the capture; False: the state is not written back). A capture
    executes nothing: each `graph.replay()` runs the step and writes the same output tensors."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            run(False)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = run(True)
    return graph, outputs


class GraphedDecoder(Decoder):
    """A Decoder whose steps after the first replay one CUDA graph of `model.step`."""

    def __init__(self, model, prompt: bytes, **options):
        super().__init__(model, prompt, **options)
        check_device(self.last.device)
        check_capturable(model, self.exit["exit_threshold"])
        self.graph, self.stepped = None, False

    def _step(self):
        if not self.stepped:  # the first byte eagerly: after it, every tensor of the state exists
            self.stepped = True
            return super()._step()
        if self.graph is None:
            self._capture()
        self.byte.copy_(self.last)
        self.graph.replay()
        # The returned cache holds the buffers, which the next replay overwrites: a decode keeps only its last.
        position, iterations = self.cache.position + 1, self.captured.iterations
        return self.logits, dataclasses.replace(self.state, position=position, iterations=iterations)

    def _capture(self) -> None:
        """Static buffers from the current byte and cache, then the capture of one step and of the state's
        copy-back into the buffers (refused if the state's tensors change shape)."""
        self.byte = self.last.clone()
        self.buffers = [t.clone() for t in cache_tensors(self.cache)]
        self.state = with_tensors(self.cache, iter(self.buffers))

        def run(write_back: bool):
            logits, after = self.model.step(self.byte, self.state, **self.exit)
            new = cache_tensors(after)
            same = [(t.shape, t.dtype) for t in new] == [(t.shape, t.dtype) for t in self.buffers]
            if write_back and same:  # no raise inside a capture: checked after it
                # A value that is (a view of) a buffer, passed through, is copied first: the copies
                # below overwrite the buffers one by one.
                held = {b.untyped_storage().data_ptr() for b in self.buffers}
                new = [v.clone() if v.untyped_storage().data_ptr() in held else v for v in new]
                for buffer, value in zip(self.buffers, new, strict=True):
                    buffer.copy_(value)
            return logits, after, same

        self.graph, (self.logits, self.captured, same) = capture(run)
        if not same:
            raise DormouseError("--cuda-graph: the decode state changes its tensors' shapes from byte to byte")
